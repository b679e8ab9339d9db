"""The demo's int8 fallback from nothing: `cascade quantize --demo` into an empty cascade home builds the demo
models, quantizes the flagship with llmcompressor and measures it with real vLLM engines; the shipped
`policies/demo-ladder.yaml` then validates with `cascade policy validate` against that checkpoint, a copy whose
ceiling is tighter than what was measured is refused (so the check really judged it), and a second run keeps
the whole checkpoint instead of building or measuring it again.

Slow (marked `engines`): quantization and two engine starts, about 6 minutes on 2 cores. The quantization venv
is a tool, not part of the build: the repo's own (created on first use) is linked into the empty home.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backends.quantization.eval import EVAL_PROMPTS
from backends.quantization.metadata import checkpoint_problem, read_figures, read_metadata
from backends.quantization.venv import ensure_quant_venv, quant_venv_dir

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[3]
CASCADE = Path(sys.executable).with_name("cascade")
LADDER = ROOT / "policies" / "demo-ladder.yaml"


def _cascade(home: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CASCADE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([str(CASCADE), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_demo_int8_fallback_from_nothing_validates_the_shipped_ladder(tmp_path: Path) -> None:
    ensure_quant_venv()
    home = tmp_path / "home"
    home.mkdir()
    quant_venv_dir(home).symlink_to(quant_venv_dir())

    built = _cascade(home, "quantize", "--demo")
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    assert "building the demo's calibrated int8 fallback" in built.stdout
    target = home / "models" / "flagship-w8a8"
    assert checkpoint_problem(target) is None
    figures, meta = read_figures(target), read_metadata(target)
    assert figures is not None and meta is not None and figures.prompts == len(EVAL_PROMPTS)
    assert figures.positions == len(EVAL_PROMPTS) * int(meta["evaluation"]["new_tokens"])
    assert figures.sequence_agreement is not None

    valid = _cascade(home, "policy", "validate", str(LADDER), timeout=300)
    assert valid.returncode == 0, f"measured {figures.summary()}\n{valid.stdout}{valid.stderr}"

    text = LADDER.read_text()
    tight = re.sub(r"max_kl: [0-9.e+-]+", f"max_kl: {figures.kl_mean / 2:.3g}", text, count=1)
    assert tight != text
    (tmp_path / "tight.yaml").write_text(tight)
    refused = _cascade(home, "policy", "validate", str(tmp_path / "tight.yaml"), timeout=300)
    assert refused.returncode != 0 and "is tighter than the measured KL" in refused.stdout + refused.stderr

    again = _cascade(home, "quantize", "--demo")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building" not in again.stdout and "measuring" not in again.stdout
    assert read_figures(target) == figures
