"""Per-call cost of each model the pool-map harness (`pool_map_eval`) routes between, per held-out source.

- `routerbench`: the source's own real per-call cost (`<model>|total_cost`, USD, as RouterBench measured it).
- every other source: an estimate, price (USD per million tokens, input and output) times tokens: prompt tokens
  ~ characters / 4 of the prompt as the router reads it (at most 2,000 characters, `outcomes.MAX_CHARS`), completion
  tokens a fixed figure per source (`COMPLETION_TOKENS`: these sources keep no answer lengths; chain-of-thought
  math and MMLU-Pro answers run to a few hundred tokens). Same completion length for every model of a source, so
  the cost ratios between models are their price ratios.

Prices (`PRICES`), list prices per million tokens as published by the providers in late 2024, recalled here and
not fetched from this machine (it has no network): check them before reusing these figures.
- OpenAI, openai.com/api/pricing: gpt-4o-2024-08-06 $2.50 in / $10.00 out.
- Google, ai.google.dev/pricing: gemini-1.5-pro-002 $1.25 / $5.00 (prompts up to 128k tokens, from October 2024).
- Together AI, together.ai/pricing (Llama 3.1 Instruct Turbo): 8B $0.18 / $0.18, 70B $0.88 / $0.88.
- llmrouter-dcrouter's models (Qwen2.5-7B, the Nemotron 49B/51B) by size class at those Together prices: 7-9B
  $0.18, 49-70B $0.88 in and out (no provider lists the Nemotrons at a price we could cite).
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import numpy.typing as npt

from router_models.training.outcomes import MAX_CHARS, Example, _python_list_text

__all__ = ["COMPLETION_TOKENS", "MODELS", "PRICES", "cost_matrix"]

MODELS: dict[str, tuple[str, str, str]] = {
    # held-out source: (7B-class, middle, frontier), as named in the source
    "routerbench": ("mistralai/mistral-7b-chat", "mistralai/mixtral-8x7b-chat", "gpt-4-1106-preview"),
    "zeroeval": ("Meta-Llama-3.1-8B-Instruct", "Meta-Llama-3.1-70B-Instruct", "gpt-4o-2024-08-06"),
    "mmlu-pro": ("Meta-Llama-3_1-8B-Instruct", "Meta-Llama-3_1-70B-Instruct", "gemini-1.5-pro-002"),
    "llmrouter-dcrouter": ("qwen2.5-7b-instruct", "llama-3.3-nemotron-super-49b-v1", "llama-3.1-nemotron-51b-instruct"),
}
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-2024-08-06": (2.50, 10.00),
    "gemini-1.5-pro-002": (1.25, 5.00),
    "Meta-Llama-3.1-8B-Instruct": (0.18, 0.18), "Meta-Llama-3_1-8B-Instruct": (0.18, 0.18),
    "Meta-Llama-3.1-70B-Instruct": (0.88, 0.88), "Meta-Llama-3_1-70B-Instruct": (0.88, 0.88),
    "qwen2.5-7b-instruct": (0.18, 0.18),
    "llama-3.3-nemotron-super-49b-v1": (0.88, 0.88), "llama-3.1-nemotron-51b-instruct": (0.88, 0.88),
}
COMPLETION_TOKENS = {"zeroeval": 400, "mmlu-pro": 300, "llmrouter-dcrouter": 200}


def _routerbench_costs(root: Path) -> dict[str, dict[str, float]]:
    """{prompt as `outcomes` reads it: {model: USD of that call}} from RouterBench's own cost columns."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((root / "routerbench-train").glob("*_train.csv.gz")):
        with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                text = _python_list_text(row["prompt"]).strip().rsplit("\n\n", 1)[-1].strip()[:MAX_CHARS]
                out.setdefault(text, {k.split("|")[0]: float(v) for k, v in row.items()
                                      if k.endswith("|total_cost") and v not in ("", "None")})
    return out


def cost_matrix(source: str, examples: list[Example], root: Path) -> tuple[npt.NDArray[np.float64], str]:
    """(n, 3) USD per call of the source's three `MODELS` on each example, and how it was obtained."""
    models = MODELS[source]
    if source == "routerbench":
        table = _routerbench_costs(root)
        costs = np.asarray([[table.get(ex.text, {}).get(m, np.nan) for m in models] for ex in examples])
        return costs, "real per-call cost (RouterBench's total_cost)"
    completion = COMPLETION_TOKENS[source]
    prompt = np.asarray([len(ex.text) / 4.0 for ex in examples])
    prices = np.asarray([PRICES[m] for m in models])  # (3, 2)
    costs = (prompt[:, None] * prices[None, :, 0] + completion * prices[None, :, 1]) / 1e6
    return costs, f"list price x tokens (prompt chars/4, {completion} completion tokens)"
