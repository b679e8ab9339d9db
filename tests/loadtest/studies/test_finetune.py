"""Fine-tuning the encoder: the target is centred per source at unit spread with sources balanced, and a few
steps change the encoder's vectors, reproducibly for a seed. Texts and targets here are written for the test:
they show that training runs, never that it helps (the benchmark measures that on real outcomes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from loadtest.studies.finetune import (
    Encoder,
    FinetuneConfig,
    Tuning,
    finetune,
    finetune_top,
    minilm_dir,
    tuning_target,
)
from router_models.training.outcomes import Example

TEXTS = [f"Question {i}: what is {i} times {i + 3}?" if i % 2 else f"hello number {i}, how are you" for i in range(12)]


def test_tuning_target_is_centred_per_source_and_balanced() -> None:
    rows = [Example(f"a{i}", "own-a", "g", 0.2 * (i % 4), 1.0, f"a{i}") for i in range(8)]
    rows += [Example(f"b{i}", "own-b", "g", 0.0, 0.1 * i, f"b{i}") for i in range(4)]
    y, w = tuning_target(rows)
    assert abs(y[:8].mean()) < 1e-9 and abs(y[8:].mean()) < 1e-9
    assert abs(y.std() - 1.0) < 1e-9
    assert np.isclose(w[:8].sum(), w[8:].sum()) and np.isclose(w.mean(), 1.0)


def _tuned(seed: int) -> tuple[Encoder, list[float]]:
    import torch

    torch.set_num_threads(1)
    encoder = Encoder(minilm_dir(), layers=1, max_tokens=16)
    y = np.asarray([1.0 if i % 2 else -1.0 for i in range(len(TEXTS))])
    tuning = finetune(encoder, TEXTS, y, np.ones(len(TEXTS)), FinetuneConfig(batch_size=4, lr=1e-3, seed=seed))
    assert tuning.head_weights.shape == (encoder.dim,)
    return encoder, tuning.losses


def test_finetuning_moves_the_vectors_reproducibly() -> None:
    frozen = Encoder(minilm_dir(), layers=1, max_tokens=16).embed(TEXTS)
    assert np.allclose(np.linalg.norm(frozen, axis=1), 1.0, atol=1e-5)
    encoder, losses = _tuned(seed=0)
    assert len(losses) == 3  # one pass over 12 rows, 4 a step
    tuned = encoder.embed(TEXTS)
    assert np.abs(tuned - frozen).max() > 1e-3
    again, again_losses = _tuned(seed=0)
    assert again_losses == losses and np.allclose(again.embed(TEXTS), tuned, atol=1e-6)


def test_upper_layers_from_lower_states_equal_the_whole_encoder() -> None:
    encoder = Encoder(minilm_dir(), layers=3, max_tokens=16)
    whole = encoder.embed(TEXTS)
    for frozen in (0, 2, 3):
        states = encoder.lower_states(TEXTS, frozen)
        assert all(s.shape[1] == encoder.dim and len(s) <= 16 for s in states)
        assert np.allclose(encoder.embed_states(states, frozen), whole, atol=2e-3)  # fp16 states


def _top_tuned(seed: int, epochs: int = 1,
               validate: Callable[[Any], float] | None = None) -> tuple[Encoder, list[Any], Tuning]:
    import torch

    torch.set_num_threads(1)
    encoder = Encoder(minilm_dir(), layers=2, max_tokens=16)
    states = encoder.lower_states(TEXTS, 1)
    y = np.asarray([1.0 if i % 2 else -1.0 for i in range(len(TEXTS))])
    cfg = FinetuneConfig(epochs=epochs, batch_size=4, lr=1e-3, seed=seed)
    tuning = finetune_top(encoder, states, 1, y, np.ones(len(TEXTS)), cfg, validate=validate)
    return encoder, states, tuning


def test_top_layer_tuning_moves_only_the_upper_layers_reproducibly() -> None:
    frozen_encoder = Encoder(minilm_dir(), layers=2, max_tokens=16)
    before = [p.detach().clone() for p in frozen_encoder.model.parameters()]
    encoder, _, tuning = _top_tuned(seed=0)
    lower = {n for n, _ in encoder.model.named_parameters() if not n.startswith("encoder.layer.1.")}
    moved = {n for (n, p), b in zip(encoder.model.named_parameters(), before, strict=True)
             if not np.allclose(p.detach().numpy(), b.numpy())}
    assert moved and not moved & lower  # the embeddings and layer 0 are untouched
    assert np.abs(encoder.embed(TEXTS) - frozen_encoder.embed(TEXTS)).max() > 1e-3
    _, _, again = _top_tuned(seed=0)
    assert again.losses == tuning.losses


@pytest.mark.slow
def test_validation_keeps_the_best_epochs_weights() -> None:
    calls: list[int] = []

    def validate(head: Any) -> float:
        calls.append(1)
        return [0.3, 0.9, 0.1][len(calls) - 1]  # the second epoch scores best

    encoder, states, tuning = _top_tuned(seed=0, epochs=3, validate=validate)
    assert tuning.epoch_scores == [0.3, 0.9, 0.1] and tuning.best_epoch == 2
    _, _, two = _top_tuned(seed=0, epochs=2)  # the same seed and order, stopped after the second epoch
    assert np.allclose(tuning.head_weights, two.head_weights, atol=1e-6)
    assert np.allclose(encoder.embed_states(states, 1),
                       _top_tuned(seed=0, epochs=2)[0].embed_states(states, 1), atol=1e-5)
