"""Labels the gateway collects from its own traffic, the reader that turns them into training rows, and the one
that only lists the labelled requests' ids (`read_ledger_label_ids`: the retraining schedule counts them), and the
one that says which tenant made each of some request ids (`kept_request_tenants`: label files that name requests).

This module is the one place that names the Redis keys and fields of the learning loop; the gateway's
writers (`gateway.learning.store`, `gateway.learning.feedback`, `gateway.learning.shadow`) import them from
here, so writer and reader cannot drift apart. It imports no gateway code.

Keys (prefix = the ledger's `redis_prefix`, default ``cascade:``), one hash per request id each:

- ``{prefix}learn:prompt:{id}``: a kept request (policy ``learning.keep_prompts``): ``text`` (what the
  scorer saw, `router_models.serving.scorer.conversation_text`), ``score`` (router score), ``pool`` (the pool whose
  answer the client got), ``micro`` ("1" when that is the policy's micro pool), ``tenant``, ``at`` (UTC epoch s),
  and the conversation's shape as the scorer saw it (`SHAPE_FIELDS`, `shape_fields`: ``user_turns``,
  ``assistant_turns``, ``tool_messages``, ``system_prompt`` "1"/"0", ``total_chars``, ``latest_chars``; absent
  from records kept before the scorer read shapes, which train as one user turn of ``text``).
- ``{prefix}learn:feedback:{id}``: the client's feedback (``POST /v1/feedback``): ``score`` in [0, 1]
  (thumbs up = 1, down = 0), ``thumbs`` ("up", "down" or ""), ``comment``, ``tenant``, ``at``. Last wins.
- ``{prefix}learn:shadow:{id}``: the judge's verdict on a shadow comparison (`gateway.learning.judge`):
  ``short`` ("1" when the flagship's answer was better, "0" when the micro answer was as good or better, ""
  when the judge's two orders disagreed: no label), ``verdict`` ("micro", "flagship", "tie" or
  "inconsistent"), ``replies`` (the judge's words, "/" between the two orders), ``order`` ("micro-first" or
  "flagship-first": the first judgement's), ``at``.
- ``{prefix}learn:cascade:{id}``: the true cascade's weak label: ``confidence`` (micro answer confidence,
  "" when none), ``escalated`` ("1" when the gateway escalated to the flagship), ``at``.

Row format (`read_ledger_labels`, and the documented user label-file format)::

    {"id": str, "prompt": str, "needs_flagship": float in [0, 1],
     "pools": {str: float in [0, 1]},
     "source": "feedback" | "shadow" | "escalation", "tenant": str, "pool": str, "score": float,
     "shape": {"user_turns": int, "assistant_turns": int, "tool_messages": int, "system_prompt": bool,
               "total_chars": int, "latest_chars": int}}      # "shape" only when the record kept one

A row has ``needs_flagship`` (a label of the micro/flagship gap: shadow, feedback on a micro answer, escalation), or
``pools`` (the client's feedback score as the quality of the pool that served the answer, `{pool: score}`, whichever
pool of the policy that was: a label per pool, `router_models.serving.pool_labels`), or both. A row with ``pools``
only trains no router; `cascade router memory add --from-ledger` keeps it as a label per pool.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import redis

from router_models.serving.scorer import ConversationShape

__all__ = [
    "CASCADE_FIELDS",
    "DEFAULT_PREFIX",
    "FEEDBACK_FIELDS",
    "PROMPT_FIELDS",
    "SHADOW_FIELDS",
    "SHAPE_FIELDS",
    "LabelKeys",
    "kept_request_tenants",
    "label_row",
    "read_ledger_label_ids",
    "read_ledger_labels",
    "shape_fields",
]

DEFAULT_PREFIX = "cascade:"  # the ledger's default key prefix (gateway.settings.Settings.redis_prefix)
SHAPE_FIELDS = tuple(f.name for f in fields(ConversationShape))  # user_turns ... system_prompt ... latest_chars
PROMPT_FIELDS = ("text", "score", "pool", "micro", "tenant", "at", *SHAPE_FIELDS)
FEEDBACK_FIELDS = ("score", "thumbs", "comment", "tenant", "at")
SHADOW_FIELDS = ("short", "verdict", "replies", "order", "at")
CASCADE_FIELDS = ("confidence", "escalated", "at")


@dataclass(frozen=True, slots=True)
class LabelKeys:
    """The learning loop's Redis keys under one prefix (the ledger's)."""

    prefix: str = DEFAULT_PREFIX

    def prompt(self, request_id: str) -> str:
        return f"{self.prefix}learn:prompt:{request_id}"

    def feedback(self, request_id: str) -> str:
        return f"{self.prefix}learn:feedback:{request_id}"

    def shadow(self, request_id: str) -> str:
        return f"{self.prefix}learn:shadow:{request_id}"

    def cascade(self, request_id: str) -> str:
        return f"{self.prefix}learn:cascade:{request_id}"

    @property
    def prompt_pattern(self) -> str:
        """SCAN pattern of every kept prompt (glob characters in the prefix are escaped)."""
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self.prefix)
        return f"{escaped}learn:prompt:*"


def shape_fields(shape: ConversationShape) -> dict[str, str]:
    """The prompt record's shape fields (`SHAPE_FIELDS`) of a conversation's shape."""
    return {"user_turns": str(shape.user_turns), "assistant_turns": str(shape.assistant_turns),
            "tool_messages": str(shape.tool_messages), "system_prompt": "1" if shape.system_prompt else "0",
            "total_chars": str(shape.total_chars), "latest_chars": str(shape.latest_chars)}


def _shape(prompt: Mapping[str, str]) -> dict[str, Any] | None:
    """The label row's "shape" from a prompt record's fields; None when the record has none (or a bad one)."""
    try:
        counts = {f: int(prompt[f]) for f in SHAPE_FIELDS if f != "system_prompt"}
    except (KeyError, ValueError):
        return None
    if min(counts.values()) < 0 or prompt.get("system_prompt") not in ("0", "1"):
        return None
    return {**counts, "system_prompt": prompt["system_prompt"] == "1"}


def _fraction(value: str | None) -> float | None:
    try:
        number = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) and 0.0 <= number <= 1.0 else None


def _label(feedback: Mapping[str, str], shadow: Mapping[str, str], cascade: Mapping[str, str],
           micro: bool) -> tuple[float, str] | None:
    """(needs_flagship, source) by precedence: shadow beats feedback beats escalation. Feedback on an answer
    that the micro pool did not give says nothing about the micro pool and yields no gap label (it labels the pool
    that gave it: `_pool_label`)."""
    if shadow.get("short") in ("0", "1"):
        return float(shadow["short"]), "shadow"
    score = _fraction(feedback.get("score"))
    if micro and score is not None:
        return 1.0 - score, "feedback"
    if cascade.get("escalated") in ("0", "1"):
        return float(cascade["escalated"]), "escalation"
    return None


def _usable_label(has_text: bool, prompt: Mapping[str, str], feedback: Mapping[str, str],
                  shadow: Mapping[str, str], cascade: Mapping[str, str]) -> tuple[float, str] | None:
    """(needs_flagship, source) of a kept request, or None when it yields no row: no label, no prompt text (an
    expired record has none) or no router score. The one test of both readers; `prompt` needs ``score`` and
    ``micro`` only (`has_text` says whether its ``text`` is non-empty)."""
    if not has_text or _fraction(prompt.get("score")) is None:
        return None
    return _label(feedback, shadow, cascade, prompt.get("micro") == "1")


def _pool_label(prompt: Mapping[str, str], feedback: Mapping[str, str]) -> dict[str, float]:
    """{served pool: feedback score}: the client's feedback as the quality of the answer of the pool that gave it
    (any pool: micro, flagship or a middle tier); {} without feedback, or without a text, router score or pool."""
    score, pool = _fraction(feedback.get("score")), prompt.get("pool", "").strip()
    if score is None or not pool or pool.startswith("@") or not prompt.get("text") \
            or _fraction(prompt.get("score")) is None:
        return {}
    return {pool: score}


def label_row(request_id: str, prompt: Mapping[str, str], feedback: Mapping[str, str],
              shadow: Mapping[str, str], cascade: Mapping[str, str]) -> dict[str, Any] | None:
    """The label row of one kept request (module docstring), or None when it has no usable label (or no prompt):
    its gap label (`needs_flagship`) when it has one, and its served pool's quality (`pools`) when the client
    gave feedback."""
    label = _usable_label(bool(prompt.get("text")), prompt, feedback, shadow, cascade)
    pools = _pool_label(prompt, feedback)
    if label is None and not pools:
        return None
    row: dict[str, Any] = {"id": request_id, "prompt": prompt["text"]}
    if label is not None:
        row["needs_flagship"] = label[0]
    if pools:
        row["pools"] = pools
    row |= {"source": "feedback" if label is None else label[1], "tenant": prompt.get("tenant", ""),
            "pool": prompt.get("pool", ""), "score": float(prompt["score"])}
    shape = _shape(prompt)
    if shape is not None:
        row["shape"] = shape
    return row


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _text_map(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def read_ledger_labels(redis_url: str, *, key_prefix: str = DEFAULT_PREFIX) -> list[dict[str, Any]]:
    """One row per kept request that carries a label, sorted by request id (module docstring: format).

    Walks the kept prompts with SCAN (never KEYS) and reads each one's labels in one pipelined round trip
    per batch. Requests without a usable label (or whose prompt has expired) yield no row. Raises
    `redis.RedisError` when Redis cannot be read.
    """
    keys = LabelKeys(key_prefix)
    client = redis.Redis.from_url(redis_url)
    rows: list[dict[str, Any]] = []
    try:
        for batch in _kept_ids(client, keys):
            rows += _read_batch(client, keys, batch)
    finally:
        client.close()
    return sorted(rows, key=lambda row: str(row["id"]))


def read_ledger_label_ids(redis_url: str, *, key_prefix: str = DEFAULT_PREFIX) -> set[str]:
    """The request ids `read_ledger_labels` would return rows with a gap label (``needs_flagship``) for, the ones
    a retrain learns from, without reading prompt texts or any field
    the decision does not need: per kept request the text's length (HSTRLEN), the record's ``score`` and
    ``micro``, and the one field of each label record that `_label` reads. Same SCAN, same batches, same test
    (`_usable_label`); raises `redis.RedisError` when Redis cannot be read."""
    keys = LabelKeys(key_prefix)
    client = redis.Redis.from_url(redis_url)
    ids: set[str] = set()
    try:
        for batch in _kept_ids(client, keys):
            ids |= _read_id_batch(client, keys, batch)
    finally:
        client.close()
    return ids


def kept_request_tenants(redis_url: str, request_ids: Iterable[str], *,
                         key_prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """request id -> the tenant of its kept prompt, for each of `request_ids` whose prompt the gateway kept (an
    unknown or expired id is absent). One pipelined HGET per id, in batches of 500; raises `redis.RedisError`."""
    keys = LabelKeys(key_prefix)
    wanted = sorted(set(request_ids))
    client = redis.Redis.from_url(redis_url)
    owners: dict[str, str] = {}
    try:
        for start in range(0, len(wanted), 500):
            batch = wanted[start:start + 500]
            pipe = client.pipeline(transaction=False)
            for request_id in batch:
                pipe.hget(keys.prompt(request_id), "tenant")
            owners.update({rid: _text(t) for rid, t in zip(batch, pipe.execute(), strict=True) if t is not None})
    finally:
        client.close()
    return owners


def _kept_ids(client: redis.Redis, keys: LabelKeys, size: int = 500) -> Iterator[list[str]]:
    """The request ids of every kept prompt, in batches of `size`, by SCAN (never KEYS)."""
    start = len(keys.prefix) + len("learn:prompt:")
    batch: list[str] = []
    for key in client.scan_iter(match=keys.prompt_pattern, count=1000):
        batch.append(_text(key)[start:])
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _read_batch(client: redis.Redis, keys: LabelKeys, request_ids: list[str]) -> list[dict[str, Any]]:
    pipe = client.pipeline(transaction=False)
    for request_id in request_ids:
        for key in (keys.prompt, keys.feedback, keys.shadow, keys.cascade):
            pipe.hgetall(key(request_id))
    replies = [_text_map(raw or {}) for raw in pipe.execute()]
    rows = []
    for i, request_id in enumerate(request_ids):
        row = label_row(request_id, *replies[4 * i : 4 * i + 4])
        if row is not None:
            rows.append(row)
    return rows


def _read_id_batch(client: redis.Redis, keys: LabelKeys, request_ids: list[str]) -> set[str]:
    pipe = client.pipeline(transaction=False)
    for request_id in request_ids:
        pipe.hstrlen(keys.prompt(request_id), "text")
        pipe.hmget(keys.prompt(request_id), ["score", "micro"])
        pipe.hget(keys.feedback(request_id), "score")
        pipe.hget(keys.shadow(request_id), "short")
        pipe.hget(keys.cascade(request_id), "escalated")
    replies = pipe.execute()
    ids = set()
    for i, request_id in enumerate(request_ids):
        text_len, (score, micro), feedback, shadow, cascade = replies[5 * i : 5 * i + 5]
        prompt = _present({"score": score, "micro": micro})
        if _usable_label(int(text_len) > 0, prompt, _present({"score": feedback}), _present({"short": shadow}),
                         _present({"escalated": cascade})) is not None:
            ids.add(request_id)
    return ids


def _present(fields: Mapping[str, Any]) -> dict[str, str]:
    """The fields an HGET / HMGET found, as text (a missing field is absent, as in HGETALL's reply)."""
    return {name: _text(value) for name, value in fields.items() if value is not None}
