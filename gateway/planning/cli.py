"""`cascade plan --traffic forecast.yaml --policy P.yaml [--format table|json] [--out FILE]`.

Exit codes: 0 planned, 1 a bad forecast or policy, or inputs that give no plan (every problem on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli.output import write_output

if TYPE_CHECKING:
    from gateway.planning.schema import Forecast
    from policies.schema import Policy

__all__ = ["register"]


def _shares(forecast: Forecast, policy: Policy, forecast_path: Path) -> dict[str, float]:
    if forecast.routing.shares is not None:
        return dict(forecast.routing.shares)
    from gateway.planning.shares import read_prompts, shares_from_sample
    from router_models.serving.classifier_scorer import load_model

    assert forecast.routing.sample is not None  # the schema requires one of the two
    prompts = read_prompts(forecast_path.parent / forecast.routing.sample)
    return shares_from_sample(policy, prompts, load_model())


def _plan(args: argparse.Namespace) -> int:
    from gateway.planning.model import PlanError
    from gateway.planning.plan import make_plan, plan_json, render_table
    from gateway.planning.schema import ForecastError, load_forecast
    from policies.loader import PolicyError, load_policy
    from router_models.serving.artifact import ArtifactError

    path = Path(args.traffic)
    try:
        forecast, policy = load_forecast(path), load_policy(args.policy).policy
        plan = make_plan(policy, forecast, _shares(forecast, policy, path))
    except (ForecastError, PolicyError, PlanError, ArtifactError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(plan_json(plan), indent=2) + "\n" if args.format == "json" else render_table(plan)
    write_output(text, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan", help="capacity plan: replicas per pool per hour, GPU-hours and cost per day",
        description="Plan replicas per pool for each hour of a traffic forecast (requests/s by hour, token mix, "
        "routed shares given or from the classifier on a prompt sample, per-replica capacity, TTFT/ITL SLOs), "
        "with GPU-hours and cost per day against sending everything to the flagship. The model is explained in "
        "gateway/planning/model.py; example: deploy/forecast.yaml.",
    )
    p.add_argument("--traffic", required=True, metavar="FORECAST.yaml", help="the traffic forecast")
    p.add_argument("--policy", required=True, metavar="POLICY.yaml", help="pools, prices and routing")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=_plan)
