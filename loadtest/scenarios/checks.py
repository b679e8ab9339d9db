"""The surge targets, checked on a surge run's summary: no 5xx from the gateway, p99 TTFT of admitted
requests within 3x of steady state, low priority shed with 429 + Retry-After (not queued without bound),
and back at steady state within 30 s after the surge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Check", "format_checks", "surge_checks"]

TTFT_FACTOR = 3.0
RECOVERED_FACTOR = 1.5  # "back at steady": p50 TTFT within 1.5x and p99 within 3x of the steady phase's


@dataclass(frozen=True, slots=True)
class Check:
    """`ok` None: the condition was not exercised by this run (said in `detail`)."""

    name: str
    ok: bool | None
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def _ttft(phase: dict[str, Any], q: str) -> float | None:
    value = phase["ttft_ms"][q]
    return None if value is None else float(value)


def _ratio_check(name: str, value: float | None, base: float | None, factor: float, what: str) -> Check:
    if value is None or base is None or base <= 0:
        return Check(name, None, f"no {what} to compare")
    ratio = value / base
    return Check(name, ratio <= factor, f"{what} {value:.0f} ms vs steady {base:.0f} ms = {ratio:.2f}x "
                 f"(limit {factor:g}x)")


def _shed_check(phases: dict[str, Any], low: str, high: str) -> Check:
    rows = [p["tenants"] for name, p in phases.items() if name != "steady"]
    low_429 = sum(r.get(low, {}).get("429", 0) for r in rows)
    high_429 = sum(r.get(high, {}).get("429", 0) for r in rows)
    rejected = sum(p["rejected_429"] for p in phases.values())
    with_ra = sum(p["retry_after_seen"] for p in phases.values())
    if rejected == 0:
        return Check("low priority shed with 429 + Retry-After", None,
                     "no request was shed (the surge did not trip a shedding step)")
    ok = low_429 > 0 and high_429 == 0 and with_ra == rejected
    return Check("low priority shed with 429 + Retry-After", ok,
                 f"429s: {low} {low_429}, {high} {high_429}; with Retry-After {with_ra}/{rejected}")


def surge_checks(summary: dict[str, Any], low_tenant: str = "free", high_tenant: str = "gold") -> list[Check]:
    """Phases `steady`, `surge`, and `after` (the window that starts 30 s after the surge ended)."""
    phases = summary["phases"]
    steady, surge = phases["steady"], phases["surge"]
    after = phases.get("after")
    fives = summary["overall"]["classes"].get("5xx", 0)
    other = sum(v for k, v in summary["overall"]["classes"].items() if k in ("conn", "stream"))
    checks = [
        Check("no 5xx from the gateway", fives == 0, f"{fives} 5xx, {other} broken streams / connection errors"),
        _ratio_check("p99 TTFT of admitted within 3x steady (surge)", _ttft(surge, "p99"), _ttft(steady, "p99"),
                     TTFT_FACTOR, "surge p99 TTFT"),
        _shed_check(phases, low_tenant, high_tenant),
    ]
    if after is not None:
        p50 = _ratio_check("", _ttft(after, "p50"), _ttft(steady, "p50"), RECOVERED_FACTOR, "p50")
        p99 = _ratio_check("", _ttft(after, "p99"), _ttft(steady, "p99"), TTFT_FACTOR, "p99")
        errors = after["classes"].get("5xx", 0) + after["classes"].get("conn", 0)
        ok = None if p50.ok is None or p99.ok is None else bool(p50.ok and p99.ok and errors == 0)
        checks.append(Check("back at steady within 30 s after the surge", ok,
                            f"after-window TTFT {p50.detail}; {p99.detail}; errors {errors}; "
                            f"429s {after['rejected_429']}"))
    return checks


def format_checks(checks: list[Check]) -> str:
    mark = {True: "PASS", False: "FAIL", None: "n/a "}
    return "\n".join(f"  [{mark[c.ok]}] {c.name}: {c.detail}" for c in checks)
