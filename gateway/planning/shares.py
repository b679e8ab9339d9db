"""Routed share per pool from a sample of prompts: scored by the classifier, routed by the policy (`decide`),
as `model: auto` requests of an unnamed tenant with the ladder idle."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from policies.context import AUTO_MODEL, RouteContext, prompt_text_of
from policies.decide import decide
from policies.schema import Policy

__all__ = ["ScoreFn", "read_prompts", "shares_from_sample"]

ScoreFn = Callable[[Sequence[str]], list[float]]


def _prompt(line: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return line
    if isinstance(obj, dict):
        if "messages" in obj:
            return prompt_text_of(obj["messages"])
        return str(obj.get("prompt", ""))
    return line


def read_prompts(path: Path) -> list[str]:
    """Prompts of a sample file: JSON lines with `prompt` or `messages`, or plain text lines."""
    prompts = [_prompt(line.strip()) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def shares_from_sample(policy: Policy, prompts: Sequence[str], score: ScoreFn) -> dict[str, float]:
    """Fraction of the sample each pool receives (pools that get nothing are left out)."""
    scores = score(prompts)
    pools = Counter(decide(policy, "", RouteContext(tenant="", requested_model=AUTO_MODEL, prompt_text=text), s).pool
                    for text, s in zip(prompts, scores, strict=True))
    return {name: count / len(prompts) for name, count in sorted(pools.items())}
