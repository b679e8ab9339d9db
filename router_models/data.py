"""Labelled routing examples from the shared RouteLLM sets and from the package's own JSONL files.

Every example carries the text the classifier sees, the binary target `label` (1 = the micro pool's answer
falls short and the flagship's would do), and per-pool correctness `weak`/`strong` in [0, 1] for the
cost-quality curve. For our own prompts `weak = 1 - label` and `strong = 1`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from router_models.scorer import conversation_text

__all__ = [
    "DEFAULT_ROUTING_DIR",
    "PACKAGE_DATA",
    "Example",
    "data_hash",
    "load_jsonl_examples",
    "load_routing_examples",
]

# The RouteLLM label sets live beside the checkout (../shared/data/routing); CASCADE_ROUTING_DATA overrides.
DEFAULT_ROUTING_DIR = Path(
    os.environ.get("CASCADE_ROUTING_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "routing")
)
PACKAGE_DATA = Path(__file__).parent / "data"
WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG = "gpt-4-1106-preview"
csv.field_size_limit(10_000_000)


@dataclass(frozen=True)
class Example:
    """One labelled prompt. `group` is the MMLU subject or our task kind; `difficulty` 0 when unknown."""

    text: str
    label: int
    weak: float
    strong: float
    source: str
    group: str
    difficulty: int = 0


def _contaminated(folder: Path) -> set[str]:
    path = folder / "contaminated_prompts.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["eval_prompt"].strip() for line in path.read_text().splitlines() if line.strip()}


def _from_csv(path: Path, source: str, group: str, skip: set[str]) -> Iterable[Example]:
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            text = row["prompt"].strip()
            if text in skip:
                continue
            weak, strong = row[WEAK] == "True", row[STRONG] == "True"
            label = int((not weak) and strong)
            yield Example(text, label, float(weak), float(strong), source, group)


def load_routing_examples(root: Path = DEFAULT_ROUTING_DIR) -> list[Example]:
    """MMLU (source 'mmlu', group = subject) and GSM8K ('gsm8k'); contaminated prompts are dropped.

    Label: needs_flagship = (not weak_correct) and strong_correct.
    """
    out: list[Example] = []
    mmlu = root / "routellm-mmlu"
    skip = _contaminated(mmlu)
    for path in sorted((mmlu / "responses").glob("mmlu_*.csv")):
        out.extend(_from_csv(path, "mmlu", path.stem.removeprefix("mmlu_"), skip))
    gsm = root / "routellm-gsm8k"
    out.extend(_from_csv(gsm / "gsm8k_responses.csv", "gsm8k", "math", _contaminated(gsm)))
    return out


def _row_text(row: dict[str, object]) -> str:
    if isinstance(row.get("messages"), list):
        return conversation_text(row["messages"])  # type: ignore[arg-type]
    system = str(row.get("system", "")).strip()
    prompt = str(row.get("prompt", "")).strip()
    return conversation_text([{"role": "system", "content": system}, {"role": "user", "content": prompt}])


def load_jsonl_examples(path: Path, source: str) -> list[Example]:
    """Our own labelled prompts: lines {prompt | messages, label, kind, [difficulty]}."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        label = int(row["label"])
        out.append(
            Example(_row_text(row), label, float(1 - label), 1.0, source, str(row.get("kind", "")),
                    int(row.get("difficulty", 0)))
        )
    return out


def data_hash(examples: Sequence[Example]) -> str:
    """sha256 over (source, text, label) of every example, in order: identifies the training data."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(f"{ex.source}\x00{ex.text}\x00{ex.label}\x01".encode())
    return h.hexdigest()
