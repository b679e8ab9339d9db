"""`cascade policy ...`: validate, schema, explain, replay. Heavy imports happen inside the commands.

- `validate FILE`: exit 0 and a summary, or exit 1 with every problem on stderr (a tier's placement that cannot be
  loaded too);
- `schema`: the JSON Schema of the policy file (for editors);
- `explain FILE (--prompt TEXT | --request BODY.json) [--tenant T] [--model M] [--score S] [--header K:V]
  [--threshold T | --gateway URL | --redis-url URL [--prefix P]] [--quality POOL=Q,...] [--tradeoff X]`:
  the score (the shipped classifier unless --score, moved by the label memory the gateway would apply or
  `--memory NAME`: `gateway.cli.policy_memory`), every rule tried and why it did or did not match,
  the decision, its route (each step that chose or changed the pool, as `x-cascade-route` names them; the context
  step on the prompt's estimated tokens and the body's completion limit), and for a local pool the engine command
  of its first replica; with `routing.tiers`, every tier's predicted quality and expected cost and the trade;
  with `--gateway` (its `/readyz`) or `--redis-url` (the shared score window and ladder the
  gateways compute it from), the routing threshold a running gateway uses, and where it came from (initial,
  share-held, ladder-raised: `gateway.cli.policy_live`), instead of the file's; with `routing.tiers`, its tradeoff
  too (policy, per-request, window-held) unless `--tradeoff` is given;
- `status [--gateway URL]`: what a running gateway serves beside what its policy file holds, its last reload and,
  from `/metrics`, the reloads by result and every worker's served version
  (`gateway.cli.policy_live`); exit 1 when the file no longer matches what is served;
- `replay FILE --log requests.jsonl [--against OTHER.yaml] [--threshold T]`: see `policies.replay` for the log
  format. A `flagship_share` threshold is live only in the gateway: offline, its `initial` (or `--threshold`)
  is used, and the output says so.

Exit codes: 0 ok, 1 invalid input (policy, log, request), a refused request, a gateway that cannot be asked, or
(`status`) a file that does not match what is served; 2 (`status`) a gateway that cannot be asked.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from policies.loader import LoadedPolicy, PolicyError, load_policy

__all__ = ["register", "unit_interval"]


def _load(path: str) -> LoadedPolicy | None:
    """The policy at `path` checked as `cascade serve` would check it here: the file, then what this machine
    has (quantized checkpoints within their ceilings). Prints every problem and returns None if any."""
    from backends.machine_checks import checked_here
    from gateway.serving.routing.placements import with_placements

    try:
        return checked_here(with_placements(load_policy(path)))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return None


def _validate(args: argparse.Namespace) -> int:
    loaded = _load(args.file)
    if loaded is None:
        return 1
    policy = loaded.policy
    pools = ", ".join(f"{n} ({p.type}{', embedding' if p.kind == 'embedding' else ''})"
                      for n, p in policy.pools.items())
    print(f"{args.file}: valid (version {loaded.version}); pools: {pools}; rules: {len(policy.routing.rules)}; "
          f"tenants: {len(policy.tenants)}; ladder steps: {len(policy.degradation.steps)}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from policies.schema import Policy

    print(json.dumps(Policy.model_json_schema(), indent=2))
    return 0


def _request_body(args: argparse.Namespace) -> dict[str, Any]:
    if args.request is not None:
        try:
            body = json.loads(Path(args.request).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{args.request}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        if not isinstance(body, dict):
            raise ValueError(f"{args.request}: must hold a JSON object (a chat-completions body)")
        return body
    return {"model": args.model, "messages": [{"role": "user", "content": args.prompt}]}


def _headers(given: list[str]) -> dict[str, str]:
    """`--header NAME:VALUE` options as a dict (names and values stripped)."""
    headers = {}
    for item in given:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"--header {item!r}: write it as NAME:VALUE, e.g. --header 'x-plan: premium'")
        headers[name.strip()] = value.strip()
    return headers


def _engine_lines(loaded: LoadedPolicy, pool: str) -> list[str]:
    spec = loaded.policy.pools[pool]
    if spec.type != "local":
        key = f"key from ${spec.api_key_env}" if spec.api_key_env else "no API key"
        return [f"remote:   {', '.join(spec.urls)} (model {spec.model!r}, {key})"]
    from backends.engines.args import engine_command, engine_env

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(engine_env(spec.engine).items()))
    command = shlex.join(engine_command(spec.engine, spec.engine.base_port))
    lines = [f"engine:   replica 1 of {spec.engine.replicas} on port {spec.engine.base_port}:", f"  {env} {command}"]
    if spec.engine.speculative is not None:
        from policies.speculative import describe

        lines += describe(spec.engine.speculative)
    if spec.on_demand is not None:
        od = spec.on_demand
        lines.append(f"on demand: starts on the first request (waits up to {od.cold_start_timeout_s:g} s, "
                     f"on_cold {od.on_cold}), stops after {od.idle_stop_after_s:g} s idle")
    return lines


def _status(args: argparse.Namespace) -> int:
    from gateway.cli.policy_live import run_status

    return run_status(args)


def _explain(args: argparse.Namespace) -> int:
    from backends.machine_checks import quant_lines
    from gateway.cli.policy_memory import scored
    from gateway.cli.policy_tiers import explain_trade
    from policies.context import RouteContext
    from policies.decide import needs_score
    from policies.explain import explain, render_explanation
    from policies.threshold import offline_note

    loaded = _load(args.file)
    if loaded is None:
        return 1
    try:
        body = _request_body(args)
        headers = _headers(args.header)
    except (OSError, ValueError) as exc:
        print(f"bad request: {exc}", file=sys.stderr)
        return 1
    if args.score is not None and not 0 <= args.score <= 1:
        print(f"--score must be within [0, 1], got {args.score}", file=sys.stderr)
        return 1
    ctx = RouteContext.from_request(body, args.tenant, headers)
    used = _live_threshold(args, loaded)
    if isinstance(used, str):
        print(f"cascade policy explain: {used}", file=sys.stderr)
        return 1
    threshold, ladder, notes, traded = used
    if traded is not None and args.tradeoff is None:  # the running gateway's, where it holds one
        args = argparse.Namespace(**{**vars(args), "tradeoff": traded})
    score, source = args.score, "given"
    try:
        if score is None and needs_score(loaded.policy, ctx):
            score, source = scored(loaded, ctx, body.get("messages") or [], args, threshold)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    completion = limit if isinstance(limit, int) and limit > 0 else 1
    try:
        trade = explain_trade(loaded, ctx, body.get("messages") or [], args)
    except (ValueError, PolicyError) as exc:
        print(exc, file=sys.stderr)
        return 1
    exp = explain(loaded, ctx, score, ladder=ladder, threshold=threshold, completion=completion, trade=trade)
    if not notes:
        from gateway.cli.policy_tiers import offline_tradeoff_note

        found = (offline_note(args.file, loaded.policy.routing.threshold, args.threshold, live=True),
                 offline_tradeoff_note(args.file, loaded.policy, args.tradeoff))
        notes = [note for note in found if note]
    lines = render_explanation(exp, source) + notes + quant_lines(loaded.policy)
    if exp.decision is not None:
        lines += _engine_lines(loaded, exp.decision.pool)
    print("\n".join(lines))
    return 0 if exp.decision is not None else 1


def _live_threshold(args: argparse.Namespace,
                    loaded: LoadedPolicy) -> tuple[float | None, Any, list[str], float | None] | str:
    """(routing threshold, ladder state, note lines, tradeoff) to explain with: `--threshold` or the file's (no notes,
    no tradeoff: `--tradeoff` or the file's), or a running gateway's (`--gateway`, `--redis-url`; the tradeoff None
    where its tiers policy solves each request alone, as explain does); a message when it cannot be asked."""
    if args.gateway is None and args.redis_url is None:
        return args.threshold, None, [], None
    from gateway.cli.policy_live import gateway_threshold
    from policies.ladder import LadderState

    live = gateway_threshold(loaded, args.gateway, args.redis_url, args.prefix)
    if isinstance(live, str):
        return live
    in_use = live.in_use
    notes = [f"threshold in use: {in_use.describe()}, read from {live.where}"]
    traded = live.tradeoff if loaded.policy.routing.tiers else None
    if traded is not None:
        given = " (--tradeoff given: that one is used here)" if args.tradeoff is not None else ""
        notes.append(f"tradeoff in use: {traded.describe()}, read from {live.where}{given}")
    if live.version is not None and live.version != loaded.version:
        notes.append(f"note: the gateway serves policy version {live.version}; {args.file} is version "
                     f"{loaded.version} (its rules are the ones explained here; `cascade policy status` says why)")
    raised = LadderState(threshold=in_use.value, threshold_step=in_use.ladder_step) if in_use.ladder_step else None
    return in_use.routing, raised, notes, None if traded is None else traded.value


def _replay(args: argparse.Namespace) -> int:
    from policies.replay import LogError, parse_log, render_replay, replay
    from policies.threshold import offline_note

    loaded = _load(args.file)
    against = _load(args.against) if args.against else None
    if loaded is None or (args.against and against is None):
        return 1
    try:
        with open(args.log, encoding="utf-8") as fh:
            entries = parse_log(fh, args.log)
    except (OSError, LogError) as exc:
        print(f"bad log: {exc}", file=sys.stderr)
        return 1
    if against is None:
        result, names = replay(entries, loaded, thresholds=(args.threshold, None)), ("recorded", args.file)
    else:
        result = replay(entries, against, baseline=loaded, thresholds=(None, args.threshold))
        names = (args.file, args.against)
    notes = [offline_note(args.file, loaded.policy.routing.threshold, args.threshold)]
    if against is not None:
        notes.append(offline_note(args.against, against.policy.routing.threshold, None))
    print("\n".join(render_replay(result, *names) + [n for n in notes if n]))
    return 0


def _qualities(text: str) -> dict[str, float]:
    from gateway.cli.policy_tiers import given_qualities

    return given_qualities(text)


def unit_interval(text: str) -> float:
    """argparse type: a number within [0, 1], else a clear usage error."""
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {value}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `policy` command and its sub-commands; each sets `func(args) -> int` (the exit code)."""
    p = subparsers.add_parser("policy", help="check, inspect and replay routing policies")
    sub = p.add_subparsers(dest="policy_cmd", required=True)
    v = sub.add_parser("validate", help="check a policy file; exit 1 with every problem listed")
    v.add_argument("file")
    v.set_defaults(func=_validate)
    sub.add_parser("schema", help="print the policy JSON Schema (for editors)").set_defaults(func=_schema)
    e = sub.add_parser("explain", help="show how a policy routes one request, rule by rule")
    e.add_argument("file")
    what = e.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="a single user message")
    what.add_argument("--request", help="a JSON file holding a chat-completions body")
    e.add_argument("--tenant", default="default")
    e.add_argument("--model", default="auto", help="requested model with --prompt (default: auto)")
    e.add_argument("--score", type=float, help="use this score instead of running the classifier")
    e.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="a request header")
    used = e.add_mutually_exclusive_group()
    used.add_argument("--threshold", type=unit_interval, help="routing threshold to use (default: the policy's float, "
                      "or its flagship-share form's `initial`)")
    used.add_argument("--gateway", metavar="URL", help="use the threshold this running gateway routes with (its "
                      "/readyz), and say where it came from")
    used.add_argument("--redis-url", metavar="URL", help="use the threshold the gateways on this Redis route with "
                      "(their shared score window and ladder)")
    e.add_argument("--prefix", default=os.environ.get("CASCADE_REDIS_PREFIX", "cascade:"),
                   help="the gateways' key prefix with --redis-url (default: $CASCADE_REDIS_PREFIX or cascade:)")
    e.add_argument("--quality", type=_qualities, metavar="POOL=Q,...", help="with routing.tiers: each tier's "
                   "predicted quality instead of the classifier's pool map")
    e.add_argument("--tradeoff", type=float, help="with routing.tiers: the tradeoff to decide with (default: the "
                   "policy's; a cost_per_1k policy: solved on this request)")
    e.add_argument("--memory", metavar="NAME", default=None, help="move the classifier's score (and, with "
                   "routing.tiers, each tier's predicted quality) by this label memory, as the gateway does: the "
                   "label memory (\"shared\" or a tenant's; default: the one the policy's learning.label_memory.scope "
                   "gives --tenant)")
    e.add_argument("--store", type=Path, default=None, help="the store label memories live in (<store>/memory; "
                   "default $CASCADE_HOME/router)")
    e.set_defaults(func=_explain)
    st = sub.add_parser("status", help="what a running gateway serves beside what its policy file holds, its last "
                        "reload and its routing threshold; exit 1 when the file does not match")
    st.add_argument("--gateway", metavar="URL", default="http://127.0.0.1:8080",
                    help="the gateway (default: http://127.0.0.1:8080, as `cascade serve`)")
    st.set_defaults(func=_status)
    r = sub.add_parser("replay", help="replay a request log: pool moves (from -> to) and cost difference")
    r.add_argument("file")
    r.add_argument("--log", required=True, help="JSON Lines request log (format: policies/replay.py)")
    r.add_argument("--against", help="compare FILE with this policy instead of with the recorded pools")
    r.add_argument("--threshold", type=unit_interval,
                   help="route FILE with this routing threshold (default: its float, or its flagship-share form's "
                   "`initial`)")
    r.set_defaults(func=_replay)
