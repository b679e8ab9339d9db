"""The overhead benchmark's response-cache phase (`python -m loadtest.bench.overhead --cache`): gateway CPU per
request with the exact cache off, on and missing, and on and hitting, side by side.

One gateway (one worker, real Redis ledger and cache) in front of the zero-latency fake upstream, two tenants: `nocache`
(no cache) and `cached` (`cache: {mode: exact}`). wrk cells, interleaved per round and concurrency:
- `off`: unique prompts (a random id per request), tenant nocache: the gateway as it was;
- `miss`: unique prompts, tenant cached: every request is looked up, missed, forwarded and its answer kept;
- `hit`: 256 prompts in turn, tenant cached, warmed up first: the lookups hit (the realised hit share of each cell is
  read from `cascade_cache_lookups_total` and printed beside it; a hit cell that did not hit is not a figure).
The CPU is the gateway process's (`/proc`), per completed request; Redis's own CPU is not in it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.api.auth import hash_key
from loadtest.bench.cells import Target, measure, summary, tenant_gateway
from loadtest.bench.wrk import run_wrk
from loadtest.processes import Env, http_get

__all__ = ["TENANTS", "cache_lua", "cache_phase"]

_PROMPTS = 256


def cache_lua(key: str, unique: bool, max_tokens: int) -> str:
    """A wrk script POSTing a deterministic chat request as tenant `key`: a new prompt each time (`unique`), or
    one of 256 in turn."""
    pick = 'string.format("%d-%d", seed, n)' if unique else f"tostring(n % {_PROMPTS})"
    return f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
math.randomseed(os.time() + math.floor(os.clock() * 1e6))
seed = math.random(1, 1000000000)
n = 0
request = function()
  n = n + 1
  local body = '{{"model": "micro", "temperature": 0, "max_tokens": {max_tokens}, "messages": ' ..
    '[{{"role": "user", "content": "What is question ' .. {pick} .. ' about?"}}]}}'
  return wrk.format(nil, nil, nil, body)
end
"""


def _lookups(url: str) -> dict[str, float]:
    out = {"hit": 0.0, "miss": 0.0, "bypass": 0.0}
    status, body = http_get(url + "/metrics", 5.0)
    if status != 200:
        return out
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "cascade_cache_lookups_total" and s.labels.get("tenant") == "cached":
                out[s.labels["result"]] = out.get(s.labels["result"], 0.0) + s.value
    return out


TENANTS = f"""tenants:
  nocache: {{api_key_sha256: ['{hash_key("sk-off")}']}}
  cached:
    api_key_sha256: ['{hash_key("sk-on")}']
    cache: {{mode: exact, ttl_s: 3600, max_entries: 1000000}}
"""


def cache_phase(env: Env) -> dict[str, Any]:
    """Interleaved cells (see the module docstring); returns the cells and medians per (cell, concurrency)."""
    args = env.args
    base, pid = tenant_gateway(env, "cache", TENANTS)
    url = base + "/v1/chat/completions"
    scripts: dict[str, Path] = {}
    for name, key, unique in (("off", "sk-off", True), ("miss", "sk-on", True), ("hit", "sk-on", False)):
        scripts[name] = env.tmp / f"cache-{name}.lua"
        scripts[name].write_text(cache_lua(key, unique, args.max_tokens))
        run_wrk(url, scripts[name], 8, args.warmup, 1, args.wrk_timeout)  # warm-up (fills the hit set)
    cells: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        for conc in args.concurrency:
            order = ["off", "miss", "hit"] if rnd % 2 else ["hit", "miss", "off"]
            for name in order:
                before = _lookups(base)
                cell = measure(Target(f"cache-{name}", url, pid), scripts[name], conc, args, rnd)
                after = _lookups(base)
                looked = sum(after.values()) - sum(before.values())
                cell["hit_share"] = (after["hit"] - before["hit"]) / looked if looked else None
                print(f"      realised hit share {cell['hit_share'] if cell['hit_share'] is not None else '-'}",
                      flush=True)
                cells.append(cell)
    env.procs.stop("gateway-cache")
    env.procs.stop("fake-upstream-cache")
    return {"cells": cells, "summary": summary(cells, ("cache-off", "cache-miss", "cache-hit"), ("hit_share",)),
            "cpus": os.cpu_count()}

