"""`cascade pool ...`: a pool's canary, compared, promoted or rolled back.

- `compare POOL`: the pool's engine versions side by side from the ledger (`gateway.costs.versions`).
- `promote POOL`: the policy file's pool engine becomes its canary's engine and the canary goes; the gateway then
  makes the running canary the pool without starting anything (`gateway.control.fleet.pool_set`).
- `rollback POOL`: the canary goes from the policy file; the gateway drains and stops it.

Both edits touch only that pool's lines (`policies.canary_edit`), are validated before they are kept, and are
applied by the gateway's file watcher, or at once with `--gateway URL` (`POST /admin/policy/reload`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from policies.loader import LoadedPolicy, PolicyError, load_policy, parse_policy

__all__ = ["register"]


def _load(path: Path, pool: str) -> LoadedPolicy | str:
    try:
        loaded = load_policy(path)
    except PolicyError as exc:
        return str(exc)
    if pool not in loaded.policy.pools:
        return f"{path}: no pool {pool!r} (pools: {', '.join(sorted(loaded.policy.pools))})"
    return loaded


def _canary_of(loaded: LoadedPolicy, pool: str) -> Any:
    spec = loaded.policy.pools[pool]
    return spec.canary if spec.type == "local" else None


def _compare(args: argparse.Namespace) -> int:
    from gateway.costs.versions import compare_versions, render_comparison
    from gateway.redis_client import REDIS_FAILURES, redis_from_url
    from policies.pools import engine_version

    loaded = _load(args.policy, args.pool)
    if isinstance(loaded, str):
        print(f"cascade pool compare: {loaded}", file=sys.stderr)
        return 1
    spec = loaded.policy.pools[args.pool]
    roles = {engine_version(spec.engine): "pool"} if spec.type == "local" else {}
    canary = _canary_of(loaded, args.pool)
    if canary is not None:
        roles[engine_version(canary.engine)] = f"canary {canary.weight:.0%}"

    async def run() -> str:
        client = redis_from_url(args.redis_url, socket_connect_timeout=2.0, socket_timeout=30.0)
        try:
            rows = await compare_versions(client, args.prefix, args.pool, args.hours)
        finally:
            await client.aclose()
        return render_comparison(args.pool, rows, roles, args.hours)

    try:
        print(asyncio.run(run()))
    except REDIS_FAILURES as exc:
        print(f"cascade pool compare: the ledger's Redis is unreachable or failing: {exc}", file=sys.stderr)
        return 2
    return 0


def _edit(args: argparse.Namespace, promote: bool) -> int:
    from policies.canary_edit import CanaryEditError, promote_canary, remove_canary

    verb = "promote" if promote else "rollback"
    loaded = _load(args.policy, args.pool)
    if isinstance(loaded, str):
        print(f"cascade pool {verb}: {loaded}", file=sys.stderr)
        return 1
    canary = _canary_of(loaded, args.pool)
    if canary is None:
        print(f"cascade pool {verb}: pool {args.pool!r} has no canary in {args.policy}; nothing changed",
              file=sys.stderr)
        return 1
    before = args.policy.read_text(encoding="utf-8")
    try:
        after = promote_canary(before, args.pool) if promote else remove_canary(before, args.pool)
    except CanaryEditError as exc:
        print(f"cascade pool {verb}: {args.policy}: {exc}", file=sys.stderr)
        return 1
    problem = _check(args.policy, after, args.pool, canary.engine if promote else None)
    if problem is not None:
        print(f"cascade pool {verb}: {problem}; {args.policy} left unchanged", file=sys.stderr)
        return 1
    args.policy.write_text(after, encoding="utf-8")
    did = "its engine is now its canary's" if promote else "its canary is removed"
    print(f"pool {args.pool}: {did} in {args.policy} (validated)")
    return _reload(args) if args.gateway else _watched(args)


def _check(path: Path, text: str, pool: str, engine: Any) -> str | None:
    """Why the edited `text` is not what was meant (None: it is)."""
    try:
        loaded = parse_policy(text, source=str(path))
    except PolicyError as exc:
        return f"the edited policy does not validate:\n{exc}"
    spec = loaded.policy.pools.get(pool)
    if spec is None or spec.type != "local" or spec.canary is not None:
        return "the edit did not remove the canary as expected (edit the policy by hand)"
    if engine is not None and spec.engine != engine:
        return "the edit did not give the pool its canary's engine as expected (edit the policy by hand)"
    return None


def _watched(args: argparse.Namespace) -> int:
    print("a gateway serving this file applies it at its next policy check (or run with --gateway URL)")
    return 0


def _reload(args: argparse.Namespace) -> int:
    import httpx

    key = os.environ.get(args.admin_key_env, "")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        reply = httpx.post(args.gateway.rstrip("/") + "/admin/policy/reload", headers=headers, timeout=None)
    except httpx.HTTPError as exc:
        print(f"cascade pool: the gateway at {args.gateway} did not answer: {exc}; the file watcher will apply the "
              "edit", file=sys.stderr)
        return 2
    if reply.status_code != 200:
        print(f"cascade pool: the gateway refused the reload ({reply.status_code}): {reply.text}", file=sys.stderr)
        return 1
    print(f"the gateway at {args.gateway} applied it")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from policies.loader import default_policy_path

    p = subparsers.add_parser("pool", help="compare, promote or roll back a pool's canary",
                              description="A pool's canary (policy `canary: {engine: ..., weight: ...}`): compare "
                              "its figures with the pool's, promote it, or roll it back (docs/upgrades.md).")
    sub = p.add_subparsers(dest="pool_cmd", required=True, metavar="COMMAND")
    c = sub.add_parser("compare", help="the pool's engine versions side by side, from the ledger")
    e = [sub.add_parser("promote", help="make the canary the pool (no engine starts: the running canary takes over)"),
         sub.add_parser("rollback", help="remove the canary (it drains, then stops)")]
    for parser in (c, *e):
        parser.add_argument("pool", help="pool name")
        parser.add_argument("--policy", type=Path, default=default_policy_path(),
                            help="policy file (default: the embedded default)")
    c.add_argument("--hours", type=float, default=24.0, help="window, hours back from now (default: 24)")
    c.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="the ledger's Redis (default: $CASCADE_REDIS_URL or redis://127.0.0.1:6379/0)")
    c.add_argument("--prefix", default="cascade:", help="ledger key prefix (default: cascade:)")
    c.set_defaults(func=_compare)
    for parser, promote in zip(e, (True, False), strict=True):
        parser.add_argument("--gateway", help="apply at once: POST /admin/policy/reload to this gateway URL")
        parser.add_argument("--admin-key-env", default="CASCADE_ADMIN_KEY",
                            help="environment variable holding the admin key (default: CASCADE_ADMIN_KEY)")
        parser.set_defaults(func=lambda args, promote=promote: _edit(args, promote))
