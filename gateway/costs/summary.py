"""The report's plain-language summary: what was spent, what the flagship would have cost, the saving, the quality
kept and, when traffic is unlike the router's training data, what that means and what to do; one sentence each.

The text report and the HTML page print the same sentences (`summary_lines`), above their tables. Where a sentence
tells the reader how to see more, it names the controls of where the report is read (`Controls`): the command's
flags, or the served page's query (`GET /admin/costs`), whose reader has no command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.costs.estimate import DomainShare, QualityEstimate
from gateway.costs.layout import money, money_decimals
from gateway.costs.report import CostReport, pct

__all__ = ["COMMAND", "PAGE", "Controls", "empty_lines", "summary_lines"]

_TRAIN = "cascade router train --from-ledger"
_LOW_KEPT = 0.10  # under this share of the flagship's edge kept, the summary says what the saving cost


@dataclass(frozen=True, slots=True)
class Controls:
    """How the reader of a report changes what it shows, in the words of where it is read."""

    wide: str  # every column
    prefix: str  # another ledger prefix
    range: str  # other days


COMMAND = Controls(wide="--wide", prefix="pass it with --prefix", range="widen --from / --to")
"""`cascade costs report`: its flags (also on the HTML file it writes with `--format html`)."""
PAGE = Controls(wide="wide=1 in the page's address",
                prefix="this page reads its gateway's own (`cascade costs report --prefix P` reads another)",
                range="widen from= / to= (YYYY-MM-DD) in the page's address")
"""The page a gateway serves at `GET /admin/costs`: its query."""


def empty_lines(report: CostReport, controls: Controls = COMMAND) -> list[str]:
    """What a report with no records says, and what to do: where records are on the same Redis, when the command
    looked (`CostReport.elsewhere`)."""
    where = f"under the prefix {report.prefix!r}" if report.prefix is not None else "in this ledger"
    return [f"No cost records {where} from {report.start} to {report.end} (UTC).",
            *([] if report.elsewhere is None else [report.elsewhere.sentence(report.prefix)]),
            "Check the prefix: a gateway writes under its CASCADE_REDIS_PREFIX (default cascade:), the quick start "
            f"under cascade-demo:, the tests under cascade-test:; {controls.prefix}, or {controls.range}."]


def summary_lines(report: CostReport, controls: Controls = COMMAND) -> list[str]:
    """One sentence each: spend, the flagship counterfactual, the saving, the quality kept and, where traffic is
    unlike the router's data, what to do. `empty_lines` when the report has no record."""
    total = report.total().counters
    if not total.requests:
        return empty_lines(report, controls)
    decimals = money_decimals(max(total.cost_micro_usd, total.flagship_cost_micro_usd))
    flagship = f" ({report.flagship_pool})" if report.flagship_pool else ""
    saved = total.savings_micro_usd
    lines = [
        f"Spend: ${money(total.cost_micro_usd, decimals)} for {total.requests:,} requests "
        f"({total.total_tokens:,} tokens).",
        f"Sending every request to the flagship pool{flagship} would have cost "
        f"${money(total.flagship_cost_micro_usd, decimals)}.",
        f"Routing saved ${money(saved, decimals)}, {pct(saved, total.flagship_cost_micro_usd)} of that."
        if saved >= 0 else f"Routing cost ${money(-saved, decimals)} more than sending everything to the flagship.",
    ]
    if report.quality is not None:
        lines += _quality(report.quality, total.requests)
    return lines


def _quality(quality: QualityEstimate, requests: int) -> list[str]:
    """The quality kept, on a scale a reader can place (0%: the micro pool's answers, 100%: the flagship's), its
    range when there is one, and what a low figure means and what to do (`_LOW_KEPT`)."""
    if quality.curve_kept is None:
        return [f"Quality kept: not estimated ({quality.unavailable})."]
    span = _span(quality.domain)
    lines = [f"Quality kept: about {quality.curve_kept:.0%} of the way from the micro pool's answers to the "
             f"flagship's{span}{_flagship_share(quality, requests)}."]
    if round(quality.curve_kept, 2) < _LOW_KEPT:
        lines.append("So the answers were about as good as the micro pool's alone, and the saving was bought with "
                     "the flagship's quality; if that is not acceptable, send more to the flagship (the policy's "
                     "`routing.threshold`: a lower cut, or a higher `flagship_share`), and check that clients do not "
                     "name the micro pool's model, which pins their requests to it.")
    return lines + ([] if quality.domain is None else _unlike(quality.domain, bool(span)))


def _span(domain: DomainShare | None) -> str:
    """" (likely L% to H%)", or nothing when there is no range or it rounds to one figure."""
    if domain is None or domain.kept_low is None or domain.kept_high is None:
        return ""
    low, high = f"{domain.kept_low:.0%}", f"{domain.kept_high:.0%}"
    return "" if low == high else f" (likely {low} to {high})"


def _flagship_share(quality: QualityEstimate, requests: int) -> str:
    """The realised flagship share as the table's TOTAL shows it (one decimal); its base named when other pools
    also answered, as then the table's share is of every request."""
    if quality.flagship_share is None:
        return ""
    if quality.routed_requests == requests:
        return f", with {quality.flagship_share:.1%} of requests on the flagship"
    return (f", with {quality.flagship_share:.1%} of the {quality.routed_requests:,} requests on the micro and "
            "flagship pools on the flagship")


def _unlike(domain: DomainShare, spanned: bool) -> list[str]:
    share = domain.share
    if share is None:
        return []
    if domain.below == 0:
        return ["All scored requests resemble the data the router was trained on, so the estimate applies as is."]
    tenants = ", ".join(t for t, _, _ in domain.drifting)
    who = f" (most of all tenant{'s' if len(domain.drifting) > 1 else ''} {tenants})" if tenants else ""
    why = "hence the range" if spanned else "so the router's choices for them are less sure than its evaluation says"
    lead = "To narrow it" if spanned else "To route it better"
    return [f"{share:.0%} of the scored requests{who} are unlike the router's training data, {why}.",
            f"{lead}: label this traffic (client feedback, learning.shadow), then `{_TRAIN}`; to keep quality "
            "meanwhile, send more to the flagship (learning.in_domain.hold, `cascade router calibrate`)."]
