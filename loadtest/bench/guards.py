"""What the input guards cost per request, and how often they fire, on real prompts nobody here wrote.

Each prompt of the public sets in `../shared/data/routing` (MMLU-Pro, ZeroEval, LLMRouter/DC-Router: exam-style;
RMB helpfulness: real users' chat, code and translation requests) is sent through `InputGuard.screen` as a
one-message chat body, for a tenant with every guard on (PII redaction of all kinds, a size bound, English
only), then with each guard alone. Printed per set: microseconds per prompt (median, p99, mean) of the
process's CPU time around the call, and the share of prompts each guard acted on. These prompts were not
written to hold personal data, so what the PII guard finds in them is mostly its false positives (`--show`
prints the matches, to judge them; keep that output to yourself: RMB's users may have pasted real data).

    python -m loadtest.bench.guards --limit 2000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gateway.guards.pii import find_pii
from gateway.guards.screen import InputGuard
from gateway.serving.openai.schema import ChatRequest
from loadtest.bench.scorer_prompts import DEFAULT_DATA_DIR, MAX_CHARS
from policies.guards import Guards, LanguageGuard, PiiGuard
from policies.schema import Policy

__all__ = ["SOURCES", "main"]

SOURCES = {
    "rmb-helpfulness (chat)": "rmb-helpfulness/rmb-helpfulness.jsonl.gz",
    "mmlu-pro": "mmlu-pro/mmlu-pro.jsonl.gz",
    "zeroeval": "zeroeval/zeroeval.jsonl.gz",
    "llmrouter-dcrouter": "llmrouter-dcrouter/llmrouter-dcrouter.jsonl.gz",
}
CONFIGS = {
    "all guards": Guards(pii=PiiGuard(), max_prompt_chars=100_000, languages=LanguageGuard(allowed=("en",))),
    "pii only": Guards(pii=PiiGuard()),
    "language only": Guards(languages=LanguageGuard(allowed=("en",))),
    "size only": Guards(max_prompt_chars=100_000),
}
_POOL = {"type": "remote", "urls": ["http://127.0.0.1:1"], "model": "m",
         "price": {"input_per_mtok": "0", "output_per_mtok": "0"}}


def _policy(guards: Guards) -> Policy:
    return Policy.model_validate({"pools": {"a": _POOL}, "routing": {"micro_pool": "a", "flagship_pool": "a"},
                                  "tenants": {"t": {"guards": guards.model_dump(exclude_none=True)}}})


def _prompts(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        prompts = [str(json.loads(line)["prompt"])[:MAX_CHARS] for line in fh if line.strip()]
    return [p for p in dict.fromkeys(prompts) if p.strip()][:limit]


def _time(policy: Policy, prompts: list[str], decisions: Counter[tuple[str, str, str]]) -> list[float]:
    """CPU microseconds of each `screen` call; `decisions` counts (guard, kind, action)."""
    guard = InputGuard(lambda _t, g, k, a: decisions.update([(g, k, a)]))
    out = []
    for text in prompts:
        raw: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        request = ChatRequest.model_validate(raw)
        start = time.process_time_ns()
        try:
            guard.screen(policy, "t", request, raw)
        except Exception as exc:  # a refusal (InputRefused) is a decision, counted by the hook
            if type(exc).__name__ != "InputRefused":
                raise
        out.append((time.process_time_ns() - start) / 1000)
    return out


def _row(name: str, config: str, times: list[float], decisions: Counter[tuple[str, str, str]],
         prompts: list[str]) -> str:
    n = len(prompts)
    acted = Counter[str]()
    for (guard, kind, action), count in decisions.items():
        if action != "passed":
            acted[f"{guard}:{action}:{kind}"] += count
    shares = ", ".join(f"{key} {count / n:.1%}" for key, count in sorted(acted.items())) or "none"
    p99 = sorted(times)[max(0, int(len(times) * 0.99) - 1)]
    chars = statistics.median(len(p) for p in prompts)
    return (f"| {name} | {config} | {n} | {chars:.0f} | {statistics.median(times):.0f} | {p99:.0f} "
            f"| {statistics.fmean(times):.0f} | {shares} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("CASCADE_ROUTING_DATA", DEFAULT_DATA_DIR)))
    parser.add_argument("--limit", type=int, default=2000, help="prompts per set")
    parser.add_argument("--show", action="store_true", help="print what the PII guard found (for judging it)")
    args = parser.parse_args(argv)
    policies = {name: _policy(g) for name, g in CONFIGS.items()}
    print("| set | guards | prompts | median chars | median µs | p99 µs | mean µs | acted on (share of prompts) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rel in SOURCES.items():
        path = args.data / rel
        if not path.exists():
            print(f"| {name} | absent ({path}) | | | | | | |")
            continue
        prompts = _prompts(path, args.limit)
        _time(policies["all guards"], prompts[:100], Counter())  # warm-up: phonenumbers loads metadata lazily
        for config, policy in policies.items():
            decisions: Counter[tuple[str, str, str]] = Counter()
            print(_row(name, config, _time(policy, prompts, decisions), decisions, prompts), flush=True)
        if args.show:
            pii = PiiGuard()
            for text in prompts:
                for span in find_pii(text, pii):
                    print(f"  {name}: {span.kind}: {text[span.start:span.end]!r}")


if __name__ == "__main__":
    main()
