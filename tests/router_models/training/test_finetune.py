"""Fine-tuning the encoder: the target is centred per source at unit spread with sources balanced, and a few
steps change the encoder's vectors, reproducibly for a seed. Texts and targets here are written for the test:
they show that training runs, never that it helps (the benchmark measures that on real outcomes)."""

from __future__ import annotations

import numpy as np

from router_models.training.finetune import Encoder, FinetuneConfig, finetune, minilm_dir, tuning_target
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
