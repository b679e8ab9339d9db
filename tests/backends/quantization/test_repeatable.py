"""`cascade quantize` with calibration from a request log, and repeatable, for real: the tiny demo micro model
quantized twice (W8A8: SmoothQuant + GPTQ, whose Hessians are float sums) by the real llmcompressor worker, once
through the CLI from a request log (`--calibration FILE --pool micro`: the other pool's lines are skipped) and once
through `quantize()` with the same samples in memory, gives the same bytes, file for file. That is what the fixed
seed, the one worker thread and the samples in their order are for (`backends/quantization/worker.py`). The same
samples in reverse order gave other bytes when this test was written; with llmcompressor 0.14.0.1 and torch 2.13 they
give the same bytes (8 or 16 samples, tried 2026-12-06), so what this guards is a run's repeatability, not the order;
`test_build.py` checks the build's atomicity with a stand-in worker. Serving and measuring a checkpoint is
`test_demo.py`'s.

Slow (marked `engines` with the other heavy tests, though it starts no engine): it needs the quantization venv
(created on first use, minutes), then two quantizations of about half a minute each on 2 cores. Under pytest-xdist it
is a group of its own, not on the engine tests' worker (the suite's longest path): it runs at the start beside them,
and the venv it creates is there when `test_demo.py` needs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.models.demo import ensure_demo_models
from backends.quantization.calibration import demo_samples, load_samples
from backends.quantization.metadata import METADATA_NAME, checkpoint_problem
from backends.quantization.quantize import QUANT_SEED, QUANT_THREADS, quantize
from gateway.cli.main import main

pytestmark = [pytest.mark.engines, pytest.mark.xdist_group("quantization-venv")]

SAMPLES = 16


def test_the_same_job_twice_writes_the_same_weights_from_a_request_log_or_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = ensure_demo_models()["micro"]
    samples = demo_samples(SAMPLES)
    log = tmp_path / "requests.jsonl"
    lines = [{"request": s, "pool": "micro"} for s in samples.samples]
    lines.insert(3, {"request": {"messages": [{"role": "user", "content": "another pool's request"}]},
                     "pool": "flagship"})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_samples(log, pool="micro").samples == samples.samples

    out = tmp_path / "a" / "micro-w8a8"
    code = main(["quantize", "--model", str(model), "--scheme", "W8A8", "--calibration", str(log), "--pool", "micro",
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert f"wrote W8A8 checkpoint {out} ({SAMPLES} calibration samples)" in printed.out
    first = json.loads((out / METADATA_NAME).read_text())
    assert first["calibration"]["samples"] == SAMPLES and first["calibration"]["source"] == str(log)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "int-quantized"

    second = quantize(model, tmp_path / "b" / "micro-w8a8", "W8A8", samples)
    assert checkpoint_problem(out) is None
    assert "model.safetensors" in first["files"]
    assert first["files"] == second["files"]  # sha256 of every file, the weights among them
    assert first["determinism"] == {"seed": QUANT_SEED, "threads": QUANT_THREADS, "shuffle": False}
