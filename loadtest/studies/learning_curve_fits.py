"""The learning curve: how well the router ranks a user's traffic given N labels of it.

Each public source in turn plays "a user's traffic". For source S and one random draw (seeded, so every run
draws the same rows): S's rows are shuffled; the first N become own labels and the rows after the largest N
tried are the test rest, the same rows for every N of the draw. A source holds no text twice, but its prompts
may share a template (MMLU's 895 moral-scenario questions open with one sentence): the test rest keeps those,
as a user's later traffic repeats the templates of the traffic they labelled.
The router is fitted as leave-one-source-out does (`loso.py`: the other public sources, every copy of S's
prompts removed from them), plus the N own rows in label form (`as_own`: only `weak` and `strong`, as a label
file gives them; their target is the observed event, so no outcome of the test rest reaches the fit), in each
of the compared ways (`methods`), and scored by APGR on the test rest. N = 0 is the public model alone.

N is capped by the source: an N is tried only when at least `min_rest` rows stay for the test rest.
The public part of each fit (targets, sufficient statistics, the public-only model) is computed once per source.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from router_models.serving.label_memory import MemoryParams
from router_models.training.evaluate import apgr, example_curve
from router_models.training.outcomes import Example
from router_models.training.trainer import (
    Fitted,
    SourceRows,
    TrainConfig,
    correct,
    fit_sources,
    own_source_rows,
    source_routers,
    source_rows,
)

__all__ = ["OWN_ONLY", "SIZES", "CurvePoint", "as_own", "learning_curve", "methods", "sizes_for", "summary"]

SIZES = (0, 100, 300, 1000, 3000)
OWN_ONLY = "own-only"  # reference: the own rows alone (5 folds), no public data


@dataclass(frozen=True)
class CurvePoint:
    """APGR on `test` rows of `source` after `n` own labels of it, fitted the `method` way, in draw `draw`."""

    source: str
    method: str
    n: int
    draw: int
    apgr: float
    test: int


def methods(cfg: TrainConfig, ks: Sequence[float] = (100, 300, 1000, 3000),
            penalties: Sequence[float] = (10, 30, 100, 300, 1000), own_only: bool = True,
            memories: Sequence[MemoryParams] = ()) -> dict[str, TrainConfig]:
    """The compared ways to use own labels, by name: `equal`, `share k=...`, `correction penalty=...`,
    `memory k=... bandwidth=... prior=... structure=... slope scale=...|level shrink=... sources=... [early=...]` (the
    public model with the labels' memory)."""
    out = {"equal": replace(cfg, own_labels="equal")}
    out |= {f"share k={k:g}": replace(cfg, own_labels="share", own_k=float(k)) for k in ks}
    out |= {f"correction penalty={p:g}": replace(cfg, own_labels="correction", own_penalty=float(p))
            for p in penalties}
    out |= {f"memory k={m.neighbours} bandwidth={m.bandwidth:g} prior={m.prior:g} structure={m.structure:g} "
            f"{f'slope scale={m.slope_scale:g}' if m.slope else 'level'} shrink={m.shrink:g} sources={m.sources:g}"
            f"{f' early={m.early_labels}/{m.early_shrink:g}/{m.early_bandwidth:g}' if m.early_labels else ''}":
            replace(cfg, own_labels="memory", memory=m) for m in memories}
    if own_only:
        out[OWN_ONLY] = replace(cfg, own_labels="equal")
    return out


def as_own(examples: Sequence[Example], name: str = "own") -> list[Example]:
    """`examples` as a user's label rows: their `weak` and `strong`, no outcome matrix or judged pairs."""
    return [replace(ex, source=f"labels:{name}", group="labels", models=(), outcomes=(), pairs=())
            for ex in examples]


def sizes_for(count: int, sizes: Sequence[int] = SIZES, min_rest: int = 300) -> tuple[int, ...]:
    """The N of `sizes` that leave at least `min_rest` of `count` rows for the test rest."""
    return tuple(n for n in sizes if count - n >= min_rest)


def _apgr(scores: npt.NDArray[np.float64], examples: Sequence[Example]) -> float:
    return apgr(*example_curve(scores, examples))


def _draw(held: npt.NDArray[np.intp], n_max: int, seed: int, source: str,
          draw: int) -> tuple[npt.NDArray[np.intp], list[int]]:
    """(shuffled rows of the source, test rest): the rest is every row after the first `n_max`."""
    rng = np.random.default_rng([seed, draw, zlib.crc32(source.encode())])
    order = held[rng.permutation(len(held))]
    return order, [int(i) for i in order[n_max:]]


def _fit(name: str, mcfg: TrainConfig, public_rows: Mapping[str, SourceRows], public: Fitted,
         x_own: npt.NDArray[np.float32], own: list[Example]) -> Fitted:
    if name == OWN_ONLY:
        return fit_sources(source_rows(x_own, own, mcfg), mcfg)
    if mcfg.own_labels in ("correction", "memory"):
        return correct(public, x_own, own, mcfg)
    return fit_sources({**public_rows, **own_source_rows(x_own, own, mcfg)}, mcfg)


def learning_curve(x: npt.NDArray[np.float32], examples: Sequence[Example], cfg: TrainConfig,
                   compared: Mapping[str, TrainConfig], sources: Sequence[str] | None = None,
                   sizes: Sequence[int] = SIZES, draws: int = 3, seed: int = 0, min_rest: int = 300,
                   progress: Callable[[str], None] | None = None) -> list[CurvePoint]:
    """Every (source, method, N, draw) point of the curve (module docstring). Deterministic for a seed."""
    names = list(sources) if sources is not None else list(dict.fromkeys(ex.source for ex in examples))
    points: list[CurvePoint] = []
    for source in names:
        held = np.asarray([i for i, ex in enumerate(examples) if ex.source == source], dtype=np.intp)
        keys = {examples[i].key for i in held}
        train = [i for i, ex in enumerate(examples) if ex.source != source and ex.key not in keys]
        public_rows = source_rows(x[train], [examples[i] for i in train], cfg)
        public = fit_sources(public_rows, cfg)
        if any(m.own_labels == "memory" and m.memory.sources > 0 for m in compared.values()):
            public = replace(public, router=replace(public.router, sources=source_routers(
                x[train], [examples[i] for i in train], cfg)))
        ns = sizes_for(len(held), sizes, min_rest)
        for draw in range(draws):
            order, test = _draw(held, max(ns), seed, source, draw)
            rest = [examples[i] for i in test]
            base = _apgr(public.router.predict_proba(x[test]), rest)
            points += [CurvePoint(source, name, 0, draw, base, len(test)) for name in compared]
            for n in (n for n in ns if n > 0):
                own = as_own([examples[i] for i in order[:n]])
                for name, mcfg in compared.items():
                    fitted = _fit(name, mcfg, public_rows, public, x[order[:n]], own)
                    points.append(CurvePoint(source, name, n, draw,
                                             _apgr(fitted.predictor().predict_proba(x[test]), rest), len(test)))
            if progress is not None:
                progress(f"{source} draw {draw + 1}/{draws}: N = {', '.join(map(str, ns))}, "
                         f"test rest {len(test)}, public-only APGR {base:.3f}")
    return points


def summary(points: Sequence[CurvePoint]) -> dict[str, dict[str, dict[int, float]]]:
    """{method: {source or "mean": {N: APGR}}}: per source the mean over draws; "mean" is the mean over the
    sources that have that N."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    cells: dict[tuple[str, str, int], list[float]] = {}
    for p in points:
        cells.setdefault((p.method, p.source, p.n), []).append(p.apgr)
    for (method, source, n), values in cells.items():
        out.setdefault(method, {}).setdefault(source, {})[n] = float(np.nanmean(values))
    for per_source in out.values():
        ns = sorted({n for row in per_source.values() for n in row})
        per_source["mean"] = {n: float(np.nanmean([row[n] for row in per_source.values() if n in row]))
                              for n in ns}
    return out
