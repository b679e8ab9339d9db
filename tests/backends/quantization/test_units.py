"""Quantization pieces without engines: calibration files, loss arithmetic, the policy's loss ceiling, the CLI's
refusal without calibration, MoE handling, and what `cascade policy explain` shows."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
from pathlib import Path
from typing import ClassVar

import pytest

from backends.engines.supervisor import EngineStartError
from backends.machine_checks import checked_here, quant_lines
from backends.quantization.calibration import CalibrationError, demo_samples, load_samples, parse_samples
from backends.quantization.eval import EngineRun, compare
from backends.quantization.metadata import METADATA_NAME, read_figures, write_metadata
from backends.quantization.quantize import MOE_EXPERTS_IGNORE, default_ignore
from gateway.cli.main import main
from policies.loader import PolicyError, parse_policy
from policies.schema import EngineSpec
from tests.backends.quantization.policy_text import with_checkpoint_pool

ROOT = Path(__file__).resolve().parents[3]


def test_request_log_lines_are_filtered_by_pool_and_chats_texts_accepted() -> None:
    lines = [
        json.dumps({"request": {"messages": [{"role": "user", "content": "a"}]}, "pool": "flagship"}),
        json.dumps({"request": {"messages": [{"role": "user", "content": "b"}]}, "pool": "micro"}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "c"}]}),
        json.dumps({"text": "plain"}),
        json.dumps({"prompt": "p"}),
    ]
    samples = parse_samples(lines, "log", pool="flagship")
    assert samples == [
        {"messages": [{"role": "user", "content": "a"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "c"}]},
        {"text": "plain"},
        {"text": "p"},
    ]


def test_malformed_line_names_file_and_line() -> None:
    with pytest.raises(CalibrationError, match=r"log:2: no `messages`"):
        parse_samples([json.dumps({"text": "x"}), json.dumps({"other": 1})], "log")


def test_too_few_samples_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "few.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n")
    with pytest.raises(CalibrationError, match=r"1 usable samples.*at least 8"):
        load_samples(path)


def test_demo_samples_are_chats_from_the_corpus() -> None:
    demo = demo_samples(16)
    assert len(demo.samples) == 16 and all("messages" in s for s in demo.samples)
    assert len(demo.sha256) == 64


def _run(dists: list[list[dict[int, float]]], answers: tuple[str, ...] = ("{}",),
         greedy: tuple[tuple[int, ...], ...] = ()) -> EngineRun:
    return EngineRun(tuple(tuple(d) for d in dists), answers, 100.0, greedy)


def test_sequence_agreement_counts_the_drift_after_a_divergence_that_teacher_forcing_does_not() -> None:
    p = {1: math.log(0.7), 2: math.log(0.3)}
    # the quantized model's own text leaves the original's at the second token and never comes back, yet
    # scored on the original's text it ranks every next token the same
    original = _run([[p, p, p, p]], greedy=((1, 1, 1, 1),))
    quantized = _run([[p, p, p, p]], greedy=((1, 2, 2, 2),))
    ev = compare(original, quantized, k=2, vocab_size=2)
    assert ev.greedy_agreement == 1.0 and ev.sequence_agreement == pytest.approx(0.25)
    shorter = compare(original, _run([[p, p, p, p]], greedy=((1, 1),)), k=2, vocab_size=2)
    assert shorter.sequence_agreement == pytest.approx(0.5)  # a sequence cut short counts what is missing


def test_compare_agreement_and_kl() -> None:
    half = math.log(0.5)
    p = {1: math.log(0.7), 2: math.log(0.2), 3: math.log(0.1)}
    q = {1: math.log(0.6), 2: math.log(0.3), 3: math.log(0.1)}
    flipped = {1: half, 2: math.log(0.4), 3: math.log(0.1)}
    original = _run([[p, p], [p]], ("{}", '{"a": 1}'))
    quantized = _run([[p, q], [{2: half, 1: math.log(0.4)}]], ("{}", "{broken"))
    ev = compare(original, quantized, k=3, vocab_size=3)
    assert ev.positions == 3 and ev.prompts == 2
    assert ev.greedy_agreement == pytest.approx(2 / 3)  # the last position's top token flipped from 1 to 2
    expected_kl = 0.7 * math.log(0.7 / 0.6) + 0.2 * math.log(0.2 / 0.3)  # first position: identical, 0
    assert ev.kl_max > expected_kl  # the flipped position diverges more than the mild one
    assert ev.json_valid == 0.5 and ev.json_valid_original == 1.0
    assert ev.exact_kl
    same = compare(original, _run([[p, p], [p]]), k=3, vocab_size=3)
    assert same.greedy_agreement == 1.0 and same.kl_mean == pytest.approx(0.0, abs=1e-12)
    assert compare(original, _run([[p, flipped], [p]]), k=2, vocab_size=3).exact_kl is False


def _checkpoint(tmp_path: Path, agreement: float, kl: float, evaluated: bool = True) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    meta: dict[str, object] = {"scheme": "W8A8"}
    if evaluated:
        meta["evaluation"] = {"greedy_agreement": agreement, "kl_mean": kl, "json_valid": 1.0,
                              "json_valid_original": 1.0, "positions": 384, "prompts": 12}
    write_metadata(ckpt, meta)
    return ckpt


def test_policy_with_a_tighter_ceiling_than_measured_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, agreement=0.95, kl=0.02)
    with pytest.raises(PolicyError) as err:
        checked_here(parse_policy(with_checkpoint_pool(ckpt, "{max_disagreement: 0.02}"), "p.yaml"))
    message = str(err.value)
    assert re.search(r"p\.yaml:\d+: pools\.flagship-int8\.max_quant_loss: ", message), message
    parse_policy(with_checkpoint_pool(ckpt, "{max_disagreement: 0.02}"), "p.yaml")  # parsing alone reads no checkpoint
    assert "max_disagreement 0.02 is tighter than the measured next-token disagreement 0.0500" in message
    assert "may not serve as a fallback" in message
    with pytest.raises(PolicyError, match=r"max_kl 0\.01 is tighter than the measured KL 0\.02 nats"):
        checked_here(parse_policy(with_checkpoint_pool(ckpt, "{max_kl: 0.01}"), "p.yaml"))
    fits = "{max_disagreement: 0.06, max_kl: 0.05, min_json_valid: 0.9}"
    loaded = checked_here(parse_policy(with_checkpoint_pool(ckpt, fits), "p.yaml"))
    lines = quant_lines(loaded.policy)
    assert lines[0] == "quantized pools:"
    assert "flagship-int8: W8A8: next-token agreement 95.0% over 384 positions" in lines[1]
    assert "ceiling max_disagreement 0.06, max_kl 0.05, min_json_valid 0.9: within" in lines[1]


def test_unevaluated_checkpoint_is_refused_and_unbuilt_one_is_not_judged(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 0, 0, evaluated=False)
    with pytest.raises(PolicyError, match="has no measured loss; run `cascade quantize --evaluate"):
        checked_here(parse_policy(with_checkpoint_pool(ckpt, "{max_disagreement: 0.5}"), "p.yaml"))
    checked_here(parse_policy(with_checkpoint_pool(tmp_path / "not-built", "{max_disagreement: 0.5}"), "p.yaml"))


def test_quantize_refuses_without_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    model = tmp_path / "model"
    model.mkdir()
    code = main(["quantize", "--model", str(model), "--scheme", "W8A8", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert "no calibration data" in err and "--no-calibration" in err and "clips the activation outliers" in err
    assert not (tmp_path / "out").exists()


def test_moe_models_keep_their_experts_in_full_precision(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_local_experts": 8}))
    ignore, note = default_ignore(tmp_path)
    assert MOE_EXPERTS_IGNORE in ignore and note is not None and "no int8/int4 fused-MoE kernel" in note
    assert default_ignore(tmp_path, quantize_experts=True) == (("lm_head",), None)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert default_ignore(tmp_path) == (("lm_head",), None)


def test_metadata_round_trip(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, agreement=0.99, kl=0.001)
    figures = read_figures(ckpt)
    assert figures is not None and figures.disagreement == pytest.approx(0.01)
    assert json.loads((ckpt / METADATA_NAME).read_text())["scheme"] == "W8A8"


def test_demo_ladder_moves_flagship_traffic_to_the_int8_pool_under_load_and_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from policies.ladder import Ladder
    from policies.loader import load_policy

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))  # the int8 checkpoint is not built there: not judged

    policy = load_policy(ROOT / "policies" / "demo-ladder.yaml").policy
    int8 = policy.pools["flagship-int8"]
    assert int8.type == "local" and int8.engine.model == "demo:flagship-w8a8" and int8.max_quant_loss is not None
    ladder = Ladder(policy.degradation.steps)
    queue = ("queue_depth", "flagship")
    assert ladder.update({queue: 1}, now=0).route("flagship")[0] == "flagship"
    busy = ladder.update({queue: 12}, now=1)
    assert busy.route("flagship") == ("flagship-int8", ("flagship-busy-int8",))
    assert ladder.update({queue: 1}, now=10).route("flagship")[0] == "flagship-int8"  # held 20 s
    assert ladder.update({queue: 1}, now=30).route("flagship")[0] == "flagship"


class _FakeEngine:
    """Stands in for `EngineSupervisor` in `_measure_both`: records starts, stops and what ran while it was up."""

    events: ClassVar[list[str]] = []
    made: ClassVar[list[_FakeEngine]] = []
    fail: ClassVar[str | None] = None

    def __init__(self, pool: str, spec: EngineSpec, home: Path | None = None) -> None:
        self.role = pool.removeprefix("eval-")
        self.port = spec.base_port
        self.up = False
        self.made.append(self)

    @property
    def urls(self) -> tuple[str, ...]:
        return (f"http://127.0.0.1:{self.port}",)

    async def start(self) -> None:
        self.events.append(f"start {self.role}")
        if self.role == self.fail:
            raise EngineStartError(f"{self.role} died")
        await asyncio.sleep(0.05)
        self.up = True
        self.events.append(f"up {self.role}")

    async def aclose(self) -> None:
        if self.up:
            self.events.append(f"stop {self.role}")
        self.up = False


async def _fake_measure(url: str, role: str, *args: object, **kwargs: object) -> tuple[str, list[list[int]]]:
    _FakeEngine.events.append(f"measure {role}")
    return role, []


@pytest.mark.parametrize("room", [True, False])
def test_the_evaluation_starts_both_engines_at_once_only_where_both_fit(
        room: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.engines import supervisor
    from backends.quantization import quantize

    _FakeEngine.events, _FakeEngine.made, _FakeEngine.fail = [], [], None
    monkeypatch.setattr(supervisor, "EngineSupervisor", _FakeEngine)
    monkeypatch.setattr(quantize, "measure_engine", _fake_measure)
    monkeypatch.setattr(quantize, "_room_for_both", lambda spec, model: room)
    bar = quantize.Progress(5, io.StringIO())
    ref, got = asyncio.run(quantize._measure_both(Path("o"), Path("q"), [[1]], 4, 2, bar, None))
    assert (ref, got) == ("original", "quantized")
    if room:  # both up before either is measured; each measured while the other is idle or gone
        assert _FakeEngine.events[:2] == ["start original", "start quantized"]
        assert _FakeEngine.events[4:] == ["measure original", "stop original", "measure quantized", "stop quantized"]
    else:  # never both at once
        assert _FakeEngine.events == ["start original", "up original", "measure original", "stop original",
                                      "start quantized", "up quantized", "measure quantized", "stop quantized"]


def test_a_failed_start_beside_the_other_names_its_model_and_stops_both(monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.engines import supervisor
    from backends.quantization import quantize

    _FakeEngine.events, _FakeEngine.made, _FakeEngine.fail = [], [], "quantized"
    monkeypatch.setattr(supervisor, "EngineSupervisor", _FakeEngine)
    monkeypatch.setattr(quantize, "_room_for_both", lambda spec, model: True)
    with pytest.raises(quantize.QuantizeError, match="could not serve the quantized model q: quantized died"):
        asyncio.run(quantize._measure_both(Path("o"), Path("q"), [[1]], 4, 2, quantize.Progress(5, io.StringIO()),
                                           None))
    assert _FakeEngine.events == ["start original", "start quantized"]  # the original's start was cancelled
    assert len(_FakeEngine.made) == 2 and not any(engine.up for engine in _FakeEngine.made)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity")
def test_the_evaluation_engines_take_one_core_the_environment_names_else_the_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.quantization import quantize

    cores = sorted(os.sched_getaffinity(0))
    bind = "VLLM_CPU_OMP_THREADS_BIND"
    monkeypatch.delenv(bind, raising=False)
    assert quantize._eval_engine_env() == {bind: str(cores[0])}
    monkeypatch.setenv(bind, str(cores[-1]))  # one core this process may use: taken (the suite's last core)
    assert quantize._eval_engine_env() == {bind: str(cores[-1])}
    for other in (f"{cores[0]}-{cores[-1]}", "auto", str(max(cores) + 1)):  # several cores, vLLM's word, elsewhere
        monkeypatch.setenv(bind, other)
        assert quantize._eval_engine_env() == {bind: str(cores[0])}, other
