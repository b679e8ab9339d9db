"""One engine replica of a local pool and the process group it runs in.

`Replica` is what `backends.engines.supervisor.EngineSupervisor` keeps per engine process (its port, log, process
and restart state); `Backoff` its restart delay. The functions here choose free loopback ports, read a log's tail
and signal or wait out a replica's process group (the engine-core and worker children with it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Backoff", "EngineStartError", "Replica", "choose_ports", "group_gone", "live_group_members", "log_tail",
           "port_free", "signal_group"]


class EngineStartError(RuntimeError):
    """A replica died or did not become healthy in time; the message ends with its log tail."""


@dataclass(frozen=True)
class Backoff:
    """Exponential restart delay: ``base * 2**failures``, capped at ``cap`` seconds."""

    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before restart attempt number ``failures + 1`` (``failures`` >= 0)."""
        return float(min(self.cap_s, self.base_s * 2 ** min(failures, 30)))


@dataclass
class Replica:
    """One engine process of a pool. ``ready`` is True while its last health check passed."""

    pool: str
    index: int
    port: int
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    ready: bool = False
    restarts: int = 0
    failures: int = 0
    started_at: float = 0.0
    last_healthy: float = 0.0  # monotonic time of the last health check that passed
    restart_task: asyncio.Task[None] | None = field(default=None, repr=False)
    env: dict[str, str] = field(default_factory=dict)  # over the spec's (a replica added beside the others)
    start_on: frozenset[int] | None = None  # cores its processes are held on while it starts (`hold_engine`)

    @property
    def url(self) -> str:
        """Base URL of the engine (``http://127.0.0.1:PORT``), without ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid (and process group id) of the running API server process, if any."""
        return None if self.process is None else self.process.pid

    async def stop(self, grace_s: float, say: Callable[[str], None]) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`; reaps the leader. `say` tells what went wrong."""
        self.ready = False
        process = self.process
        if process is None:
            return
        if not signal_group(process.pid, signal.SIGTERM):
            await process.wait()
            return
        try:
            await asyncio.wait_for(process.wait(), timeout=grace_s)
        except TimeoutError:
            say(f"pool {self.pool}: replica {self.index} (pid {process.pid}) ignored SIGTERM for {grace_s:.0f} s; "
                "sending SIGKILL")
        # Children may outlive the leader; the group id stays valid while any of them lives.
        signal_group(process.pid, signal.SIGKILL)
        await process.wait()
        if not await group_gone(process.pid):
            say(f"pool {self.pool}: replica {self.index} (group {process.pid}) still has live processes "
                "10 s after SIGKILL: " + ", ".join(map(str, live_group_members(process.pid))))


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_ports(base_port: int, count: int, taken: Sequence[int] = ()) -> list[int]:
    """``count`` free loopback ports: consecutive from ``base_port``, skipping busy ones and ``taken``."""
    ports: list[int] = []
    port = base_port
    while len(ports) < count:
        if port > 65535:
            raise EngineStartError(f"no {count} free ports at or above {base_port}")
        if port not in taken and port_free(port):
            ports.append(port)
        port += 1
    return ports


def log_tail(path: Path, limit: int = 4000) -> str:
    """The last ``limit`` bytes of a log file as text ('' when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def live_group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of a process group, read from /proc (empty where there is none)."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


async def group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
    """Wait until a SIGKILLed group has no live member (a killed process dies when it is next scheduled, so
    on a loaded machine a child can outlive the leader's reaping by a moment). False on timeout."""
    deadline = time.monotonic() + timeout_s
    while live_group_members(pgid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
