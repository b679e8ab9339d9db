"""A fine-tuned encoder against the frozen one, leave-one-source-out over every source, on real outcomes.

The cheaper protocol that makes all seven folds fit on a CPU: only the encoder's top layer is trained
(`training.finetune.finetune_top`; MiniLM's lower layers are frozen and their hidden states computed once
per text for every fold), so a step costs about a seventh of one through the whole encoder. For each
held-out source H, on the rows of every other source with every copy of H's prompts removed (same
`prompt_key`):

- **frozen**: MiniLM's lower 3 layers over 64 word pieces (the shipped embedder before its int8 rounding) +
  structure -> the trainer's ridge + Platt (`trainer.fit_router`: irt-fail centred per source, sources
  balanced, ridge strength chosen by leave-one-source-out inside) on **every** training row, as the shipped
  artifact is built;
- **tuned**: the same encoder whose top layer (and a linear head) is trained on at most `--tune-per-source`
  rows of each training source but one, by weighted MSE on the same target; the one left out (the *inner*
  source: the next source after H in name order; its prompts' copies are kept out of the tuning rows) picks
  the epoch: after each of `--epochs` passes the head's
  APGR on it is measured and the best epoch's weights are kept. Then its vectors + structure -> the same
  ridge on every training row. So only the embedding differs.

Both score H (and the tuned head alone); the table gives APGR (AUC) per held-out source and the mean. The
seed changes the tuning rows, their order, the head's start and dropout; nothing else varies between runs.

    nice -n 10 python -m loadtest.studies.finetune_loso --json finetune-loso.json     # 7 folds, ~45 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.studies.finetune import Encoder, FinetuneConfig, finetune_top, minilm_dir, tuning_target
from loadtest.studies.finetune_scorer import encoder_arguments, figures, routed
from router_models.training.outcomes import Example, load_outcomes


class States:
    """Every text's hidden states below the trained layers, computed once (they never change)."""

    def __init__(self, encoder: Encoder, frozen: int, texts: Sequence[str]) -> None:
        self.texts = list(dict.fromkeys(texts))  # each text once, in first-seen order; `states` aligns
        self.frozen = frozen
        self._index = {t: i for i, t in enumerate(self.texts)}
        self.states = encoder.lower_states(self.texts, frozen)

    def of(self, texts: Sequence[str]) -> list[Any]:
        return [self.states[self._index[t]] for t in texts]

    def vectors(self, encoder: Encoder, texts: Sequence[str]) -> np.ndarray:
        """`encoder`'s vectors of `texts` from the cached states (each unique text once)."""
        unique = list(dict.fromkeys(texts))
        rows = encoder.embed_states(self.of(unique), self.frozen)
        where = {t: i for i, t in enumerate(unique)}
        return rows[[where[t] for t in texts]]


def fold_rows(examples: Sequence[Example], held_out: str, tune_n: int, valid_n: int,
              seed: int) -> tuple[list[Example], list[Example], list[Example], list[Example], str]:
    """(training rows, tuning rows, inner validation rows, held-out rows, inner source) for one fold. No copy of
    a held-out prompt is in the training rows, and none of a validation prompt in the tuning rows (sources share
    prompts: every routellm-gsm8k prompt is in zeroeval, half of mmlu-pro's are in routellm-mmlu)."""
    test = [ex for ex in examples if ex.source == held_out]
    keys = {ex.key for ex in test}
    train = [ex for ex in examples if ex.source != held_out and ex.key not in keys]
    names = sorted({ex.source for ex in examples})
    inner = names[(names.index(held_out) + 1) % len(names)]
    rng = np.random.default_rng(seed)
    valid = [ex for ex in train if ex.source == inner]
    valid = [valid[i] for i in rng.permutation(len(valid))][:valid_n]
    valid_keys = {ex.key for ex in valid}
    tune: list[Example] = []
    for source in sorted({ex.source for ex in train} - {inner}):
        rows = [ex for ex in train if ex.source == source and ex.key not in valid_keys]
        tune.extend(rows[i] for i in rng.permutation(len(rows))[:tune_n])
    return train, tune, valid, test, inner


