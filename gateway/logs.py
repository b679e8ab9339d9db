"""Structured JSON logs on stderr: one object per line, with whatever `extra=` fields a call gave.

Never log API keys or prompt text: callers pass ids, pools, counts and reasons only.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

import orjson

__all__ = ["LogThrottle", "configure_logging"]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "INFO", json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    plain = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JSONFormatter() if json else plain)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise


class LogThrottle:
    """At most one log line per key every `interval_s` (monotonic seconds; `monotonic` is injectable for tests),
    counting the events it held back. For a condition that recurs on every request or tick (an outage): the caller
    logs only when `due` says so. Used from one loop."""

    def __init__(self, interval_s: float = 30.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._now = monotonic
        self._logged_at: dict[Hashable, float] = {}
        self._since: dict[Hashable, int] = {}

    def due(self, key: Hashable) -> int | None:
        """Count one event of `key`. When a line is due now, the number of events since the last line (this one
        included; the count restarts), else None."""
        self._since[key] = self._since.get(key, 0) + 1
        now = self._now()
        if now - self._logged_at.get(key, -math.inf) < self._interval:
            return None
        self._logged_at[key] = now
        return self._since.pop(key)

    def forget(self, where: Callable[[Hashable], bool]) -> bool:
        """Drop the keys `where` accepts (the condition is over: its next event logs at once). True if one was
        known, i.e. a line was logged for it since it was last forgotten."""
        keys = [k for k in self._logged_at if where(k)]
        for key in keys:
            del self._logged_at[key]
            self._since.pop(key, None)
        return bool(keys)
