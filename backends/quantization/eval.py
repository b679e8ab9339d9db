"""Measure what quantization cost: the quantized engine against the original, on held-out prompts.

Both models are served by real vLLM engines (started at once where the machine has the memory for both, else one
after the other) and measured one after the other, each while the other is idle or gone. For each
held-out chat prompt the original greedily continues it; that prompt + continuation is then scored by both
engines with ``prompt_logprobs`` (teacher forcing): at every continuation position both see exactly the same
prefix, the original's own text, so one early divergence cannot flip the positions after it.

- **next-token agreement** (``greedy_agreement``, teacher-forced): share of continuation positions where
  both engines' most likely next token is the same (tokens tied for the top count as the top);
- **KL(original || quantized)** of the next-token distributions, in nats per position, over the top
  ``k`` tokens of both engines plus one bucket for the rest (exact when ``k`` covers the vocabulary, else
  a lower bound);
- **sequence agreement** (secondary, fragile): share of positions where the quantized engine's own greedy
  continuation equals the original's; after the first divergence the two texts drift apart, so a single
  flipped token can cost every later position of its sequence;
- **JSON validity**: share of answers to schema-constrained requests (``response_format`` json_schema,
  vLLM guided decoding) that parse as JSON, for each model;
- **speed**: decode tokens/s of each engine on the same batch.

Everything but speed is deterministic for a given pair of checkpoints on one machine: greedy decoding,
fixed prompts, and the engines run with a fixed OpenMP thread count (the caller's job).

The engine-side measuring is :func:`measure_engine` (an async HTTP client against a running server);
:func:`compare` is pure arithmetic over two such measurements.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from backends.engines.vllm_plugin import NO_DETOKENIZE_XARG

__all__ = ["EVAL_PROMPTS", "JSON_PROMPTS", "JSON_SCHEMA", "EngineRun", "Evaluation", "compare", "measure_engine"]

Dist = dict[int, float]  # token id -> logprob (top-k of one position)
KEEPALIVE_S = 4.0  # idle connections kept under the engine's keep-alive (uvicorn's 5 s)

# Held-out prompts: not in the demo calibration set (which is drawn from the tokenizer's corpus).
EVAL_PROMPTS: tuple[str, ...] = (
    "What is the capital of France, and why did it become the capital?",
    "Write a haiku about a lighthouse in winter.",
    "List three ways to reduce the latency of a web service.",
    "Explain the difference between a process and a thread to a new engineer.",
    "Give me a recipe for a quick vegetarian dinner with lentils.",
    "Why does the moon always show the same face to the earth?",
    "Draft a polite reminder email about an unpaid invoice.",
    "What are the trade-offs of storing money as floating point numbers?",
    "Summarize the plot of a heist movie in two sentences.",
    "How do I reverse a linked list in place? Describe the steps.",
    "Compare renting and buying a home for someone who moves every three years.",
    "Explain what a hash collision is, with an example.",
)
JSON_PROMPTS: tuple[str, ...] = (
    "Classify the sentiment of: 'The battery died after two days.' Answer as JSON.",
    "Is this email spam? 'You won a free cruise, click here.' Answer as JSON.",
    "Classify the sentiment of: 'Fast delivery and great support.' Answer as JSON.",
    "Is this message urgent? 'The production database is down.' Answer as JSON.",
    "Classify the sentiment of: 'It works, I guess.' Answer as JSON.",
    "Is this review about shipping? 'The parcel arrived crushed.' Answer as JSON.",
)
JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "negative", "neutral", "yes", "no"]},
        "confident": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 24},
    },
    "required": ["label", "confident", "reason"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class EngineRun:
    """What one engine produced: per prompt, the next-token top-k at each position of the continuation it
    was scored on (``dists``), and its own greedy continuation (``greedy``)."""

    dists: tuple[tuple[Dist, ...], ...]
    json_answers: tuple[str, ...]
    tokens_per_s: float
    greedy: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Evaluation:
    """The loss figures (see the module docstring); ``greedy_agreement`` is the teacher-forced one."""

    greedy_agreement: float
    sequence_agreement: float
    kl_mean: float
    kl_max: float
    positions: int
    prompts: int
    json_valid: float
    json_valid_original: float
    tokens_per_s: float
    tokens_per_s_original: float
    logprob_k: int
    exact_kl: bool

    def as_dict(self) -> dict[str, Any]:
        return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _top(entry: dict[str, Any] | None) -> Dist:
    if not entry:
        return {}
    return {int(token): float(info["logprob"]) for token, info in entry.items()}


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(url, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
    data: dict[str, Any] = response.json()
    return data


async def _continuation(http: httpx.AsyncClient, base: str, model: str, ids: list[int], n: int) -> list[int]:
    body = {"model": model, "prompt": ids, "max_tokens": n, "temperature": 0, "return_token_ids": True,
            "ignore_eos": True}
    out = await _post(http, f"{base}/v1/completions", body)
    return [int(t) for t in out["choices"][0]["token_ids"]]


async def _scored(http: httpx.AsyncClient, base: str, model: str, ids: list[int], start: int,
                  k: int) -> tuple[Dist, ...]:
    """Top-k next-token logprobs at positions ``start..len(ids)-1`` given the prefix before each."""
    # the figures take token ids and logprobs only: not detokenizing k tokens a position saves most of the request
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": k,
            "vllm_xargs": {NO_DETOKENIZE_XARG: 0}}
    out = await _post(http, f"{base}/v1/completions", body)
    entries = out["choices"][0]["prompt_logprobs"]
    return tuple(_top(entries[i]) for i in range(start, len(ids)))


async def _json_answers(http: httpx.AsyncClient, base: str, model: str, max_tokens: int) -> tuple[str, ...]:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": JSON_SCHEMA}}
    answers = []
    for prompt in JSON_PROMPTS:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": max_tokens, "response_format": fmt}
        out = await _post(http, f"{base}/v1/chat/completions", body)
        answers.append(str(out["choices"][0]["message"]["content"] or ""))
    return tuple(answers)


async def _speed(http: httpx.AsyncClient, base: str, model: str, prompts: Sequence[list[int]], n: int,
                 rounds: int = 3) -> float:
    """Generated tokens/s with all prompts at once (the engine batches them); the best of ``rounds``, since
    a shared machine only ever makes a run slower."""
    body = {"model": model, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    await _post(http, f"{base}/v1/completions", {**body, "prompt": prompts[0], "max_tokens": 4})  # warm-up
    best = 0.0
    for _ in range(rounds):
        started = time.monotonic()
        outs = await asyncio.gather(*(_post(http, f"{base}/v1/completions", {**body, "prompt": p})
                                      for p in prompts))
        elapsed = time.monotonic() - started
        best = max(best, sum(int(o["usage"]["completion_tokens"]) for o in outs) / elapsed)
    return best


async def measure_engine(base: str, model: str, prompts: Sequence[list[int]], *, k: int, new_tokens: int,
                         continuations: Sequence[list[int]] | None = None) -> tuple[EngineRun, list[list[int]]]:
    """Measure the engine at ``base`` (no ``/v1``). Without ``continuations`` it makes its own greedy ones
    (the original's role); returns the run and the continuations used."""
    # idle connections kept under the engine's own keep-alive (uvicorn's 5 s, httpx's default too): at 5 s both, a
    # request could go out on a connection the engine was closing (httpx.ReadError in a fresh clone at load 20)
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits, trust_env=False) as http:
        own = [await _continuation(http, base, model, ids, new_tokens) for ids in prompts]
        conts = list(continuations) if continuations is not None else own
        pairs = zip(prompts, conts, strict=True)
        dists = [await _scored(http, base, model, ids + cont, len(ids), k) for ids, cont in pairs]
        answers = await _json_answers(http, base, model, max_tokens=64)
        speed = await _speed(http, base, model, prompts, new_tokens)
    return EngineRun(tuple(dists), answers, speed, tuple(tuple(c) for c in own)), conts


