"""Own label rows against the public data: which wins, by how many labels, in each mode.

The rows are synthetic (they test the code, never the router's quality): two public sources whose event
rises with feature 0, and a user's labels whose event falls with it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from router_models.serving.classifier import LinearRouter
from router_models.training.outcomes import Example
from router_models.training.own_labels import fit_correction, is_own, own_share
from router_models.training.trainer import TrainConfig, fit_router, source_weights

CFG = TrainConfig(target="pairwise")


def _rows(source: str, n: int, sign: float, seed: int) -> tuple[npt.NDArray[np.float32], list[Example]]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    event = 1.0 / (1.0 + np.exp(-3.0 * sign * x[:, 0]))
    rows = [Example(f"{source} prompt {seed} {i}", source, "g", float(1.0 - e), 1.0, f"{source}{seed}k{i}")
            for i, e in enumerate(event)]
    return x, rows


def _train(n_own: int, cfg: TrainConfig) -> LinearRouter:
    parts = [_rows("routellm-mmlu", 600, 1.0, 1), _rows("routellm-gsm8k", 600, 1.0, 2),
             _rows("labels:mine", n_own, -1.0, 3)]
    x = np.vstack([p[0] for p in parts])
    return fit_router(x, [ex for p in parts for ex in p[1]], cfg).router


def _slope(router: LinearRouter) -> float:
    """The router's logit per unit of feature 0 (the feature the two sides disagree on): its ranking's direction."""
    return float(router.weights[0])


def test_only_user_sources_are_own() -> None:
    assert is_own("labels:mine") and is_own("labels:ledger")
    assert not is_own("routellm-mmlu") and not is_own("rmb-helpfulness")


def test_share_mode_gives_own_rows_n_over_n_plus_k_of_the_weight() -> None:
    public = _rows("routellm-mmlu", 300, 1.0, 1)[1] + _rows("routellm-gsm8k", 100, 1.0, 2)[1]
    own = _rows("labels:mine", 50, -1.0, 3)[1]
    w = source_weights(public + own, own_k=150.0)
    assert w[400:].sum() / w.sum() == pytest.approx(own_share(50, 150.0)) == pytest.approx(0.25)
    assert w[:300].sum() == pytest.approx(w[300:400].sum())  # the public sources still share equally
    equal = source_weights(public + own)
    assert equal[400:].sum() == pytest.approx(equal[:300].sum())  # equal mode: one source among three


# the correction's penalty does not grow with the labels: against a contradiction this steep (the public model's
# logit moves by about 3 per unit of feature 0) it takes tens of thousands of labels to turn the ranking round
@pytest.mark.parametrize(("mode", "many"), [("share", 4000), ("correction", 60000)])
def test_many_contradicting_own_labels_win_and_few_do_not(mode: str, many: int) -> None:
    cfg = replace(CFG, own_labels=mode)
    assert _slope(_train(0, cfg)) > 0  # the public data's direction
    assert _slope(_train(20, cfg)) > 0  # 20 labels do not overturn 1,200 public rows
    assert _slope(_train(many, cfg)) < 0  # many of the user's own do


def test_the_default_mode_is_the_correction_and_its_pull_grows_with_the_labels() -> None:
    assert CFG.own_labels == "correction"
    slopes = [_slope(_train(n, CFG)) for n in (0, 300, 3000, 60000)]
    assert slopes == sorted(slopes, reverse=True) and slopes[-1] < 0


def test_correction_with_a_huge_penalty_keeps_the_public_ranking() -> None:
    x, rows = _rows("labels:mine", 300, -1.0, 4)
    public = LinearRouter(weights=np.asarray([1.0, 0, 0, 0, 0, 0], dtype=np.float32), bias=0.0)
    kept = fit_correction(public, x, rows, penalty=1e9).router
    assert kept.weights == pytest.approx(public.weights, abs=1e-5)
    assert fit_correction(public, x, rows, penalty=1.0).router.weights[0] < 0


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="own-label mode"):
        TrainConfig(own_labels="loudest")


def test_the_memory_mode_keeps_its_labels_beside_the_public_router_unchanged() -> None:
    """The memory mode refits nothing: the router is the public one, and the own rows are kept as a label memory
    (with the parameters it was given) that moves its scores."""
    parts = [_rows("routellm-mmlu", 600, 1.0, 1), _rows("routellm-gsm8k", 600, 1.0, 2)]
    x, own = _rows("labels:mine", 200, -1.0, 3)
    public_rows = np.vstack([p[0] for p in parts])
    public_examples = [ex for p in parts for ex in p[1]]
    public = fit_router(public_rows, public_examples, CFG)
    fitted = fit_router(np.vstack([public_rows, x]), public_examples + own, replace(CFG, own_labels="memory"))
    assert fitted.memory is not None and len(fitted.memory) == len(own)
    assert fitted.own["memory"]["neighbours"] == fitted.memory.params.neighbours
    assert fitted.own["memory"]["slope"] is fitted.memory.params.slope
    np.testing.assert_array_equal(fitted.router.weights, public.router.weights)
    unmoved = fitted.router.predict_proba(x)
    moved = fitted.predictor().predict_proba(x)
    assert moved.shape == unmoved.shape and not np.allclose(moved, unmoved)
