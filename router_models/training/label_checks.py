"""Checks of a set of label rows beyond each row's format (`labels.py`): request ids the ledger must know, and
labels that contradict each other.

- `check_request_ids`: every row's "id" must be a request the gateway kept (`ledger_labels.kept_request_tenants`:
  its kept prompt is on record), and, when the labels are for one tenant, a request of that tenant. The first row
  that is not is refused with its line and field (`LabelError`), so a caller applies nothing.
- `find_contradictions`: rows of one prompt (the same prompt text, by `outcomes.prompt_key`, or the same request
  id, linked transitively) whose memory targets (`label_memory.gap_target`) are at least `tolerance` apart:
  `needs_flagship` 0 against 1 is 0.5 apart. They are counted and one pair is shown, never averaged away
  silently; the rows themselves stay (what a learner does with two verdicts is its own contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router_models.serving.label_memory import gap_target
from router_models.training.labels import LabelError, LabelRow

__all__ = ["Contradictions", "check_ids_in_ledger", "check_request_ids", "find_contradictions"]

TOLERANCE = 0.5


def check_request_ids(rows: Sequence[LabelRow], owners: Mapping[str, str], tenant: str | None = None) -> None:
    """Refuse the first row whose request id is not in `owners` (request id -> the tenant that made it), is
    missing, or (with `tenant`) belongs to another tenant. Raises `LabelError` naming the row's line."""
    for row in rows:
        if not row.request_id:
            raise LabelError(f"{row.where}: field 'id' is missing; every row must name a request the gateway kept")
        owner = owners.get(row.request_id)
        if owner is None:
            raise LabelError(f"{row.where}: field 'id': no request {row.request_id!r} is on record in the ledger "
                             "(unknown or expired id; use the x-request-id of a kept request)")
        if tenant is not None and owner != tenant:
            raise LabelError(f"{row.where}: field 'id': request {row.request_id!r} is tenant {owner!r}'s, but "
                             f"these labels are for tenant {tenant!r}")


def check_ids_in_ledger(rows: Sequence[LabelRow], redis_url: str, key_prefix: str, tenant: str | None = None) -> None:
    """`check_request_ids` against the ledger in Redis at `redis_url` (`--check-ids` of `cascade router train` and
    `cascade router memory add`). Raises `LabelError`, or a Redis error when the ledger cannot be read."""
    from router_models.training.ledger_labels import kept_request_tenants

    owners = kept_request_tenants(redis_url, [r.request_id for r in rows if r.request_id], key_prefix=key_prefix)
    check_request_ids(rows, owners, tenant)


@dataclass(frozen=True)
class Contradictions:
    """`prompts` prompts whose labels contradict each other; `example`: one pair (where, target) of them."""

    prompts: int
    example: tuple[tuple[str, float], tuple[str, float]] | None = None

    def line(self) -> str:
        """One line for a person: how many, and the example pair."""
        if self.example is None:
            return "no prompt has contradicting labels"
        (a, ta), (b, tb) = self.example
        return (f"{self.prompts} prompts with contradicting labels (targets at least {TOLERANCE} apart), e.g. "
                f"{a} (target {ta:g}) against {b} (target {tb:g})")


def _groups(rows: Sequence[LabelRow]) -> list[list[int]]:
    """Row indices linked by a shared prompt key or request id (union-find), each group in row order."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, row in enumerate(rows):
        for name in (("key", row.example.key), ("id", row.request_id)):
            if name[1]:
                parent[root(i)] = root(first.setdefault(name, i))
    groups: dict[int, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def find_contradictions(rows: Sequence[LabelRow], tolerance: float = TOLERANCE) -> Contradictions:
    """Count prompts whose label targets are at least `tolerance` apart (module docstring); rows that name pools only
    (no gap target) are left out."""
    rows = [r for r in rows if r.has_gap]
    targets = [gap_target(r.example.weak, r.example.strong) for r in rows]
    count, example = 0, None
    for group in _groups(rows):
        low = min(group, key=lambda i: targets[i])
        high = max(group, key=lambda i: targets[i])
        if targets[high] - targets[low] >= tolerance - 1e-9:
            count += 1
            if example is None:
                a, b = sorted((low, high))
                example = ((rows[a].where, targets[a]), (rows[b].where, targets[b]))
    return Contradictions(count, example)
