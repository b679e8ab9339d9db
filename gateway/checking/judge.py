"""Judge one answer with the output checks its tenant and pool ask for, and say what a failure does.

`OutputChecker.judge` runs the checks (`gateway.checking.checks`) that the policy resolves for the request's
tenant and the answering pool (`policies.output_checks.resolve`), counts every result in
`cascade_output_checks_total{pool,model,check,result}`, feeds the JSON failure rates (`JsonRates`) and returns a
`Verdict`. A check that raises is counted as "error" and passes: a broken check never fails a request.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.checking.checks import applies, empty_ok, json_ok, repetition_ok, tool_calls_ok
from gateway.telemetry.metrics import GatewayMetrics
from policies.decide import RouteDecision
from policies.output_checks import CheckAction, Repetition, resolve
from policies.schema import Policy

__all__ = ["ACTION_HEADER", "CHECK_HEADER", "JsonRates", "OutputChecker", "Rejection", "Verdict"]

log = logging.getLogger("cascade.checks")
CHECK_HEADER = "x-cascade-output-check"  # "<check>=<result>, ..." of the answer served
ACTION_HEADER = "x-cascade-output-check-action"  # "escalated:<checks>", "retried:<checks>" or "held:<checks>"
_STRENGTH = {"flag": 0, "retry": 1, "escalate": 2}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The result of each check that ran ("pass", "fail" or "error") and the action each asks for on failure."""

    results: Mapping[str, str]
    actions: Mapping[str, CheckAction]

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(check for check, result in self.results.items() if result == "fail")

    @property
    def action(self) -> CheckAction | None:
        """The strongest action among the failed checks (escalate > retry > flag); None when none failed."""
        failed = sorted((self.actions[c] for c in self.failed), key=_strength)
        return failed[-1] if failed else None

    @property
    def summary(self) -> str:
        """The ledger's form: "" (nothing ran), "pass" or "fail:<check>,..."."""
        if not self.results:
            return ""
        return f"fail:{','.join(self.failed)}" if self.failed else "pass"

    @property
    def header(self) -> str:
        return ", ".join(f"{check}={result}" for check, result in self.results.items())


def _strength(action: str) -> int:
    return _STRENGTH.get(action, -1)


@dataclass(frozen=True, slots=True)
class Rejection:
    """An answer failed a check whose action (`action`: "escalate" or "retry") replaces it. It has been recorded
    in the ledger as discarded; the reply that carries it (`gateway.serving.sending.forwarding.JSONReply.rejected`)
    holds the answer and its decision, served flagged if the replacement cannot be had."""

    action: CheckAction
    verdict: Verdict


class JsonRates:
    """Per pool, the share of its last checked JSON answers that failed the json check (the ladder's
    `fallback_pool.max_json_failure_rate`). In-process: each gateway process judges the answers it served."""

    def __init__(self, window: int = 10_000) -> None:
        # per pool, the running count of failed answers before its oldest kept answer and after each one since
        # (at most `window` answers): a rate over the last n is a difference of two entries, not a pass over n
        # (asked on every JSON request a fallback step moves, while the surge lasts)
        self._failed: dict[str, deque[int]] = {}
        self._window = window

    def observe(self, pool: str, failed: bool) -> None:
        counts = self._failed.setdefault(pool, deque([0], maxlen=self._window + 1))
        counts.append(counts[-1] + failed)

    def rate(self, pool: str, window: int) -> tuple[float, int]:
        """(failure share, answers it is taken over) of the last `window` checked JSON answers of `pool`."""
        counts = self._failed.get(pool)
        n = 0 if counts is None else min(window, len(counts) - 1)
        if counts is None or n <= 0:
            return 0.0, 0
        return (counts[-1] - counts[-1 - n]) / n, n


class OutputChecker:
    """Shares the metrics; owns the JSON failure rates."""

    def __init__(self, metrics: GatewayMetrics | None = None) -> None:
        self._metrics = metrics
        self.json_rates = JsonRates()
        self._plans: dict[tuple[str, str], tuple[dict[str, CheckAction], Repetition]] = {}
        self._plans_of: Policy | None = None  # the policy `_plans` were resolved from (a reload starts anew)
        self._counters: dict[tuple[str, str, str, str], Any] = {}  # labelled children: labels() costs ~4 us

    def plan(self, policy: Policy, tenant: str, pool: str) -> tuple[dict[str, CheckAction], Repetition]:
        """The checks that run for `tenant`'s answers from `pool`, and the repetition bounds (resolved once per
        policy, tenant and pool)."""
        if policy is not self._plans_of:
            self._plans, self._plans_of = {}, policy
        key = (tenant, pool)
        found = self._plans.get(key)
        if found is None:
            spec, pool_spec = policy.tenants.get(tenant), policy.pools.get(pool)
            found = self._plans[key] = resolve((spec.output_checks if spec is not None else None,
                                                pool_spec.output_checks if pool_spec is not None else None,
                                                policy.output_checks))
        return found

    def judge(self, policy: Policy, tenant: str, decision: RouteDecision, request: Mapping[str, Any],
              answer: Mapping[str, Any]) -> Verdict:
        """Run on every choice of `answer` (a chat.completion object) the checks that apply to `request`."""
        actions, loop = self.plan(policy, tenant, decision.pool)
        results: dict[str, str] = {}
        for check in actions:
            try:
                if not applies(check, request):
                    continue
                ok = all(_passes(check, choice, request, loop) for choice in answer.get("choices") or ())
                results[check] = "pass" if ok else "fail"
            except Exception:
                log.exception("output check %s failed; the answer is served", check)
                results[check] = "error"
        verdict = Verdict(results, {c: actions[c] for c in results})
        self._count(decision, verdict)
        return verdict

    def _count(self, decision: RouteDecision, verdict: Verdict) -> None:
        if "json" in verdict.results and verdict.results["json"] != "error":
            self.json_rates.observe(decision.pool, verdict.results["json"] == "fail")
        if self._metrics is not None:
            for check, result in verdict.results.items():
                key = (decision.pool, decision.model, check, result)
                counter = self._counters.get(key)
                if counter is None:
                    counter = self._counters[key] = self._metrics.output_checks.labels(*key)
                counter.inc()

    def acted(self, pool: str, verdict: Verdict, action: str) -> None:
        """Count what was done with an answer that failed: escalated, retried, flagged or held."""
        if self._metrics is not None:
            for check in verdict.failed:
                self._metrics.output_actions.labels(pool, check, action).inc()


def _passes(check: str, choice: Mapping[str, Any], request: Mapping[str, Any], loop: Repetition) -> bool:
    message = choice.get("message") or {}
    if check == "json":
        return json_ok(message, request)
    if check == "tool_calls":
        return tool_calls_ok(message, request)
    if check == "empty":
        return empty_ok(message)
    return repetition_ok(message, choice.get("finish_reason"), loop)
