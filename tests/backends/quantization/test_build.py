"""Building a quantized checkpoint, without llmcompressor: a stand-in worker writes the files, so these tests
check what `backends.quantization.quantize.quantize` itself promises. The
checkpoint appears whole or not at all (temporary
directory renamed into place, metadata with every file's sha256 written last); a build cut short leaves the
previous checkpoint as it was and its leftovers are swept by the next build; a changed file is noticed. That the
real worker's fixed seed and thread count make a build repeatable is `test_repeatable.py`, with llmcompressor."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

import backends.quantization.quantize as quantize_module
from backends.quantization.calibration import demo_samples
from backends.quantization.metadata import METADATA_NAME, checkpoint_problem, read_metadata
from backends.quantization.quantize import QuantizeError, quantize

# Stands in for quant_worker.py: reads the job, writes two files into job["out"], reports progress;
# with FAIL set it writes one file, then dies as an interrupted build would.
_FAKE_WORKER = '''
import json, os, sys
job = json.load(open(sys.argv[2]))
out = job["out"]
open(os.path.join(out, "model.safetensors"), "wb").write(b"weights " + job["scheme"].encode())
print(json.dumps({"step": 1, "of": 4, "what": "loading"}), flush=True)
if os.environ.get("FAKE_WORKER_FAIL"):
    sys.exit(3)
open(os.path.join(out, "config.json"), "w").write("{}")
print(json.dumps({"done": True}), flush=True)
'''


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(quantize_module, "ensure_quant_venv", lambda home=None, say=print: python)
    return python


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "original"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return model


def test_a_build_lands_whole_with_every_file_hashed(tmp_path: Path, fake_python: Path) -> None:
    out = tmp_path / "models" / "flagship-w8a8"
    meta = quantize(_model(tmp_path), out, "W8A8", demo_samples(8))
    assert checkpoint_problem(out) is None
    assert set(meta["files"]) == {"config.json", "model.safetensors"}
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".flagship-w8a8.quantize-")] == []

    (out / "model.safetensors").write_bytes(b"truncated")
    assert checkpoint_problem(out) == "sha256 mismatch in model.safetensors"
    (out / "model.safetensors").unlink()
    assert checkpoint_problem(out) == "missing file model.safetensors"


def test_an_interrupted_build_leaves_the_previous_checkpoint_whole(tmp_path: Path, fake_python: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "models" / "flagship-w8a8"
    first = quantize(_model(tmp_path), out, "W8A8", demo_samples(8))

    monkeypatch.setenv("FAKE_WORKER_FAIL", "1")
    with pytest.raises(QuantizeError, match="exit 3"):
        quantize(_model(tmp_path), out, "W4A16", demo_samples(8))
    assert checkpoint_problem(out) is None and read_metadata(out) == first  # untouched
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".flagship-w8a8.")) == [
        ".flagship-w8a8.quantize.lock"]


def test_leftovers_of_a_killed_build_are_swept_and_never_pass_as_built(tmp_path: Path, fake_python: Path) -> None:
    out = tmp_path / "models" / "flagship-w8a8"
    out.parent.mkdir(parents=True)
    # what a SIGKILL mid-build leaves: a temporary directory with some files and no metadata
    leftover = out.parent / ".flagship-w8a8.quantize-abc123"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    assert checkpoint_problem(leftover) is not None
    # a directory at the target without metadata (copied by hand, or from an older build) is not whole either
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"half")
    assert checkpoint_problem(out) == f"no {METADATA_NAME} (not built by cascade quantize, or cut short)"

    quantize(_model(tmp_path), out, "W8A8", demo_samples(8))
    assert not leftover.exists() and checkpoint_problem(out) is None


def test_demo_fallback_failure_is_an_exit_code_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import backends.models.demo
    from backends.quantization.cli import build_demo_fallback

    def failing(*args: object, **kwargs: object) -> None:
        raise QuantizeError("the quantization worker failed (exit 3); full log q.log")

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setattr(backends.models.demo, "ensure_demo_models", lambda *a, **k: {})
    monkeypatch.setattr(quantize_module, "quantize", failing)
    assert build_demo_fallback(8) == 1  # what `cascade demo` returns, instead of a traceback
    assert "error: the quantization worker failed (exit 3); full log q.log" in capsys.readouterr().err
