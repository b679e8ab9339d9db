"""Fitting the pool map (`router_models.serving.pool_map`) on every model of every shared source. Offline only.

Multidimensional IRT with the item side predicted from the router's feature row x (so the map serves any new
prompt, and costs one small matmul): P(model j right on item i) = sigmoid(theta_j0 + theta_j . a(x_i) - b(x_i)),
(b, a) = x @ W + c. theta_j is one ability per (source, model): the sources grade differently, so the same model
in two sources gets two abilities (its overall level absorbs the source's grading).

- Exam sources: every graded (item, model) outcome is a Bernoulli observation (missing outcomes are left out).
- The chat source (`rmb-helpfulness`) has judged *pairs*, no absolute grade: each judged pair (winner, loser) on an
  item is a Bradley-Terry observation on the same item model, P(w beats l) = sigmoid((theta_w - theta_l) . (1, a(x)))
  (the difficulty cancels). So chat prompts teach the domain loadings, never the difficulty.
- Each source carries the same total weight (its observations' mean loss), so MMLU-Pro's 400,000 outcomes do not
  drown RouterBench's 24,000. Ridge on W, a weak normal prior on the abilities.
- Columns are standardised for the fit, and the scaling folded back into W and c, so serving reads raw rows.

Full-batch Adam then L-BFGS in float64 torch on one thread from a seeded start: the same data gives the same map,
bit for bit, on one machine (`test_pool_map_fit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.serving.placement import fit_ability
from router_models.serving.pool_map import PoolMap, SharedAbility
from router_models.training.outcomes import SOURCES, Example

__all__ = ["FitConfig", "Observations", "fit_pool_map", "observations", "shared_abilities"]

Floats = npt.NDArray[np.float64]
_CHAT = {s.name for s in SOURCES if s.kind == "chat"}


@dataclass(frozen=True)
class FitConfig:
    """`k` domain axes; `ridge` on the standardised item heads; `ability_sd` the abilities' prior sd (logits);
    `steps` of Adam at `lr` then up to `lbfgs_steps` of L-BFGS; `seed` of the start."""

    k: int = 4
    ridge: float = 3e-3
    ability_sd: float = 3.0
    steps: int = 150
    lr: float = 0.05
    lbfgs_steps: int = 100
    seed: int = 0


@dataclass(frozen=True)
class Observations:
    """The shared outcomes as arrays: `models` ("source/model"), graded observations (`item`, `model`, `y`, `weight`),
    judged pairs (`pair_item`, `winner`, `loser`, `pair_weight`), one row of `examples` per item."""

    models: tuple[str, ...]
    item: npt.NDArray[np.int64]
    model: npt.NDArray[np.int64]
    y: Floats
    weight: Floats
    pair_item: npt.NDArray[np.int64]
    winner: npt.NDArray[np.int64]
    loser: npt.NDArray[np.int64]
    pair_weight: Floats


def observations(examples: Sequence[Example]) -> Observations:
    """Every graded outcome and judged pair of `examples`, each source weighted to the same total (1)."""
    names: dict[str, int] = {}
    graded: list[tuple[int, int, float, str]] = []
    pairs: list[tuple[int, int, int, str]] = []
    for i, ex in enumerate(examples):
        ids = [names.setdefault(f"{ex.source}/{m}", len(names)) for m in ex.models]
        if ex.source in _CHAT:
            pairs += [(i, ids[w], ids[lo], ex.source) for w, lo in ex.pairs]
        else:
            graded += [(i, ids[j], float(v), ex.source) for j, v in enumerate(ex.outcomes) if not np.isnan(v)]
    counts: dict[str, int] = {}
    for *_, s in (*graded, *pairs):
        counts[s] = counts.get(s, 0) + 1

    def col(rows: Sequence[tuple[int, int, float, str]] | Sequence[tuple[int, int, int, str]], at: int) -> list[float]:
        return [float(r[at]) for r in rows]

    return Observations(
        tuple(names), np.asarray(col(graded, 0), np.int64), np.asarray(col(graded, 1), np.int64),
        np.asarray(col(graded, 2), np.float64), np.asarray([1.0 / counts[r[3]] for r in graded], np.float64),
        np.asarray(col(pairs, 0), np.int64), np.asarray(col(pairs, 1), np.int64), np.asarray(col(pairs, 2), np.int64),
        np.asarray([1.0 / counts[r[3]] for r in pairs], np.float64))


def _standardise(x: npt.NDArray[np.floating]) -> tuple[Floats, Floats, Floats]:
    mean = x.mean(axis=0, dtype=np.float64)
    scale = x.std(axis=0, dtype=np.float64)
    scale = np.where(scale > 1e-6, scale, 1.0)
    return (np.asarray(x, np.float64) - mean) / scale, mean, scale


def _minimise(params: list[Any], loss: Callable[[], Any], cfg: FitConfig) -> None:
    """`cfg.steps` of full-batch Adam, then L-BFGS with a strong Wolfe line search, on `params` in place."""
    import torch

    adam = torch.optim.Adam(params, lr=cfg.lr)
    for _ in range(cfg.steps):
        adam.zero_grad()
        value = loss()
        value.backward()
        adam.step()
    lbfgs = torch.optim.LBFGS(params, max_iter=cfg.lbfgs_steps, line_search_fn="strong_wolfe",
                              tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> Any:
        lbfgs.zero_grad()
        value = loss()
        value.backward()
        return value

    lbfgs.step(closure)  # type: ignore[no-untyped-call]


def _torch_fit(z: Floats, obs: Observations, cfg: FitConfig) -> tuple[Floats, Floats, Floats]:
    """(W, c, theta) on standardised rows `z`: see the module docstring."""
    import torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(cfg.seed)
    k1 = cfg.k + 1
    x = torch.from_numpy(z)
    w = (torch.randn(z.shape[1], k1, generator=gen, dtype=torch.float64) * 0.01).requires_grad_()
    c0 = torch.zeros(1, dtype=torch.float64, requires_grad=True)  # the loadings have mean 0 over the training rows,
    fixed = torch.zeros(cfg.k, dtype=torch.float64)  # so theta_0 is the ability at an average mix of the domains
    theta = (torch.randn(len(obs.models), k1, generator=gen, dtype=torch.float64) * 0.1).requires_grad_()
    item, model, y, wt = (torch.from_numpy(a) for a in (obs.item, obs.model, obs.y, obs.weight))
    p_item, win, lose, p_wt = (torch.from_numpy(a) for a in (obs.pair_item, obs.winner, obs.loser, obs.pair_weight))
    n_sources = float(wt.sum() + p_wt.sum())

    def loss() -> torch.Tensor:
        pos = x @ w + torch.cat([c0, fixed])
        a = torch.cat([torch.ones(pos.shape[0], 1, dtype=torch.float64), pos[:, 1:]], dim=1)
        logit = (theta[model] * a[item]).sum(1) - pos[item, 0]
        total = (torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="none") * wt).sum()
        if len(p_item):
            margin = ((theta[win] - theta[lose]) * a[p_item]).sum(1)
            total = total + (torch.nn.functional.softplus(-margin) * p_wt).sum()
        prior = cfg.ridge * (w * w).sum() + (theta * theta).sum() / (2 * cfg.ability_sd**2 * len(obs.models))
        return total / n_sources + prior

    _minimise([w, c0, theta], loss, cfg)
    c = np.concatenate([c0.detach().numpy(), np.zeros(cfg.k)])
    return w.detach().numpy().copy(), c, theta.detach().numpy().copy()


def fit_pool_map(x: npt.NDArray[np.floating], examples: Sequence[Example], embedder: str,
                 cfg: FitConfig = FitConfig(), version: str = "unsaved") -> PoolMap:
    """The map fitted on feature rows `x` (one per example) and every model's outcomes in `examples`; its `shared`
    abilities are each model's placement on the fitted map from all its graded rows (`shared_abilities`)."""
    obs = observations(examples)
    z, mean, scale = _standardise(x)
    w_std, c_std, theta = _torch_fit(z, obs, cfg)
    weights = w_std / scale[:, None]
    bias = c_std - mean @ weights
    axes = ("difficulty", *(f"domain-{m + 1}" for m in range(cfg.k)))
    prior_mean = tuple(round(float(v), 6) for v in theta.mean(axis=0))
    prior_sd = tuple(round(float(v), 6) for v in np.maximum(theta.std(axis=0), 0.1))
    pool_map = PoolMap(weights.astype(np.float32), bias, axes, embedder, version, {}, prior_mean, prior_sd)
    shared = shared_abilities(pool_map, x, examples)
    return PoolMap(pool_map.weights, bias, axes, embedder, version, shared, prior_mean, prior_sd,
                   {"fit": {"k": cfg.k, "ridge": cfg.ridge, "ability_sd": cfg.ability_sd, "steps": cfg.steps,
                            "lbfgs_steps": cfg.lbfgs_steps, "seed": cfg.seed, "models": len(obs.models),
                            "graded_outcomes": len(obs.y), "judged_pairs": len(obs.pair_item)},
                    "mean_position": [round(float(v), 6) for v in c_std]})


def shared_abilities(pool_map: PoolMap, x: npt.NDArray[np.floating],
                     examples: Sequence[Example]) -> dict[str, SharedAbility]:
    """Each (source, model)'s placement on `pool_map` from all its rows in `examples` (graded outcomes; the chat
    source's win rates), as `place_from_outcomes` would place it: one placement procedure for every pool."""
    positions = pool_map.positions(np.asarray(x))
    prior = (np.asarray(pool_map.prior_mean), np.asarray(pool_map.prior_sd))
    by_source: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by_source.setdefault(ex.source, []).append(i)
    out: dict[str, SharedAbility] = {}
    for source, rows in by_source.items():
        outcomes = np.asarray([examples[i].outcomes for i in rows], np.float64)
        for j, name in enumerate(examples[rows[0]].models):
            seen = ~np.isnan(outcomes[:, j])
            if seen.sum() < 20:
                continue
            theta, se = fit_ability(positions[rows][seen], outcomes[seen, j], *prior)
            out[f"{source}/{name}"] = SharedAbility(tuple(round(float(v), 6) for v in theta),
                                                    tuple(round(float(v), 6) for v in se), int(seen.sum()),
                                                    round(float(outcomes[seen, j].mean()), 6))
    return out
