"""How a policy reload applies a change to a running pool's engines, decided before anything starts.

- `blue-green`: the pool's engines run here and the machine has room for the new replicas beside the old ones
  (`backends.engines.room`): the new version starts beside the old, takes traffic once every new replica
  answers its health check, and the old one drains (requests in flight, streams included, finish) and stops.
- `replace`: a pool whose engines run elsewhere (a remote pool, or a worker under `--workers N`): a new set of
  replicas is probed, then swapped in; the old set drains.
- `rolling`: the machine has room for some of the new replicas beside the old ones, not all: they are replaced
  that many at a time (new ones start, take traffic, then as many old ones drain and stop), so the pool always
  serves. Only where the old version has more than one replica and the served model name stays (both versions
  answer the same requests meanwhile).
- `restart`: the pool's engines stop, then the new ones start, so the pool has no replica meanwhile. Only
  for a pool that serves nothing now (its engines are still starting, failed, or asleep on demand), or where
  ops accepted the interruption explicitly (`accept_interruption`).
- refused: no room for the new version beside the old, and no acceptance: `PoolChangeRefused` says why and
  for how long the pool would be dark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from backends.engines.room import Room
from policies.loader import PolicyError

__all__ = ["ChangePlan", "PolicyNotApplied", "PoolChangeRefused", "plan_change"]

How = Literal["blue-green", "rolling", "replace", "restart"]


class PoolChangeRefused(Exception):
    """The reload would leave a pool without a replica; `problems` says which and why, one line each.
    `retryable`: only because a remote pool's new replicas do not answer yet (their pods may still be starting):
    the same reload can succeed later without any change."""

    def __init__(self, problems: list[str], retryable: bool = False) -> None:
        self.problems = problems
        self.retryable = retryable
        super().__init__("; ".join(problems))


class PolicyNotApplied(PolicyError):
    """A valid policy that cannot be applied yet (`PoolChangeRefused.retryable`); the policy file watcher tries
    it again (`gateway.control.policy.file_watch`)."""


@dataclass(frozen=True, slots=True)
class ChangePlan:
    pool: str
    how: How
    why: str
    step: int = 0  # `rolling`: how many replicas are replaced at a time (the new ones that fit beside the old)


def plan_change(pool: str, *, runs_engines: bool, serving: bool, replicas: int, room: Room | None,
                last_start_s: float | None, accept_interruption: bool, old_replicas: int = 1,
                same_name: bool = True) -> ChangePlan | str:
    """The plan for a pool whose engine spec changes, or the reason it is refused (a string).

    `runs_engines`: this process supervises the pool's engines; `serving`: they run now (not starting, failed
    or asleep); `replicas`: how many the new version has; `room`: what the machine holds beside what runs
    (None when `runs_engines` is False); `last_start_s`: how long the pool's engines took to start last;
    `old_replicas`: how many the running version has; `same_name`: both versions serve the same model name."""
    if not runs_engines:
        return ChangePlan(pool, "replace", "its engines run elsewhere: the new replica set is swapped in")
    if not serving:
        return ChangePlan(pool, "restart", "it serves nothing now, so the new engines start in place")
    assert room is not None
    if room.fits >= replicas:
        return ChangePlan(pool, "blue-green", f"the new version starts beside the old ({room.how})")
    if room.fits >= 1 and old_replicas > 1 and same_name:
        return ChangePlan(pool, "rolling", f"room for {room.fits} of the {replicas} new replicas beside the old "
                                           f"ones ({room.how}): replaced {room.fits} at a time", step=room.fits)
    dark = f"about {last_start_s:.0f} s (its last start)" if last_start_s is not None else "until its engines start"
    if accept_interruption:
        return ChangePlan(pool, "restart", f"no room beside the old version ({room.how}); interruption accepted: "
                                           f"no replica for {dark}")
    return (f"pool {pool}: its engines change, and this machine has room for {room.fits} of the "
            f"{replicas} new replica(s) beside the old ones ({room.how}). Restarting it in place would leave the "
            f"pool with no replica for {dark}. To accept that, reload with accept_interruption "
            "(POST /admin/policy/reload?accept_interruption=true); the running policy stays")
