"""The pairwise fit recovers abilities and per-prompt discriminations it simulated, and turns them into the
routing event: prompts where ability decides more score higher."""

from __future__ import annotations

import numpy as np

from router_models.training.preferences import fit_pairwise, p_preferred


def _simulate(seed: int, items: int = 3000, models: int = 10, pairs_per_item: int = 8) -> tuple[
        list[int], list[int], list[int], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ability = np.linspace(-1.5, 1.5, models)
    disc = rng.uniform(-0.5, 2.5, items)
    item, winner, loser = [], [], []
    for i in range(items):
        for _ in range(pairs_per_item):
            a, b = rng.choice(models, size=2, replace=False)
            a_wins = rng.random() < 1.0 / (1.0 + np.exp(-disc[i] * (ability[a] - ability[b])))
            item.append(i)
            winner.append(int(a if a_wins else b))
            loser.append(int(b if a_wins else a))
    return item, winner, loser, ability, disc


def test_recovers_simulated_abilities_and_discriminations() -> None:
    item, winner, loser, ability, disc = _simulate(0)
    fit = fit_pairwise(len(disc), len(ability), item, winner, loser)
    assert np.corrcoef(fit.ability, ability)[0, 1] > 0.99
    assert np.corrcoef(fit.discrimination, disc)[0, 1] > 0.5  # 8 pairs a prompt: noisy, but it is there
    assert fit.iterations < 1000


def test_the_routing_event_follows_the_discrimination() -> None:
    item, winner, loser, ability, disc = _simulate(1)
    fit = fit_pairwise(len(disc), len(ability), item, winner, loser)
    event = p_preferred(fit, strong=[8, 9], weak=[0, 1])
    assert event.shape == (len(disc),) and ((event > 0) & (event < 1)).all()
    decisive, level = disc > 1.5, disc < 0.0
    assert event[decisive].mean() > 0.8 > 0.5 > event[level].mean()  # weak models keep up where s is low


def test_a_prompt_or_model_without_pairs_stays_at_its_prior() -> None:
    fit = fit_pairwise(3, 3, item=[0, 0], winner=[0, 0], loser=[1, 1])
    assert fit.discrimination[1] == fit.discrimination[2] == 1.0 and fit.ability[2] == 0.0
    assert fit.ability[0] > 0 > fit.ability[1]


def test_deterministic() -> None:
    item, winner, loser, ability, disc = _simulate(2, items=300)
    first = fit_pairwise(len(disc), len(ability), item, winner, loser)
    again = fit_pairwise(len(disc), len(ability), item, winner, loser)
    assert np.array_equal(first.ability, again.ability) and np.array_equal(first.discrimination,
                                                                            again.discrimination)
