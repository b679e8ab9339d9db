"""Leave-one-source-out quality of a two-stage router: a fast router scores every prompt, and a slower one
re-scores only the prompts whose fast score falls near the threshold in use.

`python -m router_models.training.refine_eval [--fast ART] [--refiner ART] [--bands 0,0.02,0.05,...]`

Both artifacts' configurations are evaluated leave one source out (`loso.leave_one_source_out`, as their stored
figures are), each held-out prompt keeping both held-out scores. For every flagship share s of the cost-quality
curve, the threshold in use is the fast score's quantile giving share s on that source (as a `flagship_share`
threshold does), and the prompts whose fast score lies within `band` score units of it take the refiner's score;
the rest keep the fast one. Each prompt goes to the flagship when its score (either) reaches the threshold. The
curve over all shares gives the two-stage router's APGR, and the share of prompts refined, averaged over the
shares, what it costs. Band 0 is the fast router alone; a band of 1 the refiner alone (up to the grid of shares).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["RefinedFigure", "main", "refined_apgr"]

Floats = npt.NDArray[np.float64]
_GRID = 400  # shares of the curve at which the threshold is set (the curve's error: well under 0.001 APGR)


@dataclass(frozen=True)
class RefinedFigure:
    """The two-stage router on one held-out source at one band: its APGR, the share of prompts the refiner
    scored (mean over the curve's shares), and that share at a 30% flagship share (the shipped policies')."""

    apgr: float
    refined: float
    refined_at_30: float


def refined_apgr(fast: Floats, refiner: Floats, weak: Floats, strong: Floats, band: float,
                 grid: int = _GRID) -> RefinedFigure:
    """The two-stage router's APGR on one source (see the module docstring), trapezoid over the realised shares
    with the curve's ends at (0, 0) and (1, 1)."""
    gains = np.asarray(strong, np.float64) - np.asarray(weak, np.float64)
    total = float(gains.sum())
    points, refined = [(0.0, 0.0), (1.0, 1.0)], []
    at_30 = float("nan")
    for k in range(1, grid):
        threshold = float(np.quantile(fast, 1.0 - k / grid))
        near = np.abs(fast - threshold) < band
        chosen = np.where(near, refiner, fast) >= threshold
        points.append((float(chosen.mean()), float(gains[chosen].sum()) / total))
        refined.append(float(near.mean()))
        if k == int(0.3 * grid):
            at_30 = refined[-1]
    curve = np.asarray(sorted(points))
    return RefinedFigure(float(np.trapezoid(curve[:, 1], curve[:, 0])), float(np.mean(refined)), at_30)


def _held_out(artifact: Path, routing_dir: Path) -> dict[str, tuple[Floats, Floats, Floats, list[str]]]:
    """Per public source: the artifact configuration's held-out scores, weak and strong outcomes, prompt keys."""
    from router_models.embedders.factory import make_embedder
    from router_models.serving.artifact import load_artifact
    from router_models.training.loso import leave_one_source_out
    from router_models.training.outcomes import SOURCES, load_outcomes
    from router_models.training.pipeline import DEFAULT_FEATURES, DEFAULT_TARGET
    from router_models.training.trainer import TrainConfig, features

    art = load_artifact(artifact)
    cfg = TrainConfig(routing_dir=routing_dir, target=str(art.metadata.get("target", DEFAULT_TARGET)),
                      feature_set=str(art.metadata.get("feature_set", DEFAULT_FEATURES)))
    known = {s.name for s in SOURCES}
    sources = tuple(s for s in art.metadata.get("sources", {}) if s in known) or None
    public = load_outcomes(routing_dir, sources=sources)
    embedder = make_embedder(art.embedder, threads=1)
    print(f"[refine] {artifact.name}: {len(public)} prompts, embedder {embedder.name} (cached after a first run)")
    loso = leave_one_source_out(features(embedder, public, cfg.feature_set), public, cfg)
    return {s: (np.asarray(scores, np.float64), np.array([e.weak for e in loso.examples[s]]),
                np.array([e.strong for e in loso.examples[s]]), [e.key for e in loso.examples[s]])
            for s, scores in loso.scores.items()}


def main(argv: list[str] | None = None) -> int:
    from router_models.serving.artifact import DEFAULT_ARTIFACT, FAST_ARTIFACT
    from router_models.training.outcomes import DEFAULT_ROUTING_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fast", type=Path, default=FAST_ARTIFACT, help="the router that scores every prompt")
    p.add_argument("--refiner", type=Path, default=DEFAULT_ARTIFACT, help="the router that re-scores near ones")
    p.add_argument("--bands", default="0,0.01,0.02,0.03,0.05,0.075,0.1,1", help="half-widths, score units")
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR)
    args = p.parse_args(argv)
    fast, refiner = _held_out(args.fast, args.routing_dir), _held_out(args.refiner, args.routing_dir)
    sources = [s for s in fast if s in refiner]
    for s in sources:
        if fast[s][3] != refiner[s][3]:
            raise SystemExit(f"the two evaluations hold out different prompts of {s}")
    print(f"{'band':>6} {'mean APGR':>10} {'refined':>8} {'at 30%':>7}  " + "  ".join(f"{s[:14]:>14}" for s in sources))
    for band in (float(b) for b in args.bands.split(",")):
        figures = [refined_apgr(fast[s][0], refiner[s][0], fast[s][1], fast[s][2], band) for s in sources]
        print(f"{band:6.3f} {np.mean([f.apgr for f in figures]):10.4f} {np.mean([f.refined for f in figures]):8.3f} "
              f"{np.mean([f.refined_at_30 for f in figures]):7.3f}  "
              + "  ".join(f"{f.apgr:.4f} ({f.refined:.2f})" for f in figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
