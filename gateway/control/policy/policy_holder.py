"""The running policy, swapped whole. Readers take `current` once per request and keep it, so requests
in flight finish on the policy they started with."""

from __future__ import annotations

import logging

from policies.loader import LoadedPolicy

__all__ = ["PolicyHolder"]

log = logging.getLogger("cascade.policy")


class PolicyHolder:
    """Holds one `LoadedPolicy`. Replacing it is one reference assignment: atomic for readers."""

    def __init__(self, loaded: LoadedPolicy) -> None:
        self._current = loaded

    @property
    def current(self) -> LoadedPolicy:
        return self._current

    def swap(self, fresh: LoadedPolicy) -> None:
        log.info("policy %s -> %s", self._current.version, fresh.version, extra={"source": fresh.source})
        self._current = fresh
