"""The running policy, swapped whole. Readers take `current` once per request and keep it."""

from __future__ import annotations

import logging

from policies.loader import LoadedPolicy, PolicyError, load_policy

__all__ = ["PolicyHolder"]

log = logging.getLogger("cascade.policy")


class PolicyHolder:
    """Holds one `LoadedPolicy`. Replacing it is one reference assignment: atomic for readers."""

    def __init__(self, loaded: LoadedPolicy) -> None:
        self._current = loaded

    @property
    def current(self) -> LoadedPolicy:
        return self._current

    def reload(self) -> LoadedPolicy:
        """Re-read the file the current policy came from. On error the running policy stays and
        `PolicyError` propagates with the reasons."""
        try:
            fresh = load_policy(self._current.source)
        except PolicyError as exc:
            log.error("policy reload rejected; keeping version %s: %s", self._current.version, exc)
            raise
        if fresh.version != self._current.version:
            log.info("policy reloaded: %s -> %s", self._current.version, fresh.version)
        self._current = fresh
        return fresh
