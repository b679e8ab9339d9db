"""Many pools on one map: `routing.tiers` lists pools cheapest first, and a routed request goes to the allowed tier
with the best trade of predicted quality against expected cost. Pure: no I/O, no models.

Contract:
- A tier's `TierEstimate` is its predicted quality (P(good answer) in [0, 1], from the pool map and the pool's
  placement: the gateway's, `gateway.serving.routing.tier_trade`) and its expected cost in USD: the pool's prices times
  the request's prompt tokens and the pool's expected completion tokens (`expected_completion`). Expected cost is a
  prediction compared with quality, not money spent, so it is a float; what a request costs is still integer
  micro-USD in its record.
- `choose` picks the estimate that maximises ``quality - tradeoff * cost_usd`` (`tradeoff` >= 0: the quality one
  USD of expected cost per request is worth; 0 picks the best predicted quality whatever it costs); a tie goes to
  the cheaper tier (the earlier one).
- `solve_tradeoff` sets the tradeoff on a window of requests so that their mean expected cost per 1,000 requests
  is at most a target (`routing.cost_per_1k`): the gateway holds it live across workers
  (`gateway.control.adaptation.live_tradeoff`), `cascade router route --cost-per-1k` on its input.
- A label memory moves a tiers trade by its labels per pool (`moved`): each tier's predicted quality by that tier's
  own labels near the request (`router_models.serving.pool_labels`; a label of the micro and flagship quality
  labels the first and the last tier). A memory written before labels per pool records only gaps; it moves the
  trade as it moves a score (`remembered`): its move of the quality gap bottom -> top tier (`gap`, on the memory's
  [0, 1] gap-target scale: half the gap) lowers the bottom tier's quality by `gap`, raises the top tier's by as
  much and shifts a middle tier by its place between them (docs/policies.md, "Label memory with tiers"). Either
  way each estimate keeps the move it got (`TierEstimate.memory`), which `estimates_text` shows.
- Failover, context fit and the cascade move along the tiers (`neighbours`: the next tier up, then down, then
  further out; `tier_above`: one up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.money import Price
from policies.schema import Policy

__all__ = ["TierEstimate", "Trade", "choose", "estimates_text", "expected_completion", "expected_cost_usd", "moved",
           "neighbours", "parse_estimates", "remembered", "solve_tradeoff", "tier_above", "tier_problems", "tiers_of"]


@dataclass(frozen=True, slots=True)
class TierEstimate:
    """One tier's prediction for one request: `quality` P(good answer) in [0, 1], `cost_usd` its expected cost,
    `memory` how far a label memory moved the quality (included in `quality`; 0: not moved)."""

    pool: str
    quality: float
    cost_usd: float
    memory: float = 0.0

    def __str__(self) -> str:
        moved = f" (memory {self.memory:+.3f})" if self.memory else ""
        return f"{self.pool}={self.quality:.3f}/${self.cost_usd:.6f}{moved}"


@dataclass(frozen=True, slots=True)
class Trade:
    """Every tier's estimate for one request (in tier order) and the tradeoff in force (the policy's, or the live
    value that holds `routing.cost_per_1k`); `memory`: the label memory that moved the estimates ("name@labels"; ""
    when none did)."""

    estimates: tuple[TierEstimate, ...]
    tradeoff: float
    memory: str = ""


def estimates_text(estimates: Sequence[TierEstimate]) -> str:
    """The estimates as the `x-cascade-tiers` header and the cost record carry them:
    "general=0.670/$0.000120, code=0.610/$0.000150, flagship=0.950/$0.005100"; a tier a label memory moved also
    says by how much: "general=0.570/$0.000120 (memory -0.100)"."""
    return ", ".join(str(e) for e in estimates)


def parse_estimates(text: str) -> tuple[TierEstimate, ...]:
    """The estimates `estimates_text` wrote ("" -> none). ValueError naming the item that is not
    "pool=quality/$cost" with a quality in [0, 1] and a cost >= 0."""
    out: list[TierEstimate] = []
    for item in text.split(", ") if text else ():
        pool, _, rest = item.partition("=")
        rest, memory, move = rest.partition(" (memory ")
        quality, _, cost = rest.partition("/$")
        try:
            estimate = TierEstimate(pool, float(quality), float(cost),
                                    float(move.removesuffix(")")) if memory and move.endswith(")") else 0.0)
        except ValueError:
            estimate = None
        if (estimate is None or not pool or not 0 <= estimate.quality <= 1 or not estimate.cost_usd >= 0
                or (memory and not move.endswith(")"))):
            raise ValueError(f"tier prediction {item!r} is not pool=quality/$cost (as x-cascade-tiers shows it: "
                             "\"general=0.670/$0.000120\", or \"general=0.570/$0.000120 (memory -0.100)\")")
        out.append(estimate)
    return tuple(out)


def tiers_of(policy: Policy) -> tuple[str, ...]:
    """The policy's tiers, cheapest first: `routing.tiers`, else (micro pool, flagship pool)."""
    routing = policy.routing
    return routing.tiers if routing.tiers else (routing.micro_pool, routing.flagship_pool)


