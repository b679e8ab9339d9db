"""`python -m router_models.datagen`: rewrite the shipped labelled prompt sets (deterministic)."""

from __future__ import annotations

import random
from pathlib import Path

from router_models.datagen.common import write_jsonl
from router_models.datagen.eval_prompts import eval_examples
from router_models.datagen.train_confounders import confounder_examples
from router_models.datagen.train_heavy import heavy_examples
from router_models.datagen.train_light import light_examples

DATA = Path(__file__).resolve().parent.parent / "data"


def main() -> None:
    """Write data/labelled_prompts.jsonl (training) and data/mixed_eval.jsonl (held out, never trained on)."""
    rng = random.Random(20240601)
    train = light_examples(rng) + heavy_examples(rng) + confounder_examples(rng)
    n_train = write_jsonl(train, DATA / "labelled_prompts.jsonl")
    n_eval = write_jsonl(eval_examples(random.Random(7)), DATA / "mixed_eval.jsonl")
    print(f"wrote {n_train} training and {n_eval} held-out examples to {DATA}")


if __name__ == "__main__":
    main()
