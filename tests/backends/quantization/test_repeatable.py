"""`cascade quantize` is repeatable, for real: the tiny demo micro model quantized twice with calibration
(W8A8: SmoothQuant + GPTQ, whose Hessians are float sums) by the real llmcompressor worker gives the same
bytes, file for file. That is what the fixed seed, the one worker thread and the samples in their order are
for (`backends/quantization/worker.py`): the same samples in reverse order give other bytes (tried when this
test was written), so equal hashes are not a given; `test_build.py` checks the build's atomicity with a stand-in worker.

Slow (marked `engines` with the other heavy tests, though it starts no engine): it needs the quantization venv
(created on first use, minutes), then two quantizations of about half a minute each on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.models.demo import ensure_demo_models
from backends.quantization.calibration import demo_samples
from backends.quantization.metadata import checkpoint_problem
from backends.quantization.quantize import QUANT_SEED, QUANT_THREADS, quantize

pytestmark = pytest.mark.engines


def test_the_same_job_twice_writes_the_same_weights(tmp_path: Path) -> None:
    model = ensure_demo_models()["micro"]
    first = quantize(model, tmp_path / "a" / "micro-w8a8", "W8A8", demo_samples(16))
    second = quantize(model, tmp_path / "b" / "micro-w8a8", "W8A8", demo_samples(16))
    assert checkpoint_problem(tmp_path / "a" / "micro-w8a8") is None
    assert "model.safetensors" in first["files"]
    assert first["files"] == second["files"]  # sha256 of every file, the weights among them
    assert first["determinism"] == {"seed": QUANT_SEED, "threads": QUANT_THREADS, "shuffle": False}
