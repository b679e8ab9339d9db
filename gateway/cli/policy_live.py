"""What a running gateway serves, for `cascade policy status` and `cascade policy explain --gateway|--redis-url`.

- `status --gateway URL`: the answering process's `/readyz` (`gateway.control.policy.policy_file`): the version it
  serves and since when, the version the file holds now, the last reload's error with every problem, and the routing
  threshold it uses and where it came from. Exit 0 when the file holds the version served, 1 when it does not (an edit
  rejected or not applied yet: what runs is the policy before), 2 when the gateway cannot be asked. Under `--workers N`
  each `/readyz` answer is one worker's (it names itself; every worker reloads by itself), so `status` also reads
  `/metrics` (`gateway.cli.policy_metrics`): the reloads by result, summed over the workers, and each worker's served
  version, since when and whether its file matches (exit 1 when any does not).
- The threshold a gateway uses (`gateway_threshold`), asked from its `/readyz` or worked out from its Redis (the
  shared score window and the ladder's active steps, as every gateway process computes it); for a tiers policy,
  the tradeoff it trades with too (`/readyz`'s `routing.tradeoff`, or the shared trade window).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

import httpx

from gateway.control.adaptation.ladder_sync import LadderSync
from gateway.control.adaptation.live_threshold import WindowState, window_key, window_state
from gateway.control.adaptation.live_tradeoff import WINDOW, TradeoffInUse, tradeoff_in_use, trades_key
from gateway.redis_client import run_with_redis
from policies.ladder_schema import RaiseThreshold
from policies.loader import LoadedPolicy
from policies.threshold import ThresholdInUse, share_target, threshold_in_use

__all__ = ["GatewayThreshold", "gateway_threshold", "run_status", "status_lines"]


def _when(epoch: float | None) -> str:
    return "-" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _readyz(url: str) -> dict[str, Any] | str:
    """The gateway's `/readyz` body (answered with 200 or 503), or why it could not be read."""
    try:
        reply = httpx.get(url.rstrip("/") + "/readyz", timeout=10.0)
        body = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"cannot read {url}/readyz: {exc}"
    if not isinstance(body, dict) or reply.status_code not in (200, 503):
        return f"{url}/readyz answered {reply.status_code}: not a cascade gateway's readiness"
    return body


def status_lines(url: str, body: dict[str, Any]) -> tuple[list[str], bool]:
    """The lines `status` prints for a `/readyz` body (the to-do line apart), and whether the policy file holds the
    version served."""
    policy, routing = body.get("policy") or {}, body.get("routing") or {}
    lines = [f"gateway {url}: {body.get('status', 'ready' if body.get('ready') else 'not_ready')} "
             f"(worker {body.get('worker', '-')})",
             f"policy served: {policy.get('served_version', body.get('policy_version'))} since "
             f"{_when(policy.get('served_since'))} from {policy.get('source', '-')}"]
    matches = bool(policy.get("matches_file", True))
    on_disk = policy.get("file_version") or "unreadable"
    lines.append(f"policy file:   {on_disk} " + ("(matches what is served)" if matches else
                                                  "(does NOT match what is served: the policy before still runs)"))
    error = policy.get("last_error")
    if error:
        lines.append(f"last reload:   {error['result']} at {_when(error['at'])}: {error['message']}")
        lines += [f"  {problem}" for problem in error.get("problems", [])]
    elif policy.get("last_reload_at") is not None:
        lines.append(f"last reload:   ok at {_when(policy['last_reload_at'])}")
    if not matches and not error and policy.get("reason"):
        lines.append(f"why:           {policy['reason']}")
    if routing:
        lines.append(f"threshold:     {routing['description']}")
        if routing.get("tradeoff"):
            lines.append(f"tradeoff:      {routing['tradeoff']['description']}")
    return lines, matches


_TO_DO = ("to do: fix the file (`cascade policy validate FILE` lists every problem), or put the served version back; "
          "the gateway looks at the file again by itself (POST /admin/policy/reload with CASCADE_ADMIN_KEY to do it "
          "now)")


