"""Steady traffic through a change ops make while the gateway serves, every answer checked.

Clients of the official `openai` SDK (half of them streaming) send requests one after another, each pausing
`think_s` between its requests, for the whole run: `steady_s` before the change, during it, and `after_s`
after. The change is an async callable that returns once it is applied (a policy reload that starts a pool's
new engines returns once they serve). A request fails when it raises, or when a stream ends without a finish
reason. Figures: how long the change took (reload sent to new version serving), requests answered meanwhile,
failures, and p50/p99 latency before, during and after.

    python -m loadtest.scenarios.change --url http://127.0.0.1:8080 --policy policies/my.yaml \\
        --replace "max_model_len: 1024" "max_model_len: 2048" --admin-key "$CASCADE_ADMIN_KEY"
    python -m loadtest.scenarios.change --url http://127.0.0.1:8080 --promote NEW.json --admin-key "$KEY"
    python -m loadtest.scenarios.change --url http://127.0.0.1:8080 --policy policies/my.yaml \
        --promote-canary micro --admin-key "$KEY"       # or --rollback-canary micro
    python -m loadtest.scenarios.change --url http://127.0.0.1:8080 --memory-add labels.jsonl [--tenant acme]

A label memory added (`--memory-add`: what `cascade router memory add` does, into `$CASCADE_HOME/router`) is
applied when an answer's `x-cascade-router-version` names the memory at its new size (the gateway polls the
folder; no reload is called). The clients then send `model: auto` with `--api-key` (the tenant's key when the
memory is a tenant's), so each request is scored and moved by the memory the policy names.

Each answer's `model` (the engine's served name) is counted, so a canary's share shows in `models`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest.load.stream_client import percentile

__all__ = ["Outcome", "add_memory_then_wait", "edit_then_reload", "figures", "measure_change", "promote_then_reload",
           "reload_after_edit"]


@dataclass(frozen=True, slots=True)
class Outcome:
    started: float  # monotonic seconds
    ended: float
    stream: bool
    error: str  # "" when the answer was whole
    model: str = ""  # the model the answer names (the engine's served name)


async def _one(client: Any, model: str, stream: bool, max_tokens: int) -> tuple[str, str]:
    """(error, or "" for a whole answer; the model the answer names)."""
    messages = [{"role": "user", "content": "Summarise in one line why caches matter."}]
    try:
        if not stream:
            answer = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
            return ("" if answer.choices and answer.choices[0].finish_reason else "no finish reason"), answer.model
        finished, named = False, ""
        async for chunk in await client.chat.completions.create(model=model, messages=messages,
                                                                max_tokens=max_tokens, stream=True):
            finished = finished or any(c.finish_reason for c in chunk.choices)
            named = named or chunk.model
        return ("" if finished else "stream ended without a finish reason"), named
    except Exception as exc:  # every failure is a figure here, whatever its kind
        return f"{type(exc).__name__}: {str(exc)[:300]}", ""


async def _client(base: str, api_key: str, model: str, stream: bool, stop: asyncio.Event, out: list[Outcome],
                  max_tokens: int, think_s: float) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=120)
    try:
        while not stop.is_set():
            started = time.monotonic()
            error, named = await _one(client, model, stream, max_tokens)
            out.append(Outcome(started, time.monotonic(), stream, error, named))
            if think_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), think_s)
    finally:
        await client.close()


async def measure_change(base: str, change: Callable[[], Awaitable[object]], *, clients: int = 2,
                         model: str = "auto", api_key: str = "unused", steady_s: float = 10.0,
                         after_s: float = 10.0, max_tokens: int = 16,
                         think_s: float = 0.0) -> tuple[object, float, float, list[Outcome]]:
    """Run `clients` clients through `change()`; returns (what change returned, when it was called, when it
    returned, every outcome)."""
    stop = asyncio.Event()
    outcomes: list[Outcome] = []
    tasks = [asyncio.create_task(_client(base, api_key, model, i % 2 == 1, stop, outcomes, max_tokens, think_s))
             for i in range(clients)]
    try:
        await asyncio.sleep(steady_s)
        began = time.monotonic()
        result = await change()
        applied = time.monotonic()
        await asyncio.sleep(after_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    return result, began, applied, outcomes


def figures(outcomes: list[Outcome], began: float, applied: float) -> dict[str, Any]:
    """The run's figures: requests and failures, and latency (ms) before, during and after the change. A
    request counts as during the change when it overlapped [began, applied]."""
    def phase(keep: Callable[[Outcome], bool]) -> dict[str, Any]:
        chosen = [o for o in outcomes if keep(o)]
        ms = [1000 * (o.ended - o.started) for o in chosen]
        models: dict[str, int] = {}
        for o in chosen:
            models[o.model or "none"] = models.get(o.model or "none", 0) + 1
        return {"requests": len(chosen), "failed": sum(1 for o in chosen if o.error),
                "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "models": models}

    return {
        "change_s": round(applied - began, 1),
        "requests": len(outcomes),
        "failed": sum(1 for o in outcomes if o.error),
        "errors": sorted({o.error for o in outcomes if o.error})[:5],
        "before": phase(lambda o: o.ended < began),
        "during": phase(lambda o: o.ended >= began and o.started <= applied),
        "after": phase(lambda o: o.started > applied),
    }


def edit_then_reload(base: str, policy: Path, edit: Callable[[str], str], admin_key: str,
                     query: str = "") -> Callable[[], Awaitable[httpx.Response]]:
    """A change: the policy file's text becomes `edit(text)`, then `POST /admin/policy/reload`."""
    async def change() -> httpx.Response:
        text = await asyncio.to_thread(policy.read_text)
        await asyncio.to_thread(policy.write_text, edit(text))
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
            return await client.post(f"{base}/admin/policy/reload{query}",
                                     headers={"authorization": f"Bearer {admin_key}"})

    return change