def expected_completion(policy: Policy, pool: str) -> int:
    """The completion tokens a request is expected to produce on `pool`: the pool's own figure, else the routing
    default."""
    own = policy.pools[pool].expected_completion_tokens
    return own if own is not None else policy.routing.expected_completion_tokens


def expected_cost_usd(price: Price, prompt_tokens: int, completion_tokens: int) -> float:
    """USD of one request of these token counts at `price` (not rounded: a prediction, see the module docstring)."""
    return (prompt_tokens * price.input_per_mtok + completion_tokens * price.output_per_mtok) / 1e12


def choose(estimates: Sequence[TierEstimate], tradeoff: float) -> TierEstimate:
    """The best trade (see the module docstring). `estimates` non-empty, in tier order."""
    best = estimates[0]
    for estimate in estimates[1:]:
        if estimate.quality - tradeoff * estimate.cost_usd > best.quality - tradeoff * best.cost_usd:
            best = estimate
    return best


def remembered(estimates: Sequence[TierEstimate], gap: float) -> tuple[TierEstimate, ...]:
    """`estimates` (tier order) shifted by a label memory's move `gap` (module docstring): tier i of n by
    gap * (2 i / (n - 1) - 1), each quality kept in [0, 1]. Unchanged for gap 0 or fewer than two tiers."""
    n = len(estimates)
    if gap == 0 or n < 2:
        return tuple(estimates)
    return moved(estimates, [gap * (2 * i / (n - 1) - 1) for i in range(n)])


def moved(estimates: Sequence[TierEstimate], moves: Sequence[float]) -> tuple[TierEstimate, ...]:
    """`estimates` (tier order) each moved by its label memory's move (one per tier, `router_models.serving.
    pool_labels.TierLabels.moves`), each quality kept in [0, 1]; `TierEstimate.memory` the move made (after the
    clip). A tier moved by 0 is kept as it was."""
    if len(moves) != len(estimates):
        raise ValueError(f"{len(moves)} memory moves for {len(estimates)} tiers")
    out = []
    for e, move in zip(estimates, moves, strict=True):
        quality = min(max(e.quality + float(move), 0.0), 1.0)
        out.append(e if move == 0 else TierEstimate(e.pool, quality, e.cost_usd, e.memory + quality - e.quality))
    return tuple(out)


def _mean_cost(window: Sequence[Sequence[TierEstimate]], tradeoff: float) -> float:
    return sum(choose(row, tradeoff).cost_usd for row in window) / len(window)


def solve_tradeoff(window: Sequence[Sequence[TierEstimate]], target_per_1k_usd: float) -> float:
    """The smallest tradeoff (within 0.1%, by bisection on a log scale) whose choices over `window` cost at most
    `target_per_1k_usd` per 1,000 requests on average; 0 when the best-quality choices already do. The mean cost
    of the choices never rises with the tradeoff, so bisection applies. A target below what the cheapest choices
    cost gives the largest tradeoff tried (1e12: always the cheapest tier)."""
    rows = [row for row in window if row]
    target = target_per_1k_usd / 1000
    if not rows or _mean_cost(rows, 0.0) <= target:
        return 0.0
    low, high = 1e-3, 1e12
    if _mean_cost(rows, high) > target:
        return high
    while high / low > 1.001:
        middle = (low * high) ** 0.5
        low, high = (middle, high) if _mean_cost(rows, middle) > target else (low, middle)
    return high