def run_fold(args: argparse.Namespace, examples: Sequence[Example], held_out: str, states: States,
             frozen_vectors: dict[str, np.ndarray]) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    train, tune, valid, test, inner = fold_rows(examples, held_out, args.tune_per_source, args.valid_rows, args.seed)
    row: dict[str, Any] = {"held_out": held_out, "n": len(test), "train_rows": len(train), "tune_rows": len(tune),
                           "inner": inner, "valid_rows": len(valid)}

    def vecs(table: dict[str, np.ndarray], rows: Sequence[Example]) -> np.ndarray:
        return np.stack([table[ex.text] for ex in rows])

    row["frozen"] = routed(vecs(frozen_vectors, train), train, vecs(frozen_vectors, test), test)
    encoder = Encoder(minilm_dir(), args.layers, args.max_tokens)
    valid_states = states.of([ex.text for ex in valid])

    def validate(head: Any) -> float:
        with torch.inference_mode():
            pred = head(torch.as_tensor(encoder.embed_states(valid_states, states.frozen))).squeeze(1).numpy()
        return figures(pred, valid)["apgr"]

    def progress(step: int, steps: int, loss: float) -> None:
        if step % 200 == 0 or step == steps:
            print(f"  [{held_out}] step {step}/{steps} loss {loss:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)

    y, w = tuning_target(tune)
    cfg = FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    tuning = finetune_top(encoder, states.of([ex.text for ex in tune]), states.frozen, y, w, cfg, progress, validate)
    texts = [ex.text for ex in train] + [ex.text for ex in test]
    tuned = states.vectors(encoder, texts)
    row["tuned"] = routed(tuned[: len(train)], train, tuned[len(train) :], test)
    row["tuned_head"] = figures(tuned[len(train) :] @ tuning.head_weights + tuning.head_bias, test)
    row["inner_apgr_by_epoch"], row["best_epoch"] = tuning.epoch_scores, tuning.best_epoch
    row["steps"] = len(tuning.losses)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    cols = ("frozen", "tuned", "tuned_head")
    print(f"\n{'held-out source':<20}{'n':>6}" + "".join(f"{c:>18}" for c in cols)
          + f"{'tuned - frozen':>16}{'epoch':>7}")
    for r in rows:
        cells = "".join(f"{r[c]['apgr']:>9.3f} ({r[c]['auc']:.3f})" for c in cols)
        print(f"{r['held_out']:<20}{r['n']:>6}{cells}{r['tuned']['apgr'] - r['frozen']['apgr']:>+16.3f}"
              f"{r['best_epoch']:>7}")
    means = "".join(f"{np.mean([r[c]['apgr'] for r in rows]):>18.3f}" for c in cols)
    print(f"{'mean APGR':<26}{means}")
    print("cells: APGR (AUC) on the held-out source; random routing 0.500 (0.500)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    encoder_arguments(p)
    p.add_argument("--held-out", default="", help="sources held out, one fold each (default: every source)")
    p.add_argument("--tune-per-source", type=int, default=3000, help="top-layer tuning rows per training source")
    p.add_argument("--valid-rows", type=int, default=2000, help="rows of the inner source that pick the epoch")
    p.add_argument("--trained-layers", type=int, default=1, help="upper layers trained (the rest are frozen)")
    p.add_argument("--epochs", type=int, default=3, help="passes over the tuning rows (the best one is kept)")
    p.add_argument("--json", type=Path, default=None, help="write the results here (rewritten after each fold)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    examples = load_outcomes(args.routing_dir, max_per_source=args.max_per_source)
    held = [s for s in args.held_out.split(",") if s] or sorted({ex.source for ex in examples})
    texts = [ex.text for ex in examples]
    base = Encoder(minilm_dir(), args.layers, args.max_tokens)
    states = States(base, args.layers - args.trained_layers, texts)
    frozen_vectors = dict(zip(states.texts, base.embed_states(states.states, states.frozen), strict=True))
    print(f"{len(examples)} prompts, {len(frozen_vectors)} texts; lower states and frozen vectors in "
          f"{time.perf_counter() - started:.0f} s; held out in turn: {', '.join(held)}", flush=True)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "encoder": base.name, "folds": []}
    for source in held:
        result["folds"].append(run_fold(args, examples, source, states, frozen_vectors))
        print(json.dumps(result["folds"][-1]), flush=True)
        result["seconds"] = round(time.perf_counter() - started, 1)
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    if result["folds"]:
        print_table(result["folds"])
    return result


if __name__ == "__main__":
    main()
