"""The metadata a quantized checkpoint carries: how it was made and, once measured, how much it lost.

One JSON file, ``<checkpoint>/cascade-quant.json``, written by ``cascade quantize`` and completed by
``cascade quantize --evaluate``. Its ``evaluation`` block is what a policy's ``max_quant_loss`` ceiling is
checked against (``policies.pools``) and what ``cascade policy explain`` shows. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["METADATA_NAME", "LossFigures", "ceiling_problems", "checkpoint_dir", "checkpoint_problem", "file_hashes",
           "read_figures", "read_metadata", "write_metadata"]

METADATA_NAME = "cascade-quant.json"


@dataclass(frozen=True, slots=True)
class LossFigures:
    """Measured loss of a quantized model against its original, on held-out prompts (``backends.quantization.eval``).

    ``greedy_agreement`` is teacher-forced: at each position of the original's own continuation, whether
    both models' most likely next token is the same; ``disagreement`` = 1 - that share. ``kl_mean`` in nats
    per position, on the same positions; ``json_valid`` is the quantized model's share of
    schema-constrained answers that parse as JSON (``json_valid_original`` the original's).
    ``sequence_agreement`` (secondary, None when not measured) compares the two models' own greedy
    continuations position by position, so one early divergence costs the rest of its sequence.
    """

    scheme: str
    greedy_agreement: float
    kl_mean: float
    json_valid: float
    json_valid_original: float
    positions: int
    prompts: int
    sequence_agreement: float | None = None

    @property
    def disagreement(self) -> float:
        return 1.0 - self.greedy_agreement

    def summary(self) -> str:
        """One line for humans: ``W8A8: next-token agreement 98.4% over 384 positions (...), KL 3.1e-05 ...``."""
        sequence = "" if self.sequence_agreement is None else (
            f", own greedy text {self.sequence_agreement:.1%} the same")
        return (f"{self.scheme}: next-token agreement {self.greedy_agreement:.1%} over {self.positions} positions "
                f"({self.prompts} held-out prompts, teacher-forced), KL {self.kl_mean:.3g} nats/token, JSON valid "
                f"{self.json_valid:.0%} (original {self.json_valid_original:.0%}){sequence}")


def read_metadata(checkpoint: Path) -> dict[str, Any] | None:
    """The metadata of ``checkpoint``, or None when it has none (not made by ``cascade quantize``)."""
    try:
        data = json.loads((checkpoint / METADATA_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{checkpoint / METADATA_NAME}: unreadable ({exc})") from exc
    return data if isinstance(data, dict) else None


def read_figures(checkpoint: Path) -> LossFigures | None:
    """The evaluation figures of ``checkpoint``, or None when it was never evaluated."""
    meta = read_metadata(checkpoint)
    evaluation = None if meta is None else meta.get("evaluation")
    if not isinstance(evaluation, dict):
        return None
    return LossFigures(
        scheme=str(meta.get("scheme", "?")) if meta else "?",
        greedy_agreement=float(evaluation["greedy_agreement"]),
        kl_mean=float(evaluation["kl_mean"]),
        json_valid=float(evaluation["json_valid"]),
        json_valid_original=float(evaluation["json_valid_original"]),
        positions=int(evaluation["positions"]),
        prompts=int(evaluation["prompts"]),
        sequence_agreement=None if evaluation.get("sequence_agreement") is None
        else float(evaluation["sequence_agreement"]),
    )


def file_hashes(checkpoint: Path) -> dict[str, str]:
    """sha256 of every file under ``checkpoint`` but the metadata itself, by relative path."""
    hashes = {}
    for file in sorted(checkpoint.rglob("*")):
        if file.is_file() and file.name not in (METADATA_NAME, f".{METADATA_NAME}.tmp"):
            hashes[str(file.relative_to(checkpoint))] = hashlib.sha256(file.read_bytes()).hexdigest()
    return hashes


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` is not a whole build of ``cascade quantize``, or None when it is: its metadata
    (written last) must exist and list the sha256 of every file, and the files must match it."""
    try:
        meta = read_metadata(checkpoint)
    except ValueError as exc:
        return str(exc)
    if meta is None:
        return f"no {METADATA_NAME} (not built by cascade quantize, or cut short)"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return f"{METADATA_NAME} lists no files (made by an older cascade quantize)"
    found = file_hashes(checkpoint)
    for rel, expected in sorted(files.items()):
        if rel not in found:
            return f"missing file {rel}"
        if found[rel] != expected:
            return f"sha256 mismatch in {rel}"
    return None


def write_metadata(checkpoint: Path, meta: dict[str, Any]) -> None:
    """Replace the metadata file atomically (write beside it, then rename)."""
    tmp = checkpoint / f".{METADATA_NAME}.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, checkpoint / METADATA_NAME)


def checkpoint_dir(model: str) -> Path | None:
    """The local directory an engine ``model`` names (``demo:NAME`` under the models cache), or None for a
    hub id or a path that does not exist."""
    if model.startswith("demo:"):
        from backends.models.demo import models_root

        path = models_root() / model.removeprefix("demo:")
    else:
        path = Path(model).expanduser()
    return path if path.is_dir() else None


def ceiling_problems(model: str, max_disagreement: float | None, max_kl: float | None,
                     min_json_valid: float | None) -> list[str]:
    """Why ``model``'s measured loss breaks the ceiling; empty when it fits.

    A checkpoint not built yet is not judged here (its engine cannot start anyway); one that exists but
    was never evaluated is refused, since nothing shows its loss is within the ceiling.
    """
    path = checkpoint_dir(model)
    if path is None:
        return []
    try:
        figures = read_figures(path)
    except (ValueError, KeyError, TypeError) as exc:
        return [f"max_quant_loss: cannot read the loss figures of {path}: {exc}"]
    if figures is None:
        return [f"max_quant_loss is set but {path} has no measured loss; run `cascade quantize --evaluate "
                f"--model ORIGINAL --out {path}` first"]
    problems = []
    if max_disagreement is not None and figures.disagreement > max_disagreement:
        problems.append(f"max_quant_loss.max_disagreement {max_disagreement:g} is tighter than the measured "
                        f"next-token disagreement {figures.disagreement:.4f} (teacher-forced) of {path}")
    if max_kl is not None and figures.kl_mean > max_kl:
        problems.append(f"max_quant_loss.max_kl {max_kl:g} is tighter than the measured KL {figures.kl_mean:.3g} "
                        f"nats of {path}")
    if min_json_valid is not None and figures.json_valid < min_json_valid:
        problems.append(f"max_quant_loss.min_json_valid {min_json_valid:g} is above the measured JSON validity "
                        f"{figures.json_valid:.3f} of {path}")
    if problems:
        problems[-1] += (": this quantized pool may not serve as a fallback; recalibrate it (more or better "
                         "calibration data, W8A8 instead of W4A16) or relax the ceiling")
    return problems
