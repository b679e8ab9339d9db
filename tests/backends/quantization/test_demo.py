"""The demo's int8 fallback from nothing, quantized, served and measured for real: `cascade quantize --demo` into an
empty cascade home builds the demo models, quantizes the MoE flagship with llmcompressor (W8A8: SmoothQuant + GPTQ,
calibrated on demo chats) and `--evaluate`s it, serving the original and the quantized checkpoint with real vLLM
engines. The figures are what a policy's `max_quant_loss` is judged on: the shipped `policies/demo-ladder.yaml`
validates against the checkpoint, a copy whose ceiling is tighter than what was measured is refused (so the check
really judged it), and a second run keeps the whole checkpoint instead of building or measuring it again.

One sequence for what were two tests (this one and `test_engine.py`'s quantize-serve-evaluate of the micro model,
each two engine starts): the calibration file path `test_engine.py` took is in `test_repeatable.py`.

Slow (marked `engines`): a quantization and two engine starts, about 1.5 minutes alone on 2 cores (3.5-4 beside the
suite's other tests) once the quantization venv exists (a tool, not part of the build: the repo's own, created on
first use, is linked into the empty home). It shares no engine with the other engine tests, so under pytest-xdist it
runs beside them (an xdist group of its own, as the chaos run), its two engines' workers bound to the host's last
core, off the first cores vLLM binds every other engine's worker to (`tests/conftest.py`; the CPU-pinning tests wait
for them to end).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest

from backends.machine_checks import checked_here, quant_lines
from backends.quantization.eval import EVAL_PROMPTS, JSON_PROMPTS
from backends.quantization.metadata import METADATA_NAME, checkpoint_problem, read_figures, read_metadata
from backends.quantization.venv import ensure_quant_venv, quant_venv_dir
from gateway.cli.main import main
from policies.loader import PolicyError, parse_policy
from tests.backends.quantization.policy_text import with_checkpoint_pool

pytestmark = [pytest.mark.engines, pytest.mark.xdist_group("int8-demo")]

ROOT = Path(__file__).resolve().parents[3]
LADDER = ROOT / "policies" / "demo-ladder.yaml"
SAMPLES = "8"
"""Calibration samples: the fewest a calibration file may hold (`load_samples`' minimum), with which the shipped
ladder's ceilings still hold (measured: KL 0.000326 against 0.0006, agreement 93.0% against at least 88%, JSON
valid 83% against 65%); the default, 128, took longer for the same claim."""


def _cascade(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             *args: str) -> tuple[int, str, str]:
    """`cascade ARGS` in this process (its lines are measured for coverage; a CLI process of its own cost 2-3 s of
    CPU to import), with `home` as its cascade home: its exit code, stdout and stderr."""
    with monkeypatch.context() as patched:
        patched.setenv("CASCADE_HOME", str(home))
        code = main(list(args))
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def _quantize_demo(home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """`cascade quantize --demo` into `home`; its output."""
    code, out, err = _cascade(home, monkeypatch, capsys, "quantize", "--demo", "--samples", SAMPLES)
    assert code == 0, out[-2000:] + err[-3000:]
    return out


def test_demo_int8_fallback_from_nothing_is_measured_and_validates_the_shipped_ladder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # the evaluation's engines on the last core (`_eval_engine_env` takes one core named here), off the engine tests'
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(max(os.sched_getaffinity(0))))
    ensure_quant_venv()
    home = tmp_path / "home"
    home.mkdir()
    quant_venv_dir(home).symlink_to(quant_venv_dir())

    built = _quantize_demo(home, monkeypatch, capsys)
    assert "building the demo's calibrated int8 fallback" in built
    target = home / "models" / "flagship-w8a8"
    assert checkpoint_problem(target) is None
    config = json.loads((target / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "int-quantized"
    figures, meta = read_figures(target), read_metadata(target)
    assert figures is not None and meta is not None and figures.prompts == len(EVAL_PROMPTS)
    assert figures.summary() in built
    assert json.loads((target / METADATA_NAME).read_text())["calibration"]["samples"] == int(SAMPLES)
    ev = meta["evaluation"]
    assert figures.positions == ev["positions"] == len(EVAL_PROMPTS) * int(ev["new_tokens"])
    assert figures.sequence_agreement is not None
    assert 0.5 <= ev["greedy_agreement"] <= 1.0  # int8 with SmoothQuant + GPTQ keeps most greedy tokens
    assert 0.0 < ev["kl_mean"] < 1.0 and math.isfinite(ev["kl_max"])  # changed, but not much
    assert ev["exact_kl"] is True  # the demo vocabulary is small enough for full distributions
    for share in ("json_valid", "json_valid_original"):
        assert ev[share] * len(JSON_PROMPTS) == pytest.approx(round(ev[share] * len(JSON_PROMPTS)))
    assert ev["tokens_per_s"] > 0 and ev["tokens_per_s_original"] > 0

    code, out, err = _cascade(home, monkeypatch, capsys, "policy", "validate", str(LADDER))
    assert code == 0, f"measured {figures.summary()}\n{out}{err}"

    text = LADDER.read_text()
    tight = re.sub(r"max_kl: [0-9.e+-]+", f"max_kl: {figures.kl_mean / 2:.3g}", text, count=1)
    assert tight != text
    (tmp_path / "tight.yaml").write_text(tight)
    code, out, err = _cascade(home, monkeypatch, capsys, "policy", "validate", str(tmp_path / "tight.yaml"))
    assert code != 0 and "is tighter than the measured KL" in out + err

    # the same judgement in process, on the checkpoint's path: refused as a fallback, and listed when it holds
    tighter = ev["kl_mean"] / 2
    with pytest.raises(PolicyError) as strict:
        checked_here(parse_policy(with_checkpoint_pool(target, f"{{max_kl: {tighter}}}"), "strict.yaml"))
    assert f"max_kl {tighter:g} is tighter than the measured KL" in str(strict.value)
    assert "may not serve as a fallback" in str(strict.value)
    relaxed = with_checkpoint_pool(target, f"{{max_kl: {ev['kl_mean'] * 2}}}")
    loaded = checked_here(parse_policy(relaxed, "relaxed.yaml"))
    assert "flagship-int8: W8A8: next-token agreement" in quant_lines(loaded.policy)[1]

    again = _quantize_demo(home, monkeypatch, capsys)
    assert "building" not in again and "measuring" not in again
    assert read_figures(target) == figures
