"""The surge targets, checked on a surge run's summary: no 5xx from the gateway, p99 TTFT of admitted
requests within 3x of steady state, low priority shed with 429 + Retry-After (not queued without bound),
and back at steady state within 30 s after the surge. And for every scenario whose requests the gateway
routes (model `auto`): each phase sent some but not all of its answered requests to the flagship, because a
figure of a routing gateway that did not route (all micro, or all flagship) measures something else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ROUTED_MODEL", "Check", "flagship_share", "format_checks", "routing_checks", "surge_checks"]

ROUTED_MODEL = "auto"  # the model name the gateway routes; any other pins a pool (or an alias of one)
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


def flagship_share(phase: dict[str, Any], flagship: str = "flagship") -> float | None:
    """The share of a phase's answered requests that the flagship pool answered (None: none answered)."""
    return float(phase["pool_share"].get(flagship, 0.0)) if phase["ok"] else None


def _share_text(phase: dict[str, Any]) -> str:
    share = flagship_share(phase)
    return "no answers" if share is None else f"flagship share {share:.0%}"


def routing_checks(summary: dict[str, Any], model: str, flagship: str = "flagship") -> list[Check]:
    """One check per phase of a routed run (`model` is `ROUTED_MODEL`): its realised flagship share is
    strictly between 0 and 1. A pinned run (any other model) is not checked: it routes nothing on purpose."""
    if model != ROUTED_MODEL:
        return []
    checks = []
    for name, phase in summary["phases"].items():
        share = flagship_share(phase, flagship)
        if share is None:
            checks.append(Check(f"{name} routed", None, "no request was answered in this phase"))
            continue
        ok = 0.0 < share < 1.0
        detail = f"flagship share {share:.0%} of {phase['ok']} answered requests"
        if not ok:
            detail += (f": the gateway sent every request of this phase to {'the flagship' if share else 'micro'}, so "
                       "its figures are not those of a routing gateway (check the policy's routing threshold "
                       "against the scorer's scores)")
        checks.append(Check(f"{name} routed", ok, detail))
    return checks


def _ttft(phase: dict[str, Any], q: str) -> float | None:
    value = phase["ttft_ms"][q]
    return None if value is None else float(value)


def _ratio_check(name: str, value: float | None, base: float | None, factor: float, what: str,
                 shares: str = "") -> Check:
    if value is None or base is None or base <= 0:
        return Check(name, None, f"no {what} to compare")
    ratio = value / base
    return Check(name, ratio <= factor, f"{what} {value:.0f} ms vs steady {base:.0f} ms = {ratio:.2f}x "
                 f"(limit {factor:g}x{'; ' + shares if shares else ''})")


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
                     TTFT_FACTOR, "surge p99 TTFT", f"surge {_share_text(surge)}, steady {_share_text(steady)}"),
        _shed_check(phases, low_tenant, high_tenant),
    ]
    if after is not None:
        shares = f"after {_share_text(after)}, steady {_share_text(steady)}"
        p50 = _ratio_check("", _ttft(after, "p50"), _ttft(steady, "p50"), RECOVERED_FACTOR, "p50", shares)
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
