"""`cascade router calibrate`: set the routing threshold from a request log of the user's own traffic.

Reads the log `cascade serve --request-log FILE` writes (format: `policies.replay`), keeps the scored
`model: auto` requests, and finds the threshold for `--flagship-share X` or `--cost-per-1k USD` (math:
`router_models.training.calibrate`; each request priced on the policy's micro and flagship pools with the same
`Price.cost_micro_usd` the ledger uses). Prints the threshold, the flagship share and cost per 1,000
requests it gives on the log, and the quality kept from the artifact's evaluation curve when it has one.
`--write` sets `routing.threshold` in the policy file (one line) and re-validates it.

Registered under the `router` command by `register`, from `gateway.cli.main` (it needs the policy's prices,
which `router_models` may not import). Exit codes: 0 done, 1 invalid policy or target, 2 unusable log.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.loader import LoadedPolicy, PolicyError, load_policy
from policies.money import usd_to_micro
from policies.replay import LogEntry, parse_line
from router_models.training.calibrate import (
    Calibration,
    CalibrationError,
    cost_per_1k,
    cost_threshold,
    share_threshold,
    shown_threshold,
)

__all__ = ["LogSample", "read_sample", "register"]

_SHOWN_BAD_LINES = 5


@dataclass
class LogSample:
    """The usable requests of a log (scores and both pools' costs, micro-USD) and what was skipped."""

    scores: list[float] = field(default_factory=list)
    micro_costs: list[int] = field(default_factory=list)
    flagship_costs: list[int] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)  # "FILE:LINE: why"
    unscored: int = 0
    not_auto: int = 0


def _add(sample: LogSample, entry: LogEntry, loaded: LoadedPolicy) -> None:
    if str(entry.request.get("model", "auto")) != "auto":
        sample.not_auto += 1
    elif entry.score is None:
        sample.unscored += 1
    elif not 0 <= entry.score <= 1:
        raise ValueError(f"`score` must be within [0, 1], got {entry.score}")
    else:
        pools, routing = loaded.policy.pools, loaded.policy.routing
        sample.scores.append(entry.score)
        sample.micro_costs.append(pools[routing.micro_pool].price.cost_micro_usd(
            entry.prompt_tokens, entry.completion_tokens))
        sample.flagship_costs.append(pools[routing.flagship_pool].price.cost_micro_usd(
            entry.prompt_tokens, entry.completion_tokens))


def read_sample(path: Path, loaded: LoadedPolicy) -> LogSample:
    """Every line of the log at `path`; a bad line is recorded (file and line named) and skipped.
    Raises OSError when the file cannot be read."""
    sample = LogSample()
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                _add(sample, parse_line(line), loaded)
            except (ValueError, TypeError, AttributeError) as exc:
                sample.bad_lines.append(f"{path}:{number}: {exc}")
    return sample


def _calibrate(args: argparse.Namespace, sample: LogSample) -> tuple[Calibration, int]:
    """(calibration, cost per 1k requests in micro-USD). Raises CalibrationError or ValueError."""
    if args.flagship_share is not None:
        cal = share_threshold(sample.scores, args.flagship_share)
        flagship = [s >= cal.threshold for s in sample.scores]
        total = sum(f if go else m for go, m, f in zip(flagship, sample.micro_costs, sample.flagship_costs,
                                                       strict=True))
        return cal, cost_per_1k(total, len(flagship))
    target = usd_to_micro(args.cost_per_1k)
    return cost_threshold(sample.scores, sample.micro_costs, sample.flagship_costs, target)


def _usd(micro: int) -> str:
    whole, frac = divmod(micro, 1_000_000)
    return f"{whole}.{frac:06d}"


def _quality_line(artifact: Path | None, share: float) -> str:
    from router_models.training.quality_curve import artifact_quality_curve

    try:
        curve = artifact_quality_curve(artifact)
    except (OSError, ValueError) as exc:
        return f"quality kept: estimate unavailable (cannot read the artifact's curve: {exc})"
    if curve is None:
        return "quality kept: estimate unavailable (artifact has no evaluation curve)"
    return (f"quality kept: ~{curve.pgr_at(share):.2f} of the micro->flagship gap "
            f"({curve.basis}, at flagship share {share:.1%})")


