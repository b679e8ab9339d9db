"""Real per-prompt outcomes of real models, read from the shared routing data (`../shared/data/routing`).

Seven sources, each a folder with its own SOURCE.md (origin, licence, fields). Six are exam-style (multiple
choice, math, code): for every prompt we keep the text a user would send, and each model's correctness (1, 0,
or nan where the model gave no output). One is chat (`rmb-helpfulness`: real user requests of twelve kinds)
with judged *preferences* instead: its per-model value is the model's within-prompt win rate, and its judged
pairs (`Example.pairs`) feed a pairwise fit (`preferences.py`). Every source names its *micro-class* models
(7-9B dense, what the micro pool serves) and its *frontier-class* models (what the flagship serves); `weak`
and `strong` are their mean correctness (win rate) on the prompt. Nothing here is labelled by hand: the
outcomes are the sources' own grading of real model outputs. `DEFAULT_SOURCES` are those trained on by
default (`cascade router train --sources` picks others); `SourceSpec.kind` says exam or chat.

The routing event is "the micro pool's answer falls short of the flagship's". For one (micro, frontier) pair
that is `micro wrong and frontier right`; averaged over every pair of the two classes it is
`target = (1 - weak) * strong`, a probability in [0, 1]. Binary metrics (AUC) use `label = target >= 0.5`.

Each example carries its conversation's shape (`Example.shape`, `router_models.serving.scorer.ConversationShape`):
the chat source's multi-turn rows from their messages, every other prompt one user turn of its whole text.

Prompts that recur across sources (MMLU stems in MMLU-Pro, GSM8K in ZeroEval and LLMRouter) share a `key`,
so a leave-one-source-out split can keep every copy of a held-out prompt out of training.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from router_models.serving.scorer import ConversationShape, prompt_shape, read_conversation

__all__ = [
    "DEFAULT_ROUTING_DIR",
    "DEFAULT_SOURCES",
    "SOURCES",
    "Example",
    "SourceSpec",
    "data_hash",
    "load_outcomes",
    "prompt_key",
]

DEFAULT_ROUTING_DIR = Path(
    os.environ.get("CASCADE_ROUTING_DATA", Path(__file__).resolve().parents[3] / "shared" / "data" / "routing")
)
MAX_CHARS = 2000  # what `conversation_text` keeps of a prompt at serving time
csv.field_size_limit(10_000_000)
_NAN = float("nan")
_Pairs = tuple[tuple[str, str], ...]  # judged (winner, loser) model names, preference sources only
# (text, group, {model: 1, 0 or nan}, pairs, the conversation's shape: None for a plain prompt)
_Rows = Iterator[tuple[str, str, dict[str, float], _Pairs, ConversationShape | None]]


@dataclass(frozen=True)
class Example:
    """One prompt with real outcomes. `models` and `outcomes` align (nan = no output from that model). `shape`:
    the conversation's (None: `text` is a plain prompt, `prompt_shape(text)`)."""

    text: str
    source: str
    group: str
    weak: float
    strong: float
    key: str
    models: tuple[str, ...] = field(repr=False, default=())
    outcomes: tuple[float, ...] = field(repr=False, default=())
    pairs: tuple[tuple[int, int], ...] = field(repr=False, default=())  # (winner, loser) indices into models
    shape: ConversationShape | None = field(repr=False, default=None)

    @property
    def target(self) -> float:
        """P(a micro-class model is wrong and a frontier-class model right) on this prompt."""
        return (1.0 - self.weak) * self.strong

    @property
    def label(self) -> int:
        return int(self.target >= 0.5)


@dataclass(frozen=True)
class SourceSpec:
    """A source folder: its micro-class and frontier-class models and how to read its rows."""

    name: str
    weak_models: tuple[str, ...]
    strong_models: tuple[str, ...]
    rows: Callable[[Path], _Rows]  # (text, group, {model: 0/1/nan}, judged pairs, shape or None)
    kind: str = "exam"  # "exam" (graded correctness) or "chat" (judged preferences, pairwise fit)


def prompt_key(text: str) -> str:
    """Identity of a question across sources: its first line, lower-cased letters and digits, 120 chars."""
    first = text.strip().split("\n", 1)[0]
    return re.sub(r"[^a-z0-9]+", "", first.lower())[:120]


def _num(value: Any) -> float:
    if value is None or value in ("", "None", "null"):
        return _NAN
    if isinstance(value, str) and value in ("True", "False"):
        return 1.0 if value == "True" else 0.0
    number = float(value)
    return number if math.isfinite(number) else _NAN


def _jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _model_columns(row: Mapping[str, Any], skip: Iterable[str]) -> dict[str, float]:
    ignored = set(skip)
    return {k: _num(v) for k, v in row.items() if k not in ignored}


