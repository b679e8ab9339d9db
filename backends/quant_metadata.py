"""The metadata a quantized checkpoint carries: how it was made and, once measured, how much it lost.

One JSON file, ``<checkpoint>/cascade-quant.json``, written by ``cascade quantize`` and completed by
``cascade quantize --evaluate``. Its ``evaluation`` block is what a policy's ``max_quant_loss`` ceiling is
checked against (``policies.pools``) and what ``cascade policy explain`` shows. Stdlib only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["METADATA_NAME", "LossFigures", "ceiling_problems", "checkpoint_dir", "read_figures", "read_metadata",
           "write_metadata"]

METADATA_NAME = "cascade-quant.json"


@dataclass(frozen=True, slots=True)
class LossFigures:
    """Measured loss of a quantized model against its original, on held-out prompts.

    ``disagreement`` = 1 - greedy-token agreement (share of positions whose most likely next token
    differs); ``kl_mean`` in nats per position; ``json_valid`` is the quantized model's share of
    schema-constrained answers that parse as JSON (``json_valid_original`` the original's).
    """

    scheme: str
    greedy_agreement: float
    kl_mean: float
    json_valid: float
    json_valid_original: float
    positions: int
    prompts: int

    @property
    def disagreement(self) -> float:
        return 1.0 - self.greedy_agreement

    def summary(self) -> str:
        """One line for humans: ``W8A8: greedy agreement 98.4% over 384 positions (...), KL 3.1e-05 ...``."""
        return (f"{self.scheme}: greedy agreement {self.greedy_agreement:.1%} over {self.positions} positions "
                f"({self.prompts} held-out prompts), KL {self.kl_mean:.3g} nats/token, JSON valid "
                f"{self.json_valid:.0%} (original {self.json_valid_original:.0%})")


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
    )


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
        from backends.demo_models import models_root

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
                        f"greedy-token disagreement {figures.disagreement:.4f} of {path}")
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