def reload_after_edit(base: str, policy: Path, old: str, new: str, admin_key: str,
                      query: str = "") -> Callable[[], Awaitable[httpx.Response]]:
    """A change: replace the first `old` in the policy file with `new`, then `POST /admin/policy/reload`."""
    def edit(text: str) -> str:
        if old not in text:
            raise ValueError(f"{old!r} is not in {policy}")
        return text.replace(old, new, 1)

    return edit_then_reload(base, policy, edit, admin_key, query)


def promote_then_reload(base: str, artifact: Path, admin_key: str) -> Callable[[], Awaitable[httpx.Response]]:
    """A change: promote `artifact` into the router store (what `cascade router train` does when the candidate
    wins), then `POST /admin/router/reload` (the store watcher would within its interval)."""
    from router_models.serving.artifact_store import ArtifactStore

    async def change() -> httpx.Response:
        await asyncio.to_thread(ArtifactStore().promote, artifact)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            return await client.post(f"{base}/admin/router/reload", headers={"authorization": f"Bearer {admin_key}"})

    return change


def add_memory_then_wait(base: str, labels: Sequence[Path], tenant: str | None, api_key: str = "unused",
                         artifact: Path | None = None, store: Path | None = None,
                         timeout_s: float = 120.0) -> Callable[[], Awaitable[httpx.Response]]:
    """A change: `labels` (label files) appended to `tenant`'s label memory (None: the shared one) as `cascade router
    memory add` does, then scored requests (`model: auto`, one token, with `api_key`) until one's
    `x-cascade-router-version` names the memory at its new size; returns that answer. Raises `TimeoutError` when
    no answer names it within `timeout_s` (the policy's `learning.label_memory.scope` may not read it)."""
    from router_models.serving.artifact import default_store_dir
    from router_models.training.labels import read_label_rows
    from router_models.training.memory_build import SHARED, add_label_rows, memory_path

    def add() -> tuple[str, int]:
        name = tenant or SHARED
        rows = [row for path in labels for row in read_label_rows(path, tenant=tenant)]
        return name, add_label_rows(rows, memory_path(store or default_store_dir(), name), artifact).after

    async def change() -> httpx.Response:
        name, size = await asyncio.to_thread(add)
        suffix = f"+memory/{name}@{size}"
        ask = {"model": "auto", "max_tokens": 1, "messages": [{"role": "user", "content": "Which memory scores me?"}]}
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=30.0, headers={"authorization": f"Bearer {api_key}"}) as client:
            while True:
                answer = await client.post(f"{base}/v1/chat/completions", json=ask)
                version = answer.headers.get("x-cascade-router-version", "")
                if answer.status_code == 200 and version.endswith(suffix):
                    return answer
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer named ...{suffix} within {timeout_s:g} s (the last: "
                                       f"{answer.status_code}, router version {version or 'none'}); does the "
                                       "policy's learning.label_memory.scope read this memory?")
                await asyncio.sleep(0.1)

    return change


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.scenarios.change", description=__doc__.split("\n\n")[0]
                                if __doc__ else None, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="the gateway's base URL")
    p.add_argument("--policy", type=Path, help="the policy file the gateway serves (with --replace)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--replace", nargs=2, metavar=("OLD", "NEW"),
                      help="the change: the first OLD in the policy file becomes NEW, then the gateway reloads")
    what.add_argument("--promote-canary", metavar="POOL", help="the change: the pool's canary becomes the pool "
                      "(what `cascade pool promote` writes), then the gateway reloads")
    what.add_argument("--rollback-canary", metavar="POOL", help="the change: the pool's canary is removed (what "
                      "`cascade pool rollback` writes), then the gateway reloads")
    what.add_argument("--promote", type=Path, metavar="ARTIFACT",
                      help="the change: promote this router artifact into the store ($CASCADE_HOME/router), "
                      "then the gateway reloads its router")
    what.add_argument("--memory-add", type=Path, action="append", metavar="LABELS",
                      help="the change: this label file (repeatable) appended to the label memory (--tenant's, "
                      "else the shared one) in $CASCADE_HOME/router; applied when an answer names its new size")
    p.add_argument("--tenant", default=None, help="with --memory-add: the tenant whose memory grows (default: shared)")
    p.add_argument("--admin-key", default=None, help="the gateway's admin key (CASCADE_ADMIN_KEY; every change but "
                   "--memory-add reloads through the admin API)")
    p.add_argument("--api-key", default="unused", help="the clients' key (the tenant's, for a tenant's memory)")
    p.add_argument("--model", default="auto", help="what the clients ask for (default: auto)")
    p.add_argument("--clients", type=int, default=2, help="concurrent clients, every second one streams")
    p.add_argument("--steady", type=float, default=10.0, help="seconds of traffic before the change")
    p.add_argument("--after", type=float, default=10.0, help="seconds of traffic after it")
    p.add_argument("--think", type=float, default=0.0, help="seconds each client pauses between its requests")
    args = p.parse_args(argv)
    if args.memory_add is None and args.admin_key is None:
        p.error("--admin-key is needed to reload (every change but --memory-add)")
    if args.memory_add is not None:
        change = add_memory_then_wait(args.url, args.memory_add, args.tenant, args.api_key)
    elif args.promote is not None:
        change = promote_then_reload(args.url, args.promote, args.admin_key)
    elif args.policy is None:
        p.error("--replace, --promote-canary and --rollback-canary need --policy")
    elif args.promote_canary or args.rollback_canary:
        from policies.canary_edit import promote_canary, remove_canary

        pool = args.promote_canary or args.rollback_canary
        edit = promote_canary if args.promote_canary else remove_canary
        change = edit_then_reload(args.url, args.policy, lambda text: edit(text, pool), args.admin_key)
    else:
        old, new = args.replace
        change = reload_after_edit(args.url, args.policy, old, new, args.admin_key)
    response, began, applied, outcomes = asyncio.run(measure_change(
        args.url, change, clients=args.clients, model=args.model, api_key=args.api_key, steady_s=args.steady,
        after_s=args.after, think_s=args.think))
    assert isinstance(response, httpx.Response)
    result = figures(outcomes, began, applied)
    if args.memory_add is None:
        result["reload_status"] = response.status_code
    else:  # the first answer the grown memory moved
        result["router_version"] = response.headers.get("x-cascade-router-version", "")
    print(json.dumps(result, indent=2))
    return 0 if response.status_code == 200 and not result["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