def neighbours(policy: Policy, pool: str) -> tuple[str, ...]:
    """The other tiers in the order a request moves to them when `pool` cannot serve it: the next tier up, the
    next one down, then further out (up first at each distance). Empty for a pool that is no tier."""
    tiers = tiers_of(policy)
    if pool not in tiers:
        return ()
    at = tiers.index(pool)
    out: list[str] = []
    for step in range(1, len(tiers)):
        out += [tiers[i] for i in (at + step, at - step) if 0 <= i < len(tiers) and tiers[i] != pool]
    return tuple(dict.fromkeys(out))


def tier_above(policy: Policy, pool: str) -> str | None:
    """The tier one up from `pool` (where the cascade escalates); None for the top tier or a pool that is no
    tier. Without `routing.tiers`: the flagship pool, from any pool."""
    if not policy.routing.tiers:
        return policy.routing.flagship_pool
    tiers = policy.routing.tiers
    if pool not in tiers or pool == tiers[-1]:
        return None
    return tiers[tiers.index(pool) + 1]


def tier_problems(policy: Policy) -> list[tuple[tuple[int | str, ...], str]]:
    """(yaml path, message) of every problem of `routing.tiers`, `tradeoff` and `cost_per_1k` (see
    `policies.checks`)."""
    routing = policy.routing
    if not routing.tiers:
        return [(("routing", key), f"{key} chooses among tiers, and routing.tiers is not set: list the pools "
                 "cheapest first in routing.tiers, or remove it") for key in ("tradeoff", "cost_per_1k")
                if getattr(routing, key) is not None]
    problems: list[tuple[tuple[int | str, ...], str]] = []
    for i, pool in enumerate(routing.tiers):
        loc: tuple[int | str, ...] = ("routing", "tiers", i)
        if pool not in policy.pools:
            problems.append((loc, f"unknown pool {pool!r}; defined pools: {sorted(policy.pools)} (fix the name or "
                                  "define the pool)"))
        elif routing.tiers.index(pool) != i:
            problems.append((loc, f"pool {pool!r} is listed twice; list each tier once, cheapest first"))
        elif policy.pools[pool].placement is None:
            problems.append((("pools", pool, "placement"), f"pool {pool!r} is a tier and has no placement: the "
                             "router cannot predict its quality; set placement: to the file `cascade router place "
                             "--pool ...` wrote (relative to this policy) or to a shared source's model name"))
    if len(routing.tiers) < 2:
        problems.append((("routing", "tiers"), "tiers need at least two pools to choose between; list more pools, "
                                               "or pin the one pool with a rule"))
    for key, end, which in (("micro_pool", routing.tiers[0], "first"), ("flagship_pool", routing.tiers[-1], "last")):
        if getattr(routing, key) != end:
            problems.append((("routing", key), f"{key} {getattr(routing, key)!r} is not the {which} tier {end!r}; "
                             f"remove {key} (tiers set it)"))
    if routing.tradeoff is not None and routing.cost_per_1k is not None:
        problems.append((("routing", "cost_per_1k"), "give tradeoff or cost_per_1k, not both (cost_per_1k sets "
                                                     "the tradeoff live); remove one"))
    problems += _target_problems(policy, routing.tiers)
    return problems


def _target_problems(policy: Policy, tiers: tuple[str, ...]) -> list[tuple[tuple[int | str, ...], str]]:
    """A cost target below what the cheapest tier costs for its expected completion alone (no prompt token)."""
    target = policy.routing.cost_per_1k
    known = [p for p in tiers if p in policy.pools]
    if target is None or not known:
        return []
    floor = {p: policy.pools[p].price.output_per_mtok * expected_completion(policy, p) / 1e9 for p in known}
    cheapest = min(floor, key=lambda p: floor[p])
    if target / 1e6 >= floor[cheapest]:
        return []
    tokens = expected_completion(policy, cheapest)
    return [(("routing", "cost_per_1k"), f"cost_per_1k ${target / 1e6:g} is below what the cheapest tier "
             f"{cheapest!r} costs per 1,000 requests (${floor[cheapest]:.6f} for its {tokens} expected completion "
             "tokens alone): no routing can hold it; raise the target, or lower the expected completion tokens")]
