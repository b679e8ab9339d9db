"""A private redis-server for a test or a chaos run: its own port and append-only file, crash and restart.

Used by the tests (`tests.servers` re-exports it) and by the chaos scenario (`loadtest.scenarios.chaos`), which
must never stop the shared Redis on 6379.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from loadtest.processes import free_port

__all__ = ["PrivateRedis"]


class PrivateRedis:
    """A redis-server this process owns, on a port of its own that stays the same across restarts (so clients
    built on `url` reconnect), with its append-only file (fsync always, as production should run) in
    `directory`. Built stopped: `start()` it, or leave it down to test an outage first. Stopped by its own
    PID only."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = directory
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and return once it answers PING (after loading its append-only file). Raises if it exits
        first (e.g. the port was taken meanwhile) or does not answer in 10 s."""
        cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self._dir),
               "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        self._proc = proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    if proc.poll() is not None:
                        raise RuntimeError(f"redis-server on port {self.port} exited ({proc.returncode})") from None
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: a crash, not a clean shutdown (acknowledged writes are in the fsynced append-only file).
        Does nothing when it is not running."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def restart(self) -> None:
        """A crash and a start again on the same port, with the same data."""
        self.kill()
        self.start()
