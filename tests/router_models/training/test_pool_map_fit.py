"""The pool map's fit on a small synthetic outcome matrix: it runs, is deterministic, recovers who is stronger and
which prompts are harder, and places chat models from judged pairs. (Synthetic data tests the code, never quality.)"""

from __future__ import annotations

import numpy as np

from router_models.serving.placement import place_from_shared
from router_models.serving.pool_map import quality
from router_models.training.outcomes import Example
from router_models.training.pool_map_fit import FitConfig, fit_pool_map, observations

CFG = FitConfig(k=2, steps=60, lbfgs_steps=40)


def _data(n: int = 300, seed: int = 0) -> tuple[np.ndarray, list[Example]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    difficulty = 1.5 * x[:, 0]
    ability = np.array([-1.0, 0.0, 1.5])
    models = ("weak", "middle", "strong")
    out = []
    for i in range(n):
        p = 1 / (1 + np.exp(-(ability - difficulty[i])))
        y = (rng.random(3) < p).astype(float)
        if i % 3 == 0:
            out.append(Example(f"chat {i}", "rmb-helpfulness", "g", 0.5, 0.5, f"c{i}", models, (0.3, 0.5, 0.7),
                               ((2, 0), (1, 0), (2, 1))))
        else:
            out.append(Example(f"exam {i}", "routerbench", "g", y[0], y[2], f"e{i}", models, tuple(y)))
    return x, out


def test_observations_weigh_each_source_the_same() -> None:
    obs = observations(_data()[1])
    assert len(obs.models) == 6 and len(obs.pair_item) == 300  # 100 chat prompts x 3 judged pairs
    assert abs(obs.weight.sum() - 1) < 1e-9 and abs(obs.pair_weight.sum() - 1) < 1e-9


def test_fit_is_deterministic_and_recovers_the_order() -> None:
    x, examples = _data()
    first, second = fit_pool_map(x, examples, "emb", CFG), fit_pool_map(x, examples, "emb", CFG)
    np.testing.assert_array_equal(first.weights, second.weights)
    assert first.shared == second.shared
    weak, strong = (place_from_shared(first, f"routerbench/{m}") for m in ("weak", "strong"))
    assert strong.ability[0] > weak.ability[0]
    chat_weak, chat_strong = (place_from_shared(first, f"rmb-helpfulness/{m}") for m in ("weak", "strong"))
    assert chat_strong.ability[0] > chat_weak.ability[0]
    easy, hard = np.zeros((1, 8), np.float32), np.zeros((1, 8), np.float32)
    easy[0, 0], hard[0, 0] = -1.5, 1.5
    q = quality(first, np.vstack([easy, hard]), [weak, strong])
    assert q[0, 0] > q[1, 0] and q[1, 1] > q[1, 0]  # harder prompts fail more; the strong model fails less