def _kl(p: Dist, q: Dist) -> float:
    """KL(p||q) over the tokens both top-k lists hold, plus one bucket for all other tokens."""
    shared = p.keys() & q.keys()
    total = 0.0
    for token in shared:
        total += math.exp(p[token]) * (p[token] - q[token])
    p_rest = max(0.0, 1.0 - sum(math.exp(p[t]) for t in shared))
    q_rest = max(1e-12, 1.0 - sum(math.exp(q[t]) for t in shared))
    if p_rest > 1e-12:
        total += p_rest * math.log(p_rest / q_rest)
    return max(0.0, total)


def _top_tokens(d: Dist, tie: float = 1e-6) -> set[int]:
    """The most likely tokens (several when tied: bf16 logits of a weak model often are)."""
    best = max(d.values(), default=0.0)
    return {t for t, lp in d.items() if lp >= best - tie}


def _json_share(answers: Sequence[str]) -> float:
    def valid(text: str) -> bool:
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False

    return sum(valid(a) for a in answers) / len(answers) if answers else 0.0


def _sequence_agreement(original: EngineRun, quantized: EngineRun) -> float:
    """Share of positions where the two engines' own greedy continuations hold the same token."""
    same = total = 0
    for a, b in zip(original.greedy, quantized.greedy, strict=True):
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b, strict=False))
    return same / total if total else 0.0


def compare(original: EngineRun, quantized: EngineRun, *, k: int, vocab_size: int) -> Evaluation:
    """The loss figures of ``quantized`` against ``original`` (same prompts, same continuations)."""
    agree, kls = 0, []
    for p_seq, q_seq in zip(original.dists, quantized.dists, strict=True):
        for p, q in zip(p_seq, q_seq, strict=True):
            agree += bool(_top_tokens(p) & _top_tokens(q))
            kls.append(_kl(p, q))
    positions = len(kls)
    return Evaluation(
        greedy_agreement=agree / positions if positions else 0.0,
        sequence_agreement=_sequence_agreement(original, quantized),
        kl_mean=sum(kls) / positions if positions else 0.0,
        kl_max=max(kls, default=0.0),
        positions=positions,
        prompts=len(original.dists),
        json_valid=_json_share(quantized.json_answers),
        json_valid_original=_json_share(original.json_answers),
        tokens_per_s=quantized.tokens_per_s,
        tokens_per_s_original=original.tokens_per_s,
        logprob_k=k,
        exact_kl=k >= vocab_size,
    )
