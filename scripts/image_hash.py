"""Print the source hash of the image build: sha256 (16 hex digits) over deploy/Dockerfile, .dockerignore, the
engine variant and every file of the build context that .dockerignore lets through (path and bytes).

Two trees with the same hash build the same image, so tests reuse `localhost/cascade-gateway:src-HASH`.
Keep CONTEXT and SKIP in step with .dockerignore.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CONTEXT", "context_files", "source_hash"]

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = ("pyproject.toml", "README.md", "gateway", "backends", "policies", "router_models", "loadtest",
           "scripts/image_entry.py", "deploy/Dockerfile", ".dockerignore")
SKIP = ("__pycache__", ".cascade")


def context_files(root: Path = ROOT) -> Iterator[Path]:
    """The files that go into the build, sorted, relative to `root`."""
    for name in CONTEXT:
        path = root / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in found:
            rel = file.relative_to(root)
            if file.suffix == ".pyc" or any(part in SKIP for part in rel.parts):
                continue
            if rel.parts[:2] == ("loadtest", "results"):
                continue
            yield rel


def source_hash(engine: str, root: Path = ROOT) -> str:
    """The hash of the build inputs for `engine` (cpu, cuda or none)."""
    digest = hashlib.sha256(f"engine={engine}\n".encode())
    for rel in context_files(root):
        digest.update(f"{rel}\n".encode())
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(source_hash(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