def _routellm(folder: str, pattern: str) -> Callable[[Path], _Rows]:
    def rows(root: Path) -> _Rows:
        base = root / folder
        contaminated = base / "contaminated_prompts.jsonl"
        skip = {json.loads(line)["eval_prompt"].strip() for line in contaminated.read_text().splitlines()
                if line.strip()} if contaminated.exists() else set()
        for path in sorted(base.glob(pattern)):
            group = path.stem.removeprefix("mmlu_").removesuffix("_responses")
            with path.open(newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    text = row["prompt"].strip()
                    if text not in skip:
                        models = {k: _num(v) for k, v in row.items() if v in ("True", "False")}
                        yield text, group, models, (), None
    return rows


def _routerbench(root: Path) -> _Rows:
    for path in sorted((root / "routerbench-train").glob("*_train.csv.gz")):
        with gzip.open(path, "rt", newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                parts = _python_list_text(row["prompt"])
                text = parts.strip().rsplit("\n\n", 1)[-1].strip()  # the question after the few-shot examples
                models = {k: _num(v) for k, v in row.items() if "|" not in k and v in ("0", "1", "0.0", "1.0")}
                yield text, path.name.split("_train")[0], models, (), None


def _python_list_text(value: str) -> str:
    """RouterBench stores prompts as a Python list literal of strings; join its items."""
    import ast

    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    return "\n\n".join(str(p) for p in parsed) if isinstance(parsed, list) else str(parsed)


def _with_all_models(folder: str, main: str, everyone: str) -> Callable[[Path], _Rows]:
    def rows(root: Path) -> _Rows:
        base = root / folder
        extra = {r["id"]: _model_columns(r, ("id",)) for r in _jsonl_gz(base / everyone)} \
            if (base / everyone).exists() else {}
        meta = ("id", "prompt", "source", "overlap", "reference_answer", "answer", "orig_src")
        for r in _jsonl_gz(base / main):
            models = {**_model_columns(r, meta), **extra.get(r["id"], {})}
            yield str(r["prompt"]).strip(), str(r["source"]).split("/", 1)[-1], models, (), None
    return rows


def _dcrouter(root: Path) -> _Rows:
    meta = ("id", "prompt", "source", "llmrouter_split", "metric", "ground_truth", "overlap")
    for r in _jsonl_gz(root / "llmrouter-dcrouter" / "llmrouter-dcrouter.jsonl.gz"):
        # CommonGen coverage is continuous; every other task is 0/1. Scores >= 0.5 count as correct.
        models = {k: (_NAN if math.isnan(v) else float(v >= 0.5)) for k, v in _model_columns(r, meta).items()}
        yield str(r["prompt"]).strip(), str(r["source"]).split("/", 1)[-1], models, (), None


def _rmb(root: Path) -> _Rows:
    """RMB helpfulness: the text and shape as the gateway scores the conversation (multi-turn rows: the last user
    turn first, `conversation_text`, and `conversation_shape`), the scenario group (`Helpfulness/<group>/...`),
    win rates and judged pairs."""
    for r in _jsonl_gz(root / "rmb-helpfulness" / "rmb-helpfulness.jsonl.gz"):
        messages = r.get("messages")
        text, shape = read_conversation(messages, MAX_CHARS) if messages else (str(r["prompt"]), None)
        scores = {str(k): _num(v) for k, v in r["scores"].items()}
        pairs = tuple((str(a), str(b)) for a, b in r["pairs"])
        yield text.strip(), str(r["category"]).split("/")[1], scores, pairs, shape


_MIXTRAL, _GPT4 = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec("routellm-mmlu", (_MIXTRAL,), (_GPT4,), _routellm("routellm-mmlu", "responses/mmlu_*.csv")),
    SourceSpec("routellm-gsm8k", (_MIXTRAL,), (_GPT4,), _routellm("routellm-gsm8k", "gsm8k_responses.csv")),
    SourceSpec("routerbench", ("mistralai/mistral-7b-chat",), ("gpt-4-1106-preview", "claude-v2"), _routerbench),
    SourceSpec(
        "zeroeval",
        ("Meta-Llama-3.1-8B-Instruct", "Qwen2-7B-Instruct", "Qwen2.5-7B-Instruct", "gemma-2-9b-it"),
        ("gpt-4o-2024-08-06", "claude-3-5-sonnet-20241022"),
        _with_all_models("zeroeval", "zeroeval.jsonl.gz", "zeroeval-all-models.jsonl.gz"),
    ),
    SourceSpec(
        "mmlu-pro",
        ("Meta-Llama-3_1-8B-Instruct", "Mistral-7B-Instruct-v0.2", "Qwen1.5-7B-Chat", "gemma-7b"),
        ("gemini-1.5-pro-002", "DeepSeek-Coder-V2"),
        _with_all_models("mmlu-pro", "mmlu-pro.jsonl.gz", "mmlu-pro-all-models.jsonl.gz"),
    ),
    SourceSpec(
        "llmrouter-dcrouter",
        ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "mistral-7b-instruct-v0.3", "gemma-2-9b-it"),
        ("llama-3.3-nemotron-super-49b-v1", "llama-3.1-nemotron-51b-instruct"),  # its strongest: no frontier model
        _dcrouter,
    ),
    SourceSpec(
        "rmb-helpfulness",
        ("Llama-2-7b-chat-hf", "Mistral-7B-Instruct-v0.1", "vicuna-7b-v1.5"),
        ("claude-3-5-sonnet-20240620", "claude-3-opus-20240229", "gemini-1.5-pro-exp-0801"),  # not gpt-4o-mini
        _rmb,
        kind="chat",
    ),
)
# all seven: with the chat source in training the exam sources' leave-one-source-out APGR did not drop (MODEL_CARD.md)
DEFAULT_SOURCES: tuple[str, ...] = tuple(s.name for s in SOURCES)


