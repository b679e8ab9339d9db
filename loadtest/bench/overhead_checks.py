"""The overhead benchmark's output-checks phase (`python -m loadtest.bench.overhead --checks`): gateway CPU per
request with the output checks off and on, side by side.

One gateway (one worker, real Redis ledger) in front of the zero-latency fake upstream, which answers every request
with the same JSON object (`--content`), and two tenants: `off` (no output checks) and `on` (every check, action
`flag`: `json`, `tool_calls`, `empty`, `repetition`). Both send the same `json_schema` request, so the `on` cells
parse the engine's body, parse its content and validate it against the schema (compiled once, cached), then run
the empty and repetition checks; the answer passes, so nothing is retried and each request is one engine call in
both cells. wrk cells are interleaved per round and concurrency (off first on odd rounds, on first on even ones);
the CPU is the gateway process's (`/proc`) per completed request.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.auth import hash_key
from loadtest.bench.cells import Target, measure, summary, tenant_gateway
from loadtest.bench.wrk import lua_script
from loadtest.processes import Env

__all__ = ["ANSWER", "TENANTS", "checks_body", "checks_phase"]

ANSWER = '{"city": "Paris", "country": "France", "population_millions": 2.1, "sources": ["census 2021"]}'
SCHEMA = {"type": "object", "required": ["city", "country"], "additionalProperties": False,
          "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                         "population_millions": {"type": "number", "minimum": 0},
                         "sources": {"type": "array", "items": {"type": "string"}}}}


def checks_body(max_tokens: int) -> bytes:
    """The request both tenants send: a JSON answer held to `SCHEMA`."""
    return orjson.dumps({"model": "micro", "max_tokens": max_tokens,
                         "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
                         "messages": [{"role": "user", "content": "Which city is the capital of France? JSON."}]})


TENANTS = f"""tenants:
  "off": {{api_key_sha256: ['{hash_key("sk-off")}']}}
  "on":
    api_key_sha256: ['{hash_key("sk-on")}']
    output_checks: {{json: flag, tool_calls: flag, empty: flag, repetition: flag}}
"""


def checks_phase(env: Env) -> dict[str, Any]:
    """Interleaved cells (see the module docstring); returns the cells and medians per (cell, concurrency)."""
    args = env.args
    base, pid = tenant_gateway(env, "checks", TENANTS, ("--content", ANSWER))
    url = base + "/v1/chat/completions"
    body = checks_body(args.max_tokens).decode()
    scripts = {}
    for name in ("off", "on"):
        scripts[name] = env.tmp / f"checks-{name}.lua"
        scripts[name].write_text(lua_script(body.encode()) + f'wrk.headers["Authorization"] = "Bearer sk-{name}"\n')
    cells: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for conc in args.concurrency:
            for name in (("off", "on") if rnd % 2 else ("on", "off")):
                cells.append(measure(Target(f"checks-{name}", url, pid), scripts[name], conc, args, rnd))
    env.procs.stop("gateway-checks")
    env.procs.stop("fake-upstream-checks")
    return {"cells": cells, "summary": summary(cells, ("checks-off", "checks-on"))}

