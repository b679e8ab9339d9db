"""A pairwise fit of judged preferences: one ability per model, one discrimination per prompt.

Preference data (`rmb-helpfulness`) says only which of two answers to a prompt a judge preferred, never how
good either was. The model (Bradley-Terry with an item parameter, the pairwise form of a 2PL IRT model):

    P(model w's answer is preferred to model l's on prompt i) = sigmoid(s_i * (ability_w - ability_l))

Abilities are shared by every prompt; `s_i` says how much ability decides prompt i: large where the stronger
models won every comparison, near 0 (or below) where weaker models kept up or won. That is the per-prompt
quantity the router needs, and every judged pair of the prompt informs it, not only the pairs of a micro-class
against a frontier-class model. Fitted by maximum a-posteriori (abilities ~ N(0, `prior`), s_i ~ N(1,
`discrimination_prior`): a prompt with few pairs stays near the average), by alternating diagonal Newton
steps as `irt.fit_rasch` does. `p_preferred` turns the fit into the routing event "the frontier-class answer
is preferred to the micro-class one", the label the other sources' outcomes give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from router_models.training.irt import sigmoid

__all__ = ["PairwiseFit", "fit_pairwise", "p_preferred"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PairwiseFit:
    """Fitted abilities (one per model) and discriminations (one per prompt), in logits."""

    ability: Floats
    discrimination: Floats
    iterations: int


def fit_pairwise(n_items: int, n_models: int, item: Sequence[int], winner: Sequence[int], loser: Sequence[int],
                 prior: float = 1.0, discrimination_prior: float = 1.0, max_iter: int = 1000,
                 tol: float = 1e-6) -> PairwiseFit:
    """MAP fit to judged pairs: pair k says model `winner[k]` beat `loser[k]` on prompt `item[k]`. Deterministic.

    A prompt without pairs keeps s = 1; a model without pairs keeps ability 0. Stops when no parameter moves
    more than `tol` in a step.
    """
    i, w, lo = (np.asarray(v, dtype=np.int64) for v in (item, winner, loser))
    ability = np.zeros(n_models)
    disc = np.ones(n_items)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        gap = ability[w] - ability[lo]
        p = sigmoid(disc[i] * gap)
        grad = disc[i] * (1.0 - p)
        curv = disc[i] ** 2 * p * (1.0 - p)
        g = np.bincount(w, grad, n_models) - np.bincount(lo, grad, n_models) - ability / prior
        c = np.bincount(w, curv, n_models) + np.bincount(lo, curv, n_models) + 1.0 / prior
        d_ability = g / c
        ability = ability + d_ability
        gap = ability[w] - ability[lo]
        p = sigmoid(disc[i] * gap)
        g_s = np.bincount(i, gap * (1.0 - p), n_items) - (disc - 1.0) / discrimination_prior
        c_s = np.bincount(i, gap**2 * p * (1.0 - p), n_items) + 1.0 / discrimination_prior
        d_disc = g_s / c_s
        disc = disc + d_disc
        if max(np.abs(d_ability).max(initial=0.0), np.abs(d_disc).max(initial=0.0)) < tol:
            break
    return PairwiseFit(ability=ability, discrimination=disc, iterations=iterations)


def p_preferred(fit: PairwiseFit, strong: Sequence[int], weak: Sequence[int]) -> Floats:
    """Per prompt: P(a frontier-class answer is preferred to a micro-class one), averaged over every
    (`strong`, `weak`) pair of model indices."""
    gaps = np.asarray([fit.ability[s] - fit.ability[m] for s in strong for m in weak], dtype=np.float64)
    return np.asarray(sigmoid(fit.discrimination[:, None] * gaps[None, :]).mean(axis=1), dtype=np.float64)
