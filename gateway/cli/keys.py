"""`cascade keys create|list|revoke`: API keys ops issue at run time (`gateway.tenancy.api_keys`), in the Redis of
the gateways (`--redis-url`, `--prefix`: the gateway's own, from the same environment variables).

`create` prints the key's description, then the key itself on its last line: it is shown once and never stored. It
refuses a tenant the policy (`--policy`, the file the gateways serve) does not serve, saying what to do;
`--allow-unknown` creates the key anyway, with a warning on stderr. Without `--policy` it checks against the demo
policy (as `cascade serve` serves by default) and says so on stderr, whatever the outcome.
Exit codes: 0 fine, 1 `revoke` found no such key, 2 usage error, unknown tenant, unreadable policy or Redis
unreachable (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson

from gateway.redis_client import run_with_redis
from gateway.settings import argparse_type
from gateway.tenancy.api_keys import ApiKey, KeyStore, unknown_tenant
from policies.loader import PolicyError, default_policy_path, load_policy
from policies.money import usd_to_micro
from policies.schema import RateLimits

__all__ = ["parse_expiry", "register"]

T = TypeVar("T")


def parse_expiry(text: str, now: datetime | None = None) -> float:
    """UTC epoch seconds of `--expires`: a duration from now (`90d`, `12h`, `30m`) or an ISO 8601 date or time
    (UTC unless it says otherwise)."""
    now = now or datetime.now(UTC)
    units = {"d": "days", "h": "hours", "m": "minutes"}
    if text[:-1].isdigit() and text[-1:] in units:
        return (now + timedelta(**{units[text[-1]]: int(text[:-1])})).timestamp()
    when = datetime.fromisoformat(text)
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def register(subparsers: Any) -> None:
    """Add `keys create|list|revoke` to a `cascade` subparsers object."""
    keys = subparsers.add_parser("keys", help="API keys issued and revoked at run time (stored hashed in Redis)")
    leaves = keys.add_subparsers(dest="keys_command", required=True)
    create = leaves.add_parser("create", help="issue a key; its last line of output is the key, shown once")
    create.add_argument("--tenant", required=True, help="the policy tenant the key calls as")
    create.add_argument("--name", default="", help="what the key is for (shown by list)")
    create.add_argument("--rpm", type=argparse_type(_positive, "rpm"), help="the key's own requests per minute")
    create.add_argument("--tpm", type=argparse_type(_positive, "tpm"), help="the key's own tokens per minute")
    create.add_argument("--daily-usd", type=argparse_type(usd_to_micro, "daily_usd"),
                        help="the key's own daily budget in USD (inside the tenant's)")
    create.add_argument("--policy", help="the policy file the gateways serve, whose tenants a key may name "
                        "(default: the demo policy, as for `cascade serve`, with a note saying so)")
    create.add_argument("--allow-unknown", action="store_true",
                        help="create the key even for a tenant the policy does not name (warns)")
    create.add_argument("--expires", type=argparse_type(parse_expiry, "expires"),
                        help="when it stops working: 90d, 12h, 30m, or an ISO 8601 date or time (UTC)")
    create.set_defaults(func=_run_create)
    listing = leaves.add_parser("list", help="issued keys (never the keys themselves)")
    listing.add_argument("--tenant", help="only this tenant's")
    listing.add_argument("--json", action="store_true", help="one JSON object per key")
    listing.set_defaults(func=_run_list)
    revoke = leaves.add_parser("revoke", help="refuse a key from now on (401 within a second everywhere)")
    revoke.add_argument("key", metavar="KEY_OR_ID", help="the key, or its id from list")
    revoke.set_defaults(func=_run_revoke)
    for leaf in (create, listing, revoke):
        leaf.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                          help="default: $CASCADE_REDIS_URL or redis://127.0.0.1:6379/0")
        leaf.add_argument("--prefix", default=os.environ.get("CASCADE_REDIS_PREFIX", "cascade:"),
                          help="the gateway's key prefix (default: $CASCADE_REDIS_PREFIX or cascade:)")


def _describe(key: ApiKey) -> str:
    def when(epoch: float | None) -> str:
        return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    limits = key.limits
    budget = "-" if key.daily_usd is None else f"{key.daily_usd / 1e6:.6f}"
    state = "revoked" if key.revoked_at is not None else ("expired" if key.refusal(datetime.now(UTC).timestamp())
                                                          else "active")
    return (f"{key.id}  tenant={key.tenant}  name={key.name or '-'}  state={state}  created={when(key.created_at)}  "
            f"expires={when(key.expires_at)}  rpm={limits.requests_per_minute or '-'}  "
            f"tpm={limits.tokens_per_minute or '-'}  daily_usd={budget}")


def _defaulted_note(path: str) -> str:
    """What a check against the demo policy is worth: `--policy` was not given, and the gateways may serve another."""
    return (f"cascade keys: note: no --policy given, so the tenant was checked against the demo policy {path}; a "
            "gateway serving another policy may refuse the key (401): pass --policy with the file your gateways "
            "serve (their `cascade serve --policy`)")


def _tenant_refused(args: argparse.Namespace) -> bool:
    """Whether `create` must stop: the policy is unreadable, or does not serve the tenant and `--allow-unknown` is
    not given (one message on stderr either way; a warning when it is given). Without `--policy` the demo policy is
    read and every outcome says so: a key checked against a policy no gateway serves would only fail when used."""
    path = args.policy or str(default_policy_path())
    try:
        loaded = load_policy(path)
    except PolicyError as exc:
        print(f"cascade keys: {exc}\npass --policy with the file the gateways serve", file=sys.stderr)
        return True
    problem = unknown_tenant(args.tenant, loaded.policy.tenants, loaded.source)
    refused = problem is not None and not args.allow_unknown
    if problem is not None:
        print(f"cascade keys: {problem}; or pass --allow-unknown to create the key anyway" if refused
              else f"cascade keys: warning: created anyway: {problem.why}", file=sys.stderr)
    if not args.policy:
        print(_defaulted_note(path), file=sys.stderr)
    return refused


def _run_create(args: argparse.Namespace) -> int:
    if _tenant_refused(args):
        return 2
    limits = RateLimits(requests_per_minute=args.rpm, tokens_per_minute=args.tpm)
    created = _with_store(args, lambda store: store.create(args.tenant, args.name, limits=limits,
                                                           daily_usd=args.daily_usd, expires_at=args.expires))
    if created is None:
        return 2
    secret, key = created
    sys.stdout.write(f"created {_describe(key)}\n{secret}\n")
    return 0


def _run_list(args: argparse.Namespace) -> int:
    keys = _with_store(args, lambda store: store.list(args.tenant))
    if keys is None:
        return 2
    for key in keys:
        sys.stdout.write((orjson.dumps(key.public()).decode() if args.json else _describe(key)) + "\n")
    return 0


def _run_revoke(args: argparse.Namespace) -> int:
    found = _with_store(args, lambda store: _revoke(store, args.key))
    if found is None:
        return 2
    if not found:
        print(f"cascade keys: no issued key matches {args.key[:16]!r}", file=sys.stderr)
        return 1
    sys.stdout.write(f"revoked {_describe(found[0])}\n")
    return 0


async def _revoke(store: KeyStore, key_or_id: str) -> list[ApiKey]:
    key = await store.revoke(key_or_id)
    return [] if key is None else [key]


def _with_store(args: argparse.Namespace, work: Callable[[KeyStore], Awaitable[T]]) -> T | None:
    """Run `work` on a store over a client closed here; None after a one-line error on stderr."""
    return run_with_redis(args.redis_url, "cascade keys", lambda client: work(KeyStore(client, args.prefix)),
                          socket_timeout_s=10.0)