def _mean(models: Mapping[str, float], names: Sequence[str]) -> float:
    values = [models[n] for n in names if n in models and not math.isnan(models[n])]
    return sum(values) / len(values) if values else _NAN


_READ: dict[tuple[str, Path], tuple[tuple[tuple[str, int, int], ...], tuple[Example, ...]]] = {}
"""Each source's examples as last read in this process, with the files' (path, size, mtime) they were read from:
the tests and benchmarks read the same files many times in one process (about 8 s of CPU for all seven)."""


def _files_of(root: Path) -> tuple[tuple[str, int, int], ...]:
    found = []
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            st = os.stat(os.path.join(folder, name))
            found.append((os.path.join(folder, name), st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


def _examples(spec: SourceSpec, root: Path) -> list[Example]:
    """The source's usable examples, read again only when a file under `root` changed (examples are frozen)."""
    key, files = (spec.name, root.resolve()), _files_of(root)
    if (kept := _READ.get(key)) is None or kept[0] != files:
        _READ[key] = kept = (files, tuple(_read_examples(spec, root)))
    return list(kept[1])


def _read_examples(spec: SourceSpec, root: Path) -> list[Example]:
    raw = list(spec.rows(root))
    names = tuple(sorted({m for _, _, models, pairs, _ in raw for m in [*models, *(n for p in pairs for n in p)]}))
    index = {n: i for i, n in enumerate(names)}
    out: list[Example] = []
    seen: set[str] = set()
    for text, group, models, pairs, shape in raw:
        weak, strong = _mean(models, spec.weak_models), _mean(models, spec.strong_models)
        if not text or math.isnan(weak) or math.isnan(strong) or text in seen:
            continue
        seen.add(text)
        out.append(Example(text[:MAX_CHARS], spec.name, group, weak, strong, prompt_key(text), names,
                           tuple(models.get(n, _NAN) for n in names),
                           tuple((index[a], index[b]) for a, b in pairs), shape or prompt_shape(text)))
    return out


def load_outcomes(root: Path = DEFAULT_ROUTING_DIR, sources: Sequence[str] | None = None,
                  max_per_source: int | None = None) -> list[Example]:
    """Every usable prompt of the named sources (default: `DEFAULT_SOURCES`), in a fixed order; with `max_per_source`,
    an evenly spaced subset of at most that many per source (quick runs and tests; deterministic).

    A prompt is dropped when its source's micro- or frontier-class models all lack an outcome for it, or when
    it repeats a prompt of the same source. Raises FileNotFoundError (naming the folder) when data is missing.
    """
    if not root.is_dir():
        raise FileNotFoundError(f"routing data folder {root} not found; set CASCADE_ROUTING_DATA or --routing-dir")
    wanted = set(sources) if sources is not None else set(DEFAULT_SOURCES)
    unknown = wanted - {s.name for s in SOURCES}
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; known: {[s.name for s in SOURCES]}")
    out: list[Example] = []
    for spec in SOURCES:
        if spec.name in wanted:
            rows = _examples(spec, root)
            if max_per_source is not None and len(rows) > max_per_source:
                rows = [rows[i] for i in np.linspace(0, len(rows) - 1, max_per_source).round().astype(int)]
            out.extend(rows)
    return out


def data_hash(examples: Sequence[Example]) -> str:
    """sha256 over (source, text, weak, strong, shape) of every example, in order: identifies the training data."""
    h = hashlib.sha256()
    for ex in examples:
        shape = ex.shape or prompt_shape(ex.text)
        h.update(f"{ex.source}\x00{ex.text}\x00{ex.weak:.6f}\x00{ex.strong:.6f}\x00{shape}\x01".encode())
    return h.hexdigest()