def run_status(args: argparse.Namespace) -> int:
    from gateway.cli.policy_metrics import read_policy_series, series_lines

    body = _readyz(args.gateway)
    if isinstance(body, str):
        print(f"cascade policy status: {body}", file=sys.stderr)
        return 2
    lines, matches = status_lines(args.gateway, body)
    series = read_policy_series(args.gateway)  # every worker's view, whichever answered /readyz
    if isinstance(series, str):
        lines.append(f"metrics:       not read ({series})")
    else:
        lines += series_lines(series)
        matches = matches and series.all_match
    print("\n".join(lines if matches else [*lines, _TO_DO]))
    return 0 if matches else 1


class GatewayThreshold:
    """A running gateway's threshold: `in_use`, the policy version it serves (None: read from Redis, which does
    not say), where it was read (`where`), and for a tiers policy the tradeoff its trades are made with
    (`tradeoff`; None without tiers, or from a gateway of a version before)."""

    def __init__(self, in_use: ThresholdInUse, version: str | None, where: str,
                 tradeoff: TradeoffInUse | None = None) -> None:
        self.in_use, self.version, self.where, self.tradeoff = in_use, version, where, tradeoff


def _tradeoff(found: dict[str, Any] | None) -> TradeoffInUse | None:
    if not found:
        return None
    return TradeoffInUse(found["value"], found["source"], found.get("samples"), found.get("cost_per_1k_usd"))


def gateway_threshold(loaded: LoadedPolicy, gateway: str | None, redis_url: str | None,
                      prefix: str) -> GatewayThreshold | str:
    """The threshold (and a tiers policy's tradeoff) the gateway at `gateway` (its `/readyz`), or the gateways on
    `redis_url` and `prefix`, route `loaded`'s requests with; a message (what went wrong) otherwise."""
    if gateway is not None:
        body = _readyz(gateway)
        if isinstance(body, str):
            return body
        routing = body.get("routing")
        if not routing:
            return f"{gateway}/readyz carries no routing threshold (a gateway of a version before this one)"
        in_use = ThresholdInUse(routing["threshold"], routing["source"], routing["routing_threshold"],
                                routing["routing_source"], routing.get("samples"), routing.get("ladder_step"))
        return GatewayThreshold(in_use, routing.get("policy_version"), f"{gateway}/readyz",
                                _tradeoff(routing.get("tradeoff")))
    assert redis_url is not None
    found = run_with_redis(redis_url, "cascade policy explain", lambda client: _from_redis(client, loaded, prefix),
                           socket_timeout_s=10.0)
    if found is None:
        return "the gateways' Redis could not be read (see above)"
    return GatewayThreshold(found[0], None, f"Redis prefix {prefix!r}", found[1])


def _texts(raw: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in raw]


async def _from_redis(client: Any, loaded: LoadedPolicy, prefix: str) -> tuple[ThresholdInUse, TradeoffInUse | None]:
    """As a gateway process computes them: the shared score window's scores and the ladder's active raise_threshold
    steps; a tiers policy's tradeoff from the shared trade window."""
    policy = loaded.policy
    target = share_target(policy.routing.threshold)
    state = WindowState()
    if target is not None:
        state = window_state(target, _texts(await client.lrange(window_key(prefix), 0, target.window - 1)))
    active = await LadderSync(client, prefix).read_state() or {}
    raises = [(s.action.threshold, s.name) for s in policy.degradation.steps
              if s.name in active and isinstance(s.action, RaiseThreshold)]
    top = max(raises, default=None)
    trades = (_texts(await client.lrange(trades_key(prefix), 0, WINDOW - 1))
              if policy.routing.cost_per_1k is not None else [])
    return (threshold_in_use(policy.routing.threshold, state.threshold, state.samples,
                             None if top is None else top[0], None if top is None else top[1]),
            tradeoff_in_use(policy, trades))