def _report(args: argparse.Namespace, sample: LogSample, cal: Calibration, per_1k: int, shown: str) -> list[str]:
    n = len(sample.scores)
    all_micro, all_flagship = cost_per_1k(sum(sample.micro_costs), n), cost_per_1k(sum(sample.flagship_costs), n)
    skipped = f"{len(sample.bad_lines)} bad lines, {sample.unscored} without a score, {sample.not_auto} not model auto"
    return [
        f"calibrated on {n} scored auto requests of {args.log} (skipped: {skipped})",
        f"threshold: {shown}",
        f"flagship share: {cal.flagship_share:.1%} ({cal.flagship_requests} of {n})",
        f"cost per 1k requests: {_usd(per_1k)} USD (all micro {_usd(all_micro)}, all flagship {_usd(all_flagship)})",
        _quality_line(args.artifact, cal.flagship_share),
    ]


def _write(path: Path, shown: str) -> str | None:
    """Set the threshold in the policy file; an error message (file left as it was) or None."""
    from policies.threshold_edit import ThresholdEditError, set_routing_threshold

    before = path.read_text(encoding="utf-8")
    try:
        path.write_text(set_routing_threshold(before, shown), encoding="utf-8")
        load_policy(path)
    except ThresholdEditError as exc:
        return f"{path}: {exc}"
    except PolicyError as exc:
        path.write_text(before, encoding="utf-8")
        return f"the edited policy does not validate; {path} left unchanged:\n{exc}"
    return None


def _run(args: argparse.Namespace) -> int:
    try:
        loaded = load_policy(args.policy)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        sample = read_sample(args.log, loaded)
    except OSError as exc:
        print(f"cascade router calibrate: cannot read the log {args.log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for problem in sample.bad_lines[:_SHOWN_BAD_LINES]:
        print(f"skipped {problem}", file=sys.stderr)
    if len(sample.bad_lines) > _SHOWN_BAD_LINES:
        print(f"skipped {len(sample.bad_lines) - _SHOWN_BAD_LINES} more bad lines", file=sys.stderr)
    if not sample.scores:
        print(f"cascade router calibrate: {args.log} has no scored `model: auto` requests to calibrate on "
              f"({len(sample.bad_lines)} bad lines, {sample.unscored} without a score, {sample.not_auto} not auto; "
              "serve with --scorer classifier and --request-log)", file=sys.stderr)
        return 2
    try:
        cal, per_1k = _calibrate(args, sample)
    except (CalibrationError, ValueError) as exc:
        print(f"cascade router calibrate: {exc}", file=sys.stderr)
        return 1
    shown = shown_threshold(sample.scores, cal.threshold)
    print("\n".join(_report(args, sample, cal, per_1k, shown)))
    return _finish(args, shown)


def _finish(args: argparse.Namespace, shown: str) -> int:
    if not args.write:
        print(f"policy line (under routing:):  threshold: {shown}")
        return 0
    problem = _write(Path(args.policy), shown)
    if problem is not None:
        print(f"cascade router calibrate: {problem}", file=sys.stderr)
        return 1
    print(f"wrote routing.threshold: {shown} to {args.policy} (validated)")
    return 0




def _router_commands(subparsers: Any) -> Any:
    """The sub-command action of the `router` command (added by `router_models.cli.register`)."""
    router: argparse.ArgumentParser = subparsers.choices["router"]
    return next(a for a in router._actions if isinstance(a, argparse._SubParsersAction))


def register(subparsers: Any) -> None:
    """Add `calibrate` to the already registered `router` command of a `cascade` subparsers object."""
    from gateway.cli.policy import unit_interval
    from policies.loader import default_policy_path

    p = _router_commands(subparsers).add_parser(
        "calibrate", help="set the routing threshold for a flagship share or a cost per 1k requests",
        description="Fit routing.threshold on a request log of your own traffic (cascade serve --request-log).")
    p.add_argument("--log", type=Path, required=True, help="request log, JSON Lines (format: policies/replay.py)")
    p.add_argument("--policy", default=str(default_policy_path()), help="policy whose pools price the requests")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--flagship-share", type=unit_interval, metavar="X", help="share of requests for the flagship")
    target.add_argument("--cost-per-1k", metavar="USD", help="cost per 1,000 requests to stay within, in USD")
    p.add_argument("--artifact", type=Path, default=None, help="router artifact .json with the quality curve "
                   "(default: the shipped one)")
    p.add_argument("--write", action="store_true", help="set routing.threshold in the --policy file")
    p.set_defaults(func=_run)
