"""`cascade serve --workers N`: N gateway processes on one host and port, sharing one Redis.

Design:
- The parent process serves no requests. It checks the policy, starts and supervises the local pools'
  vLLM engines exactly once (`EngineSupervisor`, on each pool's `base_port + i`, which must be free),
  then spawns N workers and restarts any that dies (1 s, then doubling up to 30 s).
- Each worker is a whole gateway (`create_app`) with `start_engines=False`: it sees the parent's engines
  as external replicas on those same ports, probes them and chooses among them like any replica. Where a
  replica restarts on another port (its own taken), the parent publishes the move
  (`backends.engines.registry`, in `<home>/engines`) and every worker follows it. Each
  binds its own listening socket with SO_REUSEPORT, so the kernel spreads connections over the workers.
- Everything that must be one across workers lives in Redis: the ledger, budgets, rate limits and the
  degradation ladder (one leader decides for all, `gateway.control.adaptation.ladder_sync`). Each worker has its own
  state folder `<home>/workers/<i>` (its ledger outbox, which takes a file lock) and, with `--request-log F`,
  its own log `F.<i>`.
- `/metrics` of any worker is the sum over all workers: the parent empties `<home>/metrics` and starts each
  worker with `PROMETHEUS_MULTIPROC_DIR` set to it (prometheus_client's multiprocess mode,
  `gateway.telemetry.metrics`), never the engines (vLLM would write its own metrics there); a dead worker's
  counters stay in the sum, its live gauges (`cascade_replica_in_flight` among them) are dropped. Each worker
  gets its index in `CASCADE_WORKER`: the `worker` label of the gauges that hold its own view. The parent,
  which alone supervises the engines, counts their restarts into that folder itself
  (`cascade_engine_restarts_total`, once per restart whatever the number of workers).
- SIGTERM or SIGINT to the parent: every worker drains (uvicorn's graceful shutdown), then the engines stop.

- A policy change reaches the engines too: the parent runs them in the same `PoolSet` one process would
  (`gateway.control.engine_host`: blue-green and rolling changes, canaries, autoscaling), watching the policy
  file itself, and drains a replica on the workers' own in-flight counts (read from the metrics folder).

- Scale to zero: the parent wakes an on-demand pool when any worker asks and stops it once no worker has used it
  for its idle period (`gateway.control.fleet.on_demand_shared`); each worker waits for it or takes its cold fallback.

Limits: `POST /admin/policy/reload` reaches the worker that answers it and, through the file, the
parent's watcher: an engine change applies on the parent's next look at the file (`policy_watch_interval_s`),
not within that request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from backends.engines.args import engine_command
from backends.engines.registry import REGISTRY_ENV
from backends.engines.supervisor import CommandFactory, choose_ports
from gateway.control.engine_host import EngineHost
from gateway.settings import Settings
from gateway.telemetry.metrics_dir import MULTIPROC_ENV, prepare_multiprocess_dir, worker_exited
from gateway.telemetry.worker_gauges import WORKER_ENV
from policies.loader import load_policy
from policies.schema import LocalPool

__all__ = ["UVICORN_OPTIONS", "WorkerGroup", "exported", "reuse_port_socket", "run_workers", "workers_problem"]

log = logging.getLogger("cascade.workers")

UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop", "http": "httptools", "log_level": "warning", "access_log": False,
    "timeout_graceful_shutdown": 30, "proxy_headers": False, "server_header": False, "date_header": False,
}
"""uvicorn settings of every gateway process (one worker or many)."""


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket with SO_REUSEPORT (the kernel balances connections over all such listeners)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _worker_main(settings: Settings, host: str, port: int, log_level: str, json_logs: bool) -> None:
    """Entry point of one worker process (spawned): one gateway on the shared port."""
    import uvicorn

    from gateway.api.app import create_app
    from gateway.logs import configure_logging
    from router_models.serving.blas_threads import scoring_threads

    configure_logging(log_level, json=json_logs)
    sock = reuse_port_socket(host, port)
    app = create_app(settings)
    scoring_threads()
    uvicorn.Server(uvicorn.Config(app, **UVICORN_OPTIONS)).run(sockets=[sock])


def _local_pools(settings: Settings) -> dict[str, LocalPool]:
    pools = load_policy(settings.policy_path).policy.pools
    return {name: spec for name, spec in pools.items() if isinstance(spec, LocalPool)}


def workers_problem(settings: Settings) -> str | None:
    """Why these settings cannot run several workers (None when they can)."""
    if not settings.start_engines:
        return None
    for name, spec in _local_pools(settings).items():
        for engine in [spec.engine, *([spec.canary.engine] if spec.canary is not None else [])]:
            wanted = list(range(engine.base_port, engine.base_port + engine.replicas))
            if choose_ports(engine.base_port, engine.replicas) != wanted:
                return (f"pool {name!r}: the engine ports {wanted[0]}-{wanted[-1]} are not all free; with --workers "
                        "the workers find the engines on base_port + i (stop what uses them or change base_port)")
    return None


@contextlib.contextmanager
def exported(name: str, value: str) -> Iterator[None]:
    """`os.environ[name] = value` inside the block only (a process started meanwhile inherits it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


class WorkerGroup:
    """Owns the worker processes and the engine supervisors of one `serve --workers N`."""

    def __init__(self, settings: Settings, host: str, port: int, count: int, log_level: str, json_logs: bool,
                 command: CommandFactory = engine_command) -> None:
        """`command` builds each engine replica's argv (`backends.engines.supervisor.CommandFactory`; tests pass a
        fake)."""
        self._settings = settings
        self._command = command
        self._args = (host, port, log_level, json_logs)
        self._count = count
        self._ctx = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.engines: EngineHost | None = None
        self._stopping = asyncio.Event()
        self._metrics_dir = settings.home / "metrics"
        self._registry = settings.home / "engines"

    def _worker_settings(self, index: int) -> Settings:
        log_path = self._settings.request_log
        return replace(self._settings, start_engines=False, home=self._settings.home / "workers" / str(index),
                       request_log=None if log_path is None else Path(f"{log_path}.{index}"))

    def _spawn(self, index: int) -> BaseProcess:
        host, port, log_level, json_logs = self._args
        proc = self._ctx.Process(target=_worker_main, name=f"cascade-worker-{index}",
                                 args=(self._worker_settings(index), host, port, log_level, json_logs))
        # the registry only where the parent runs the engines (with --no-engines nothing is published there)
        registry = str(self._registry) if self._settings.start_engines else os.environ.get(REGISTRY_ENV, "")
        with (exported(MULTIPROC_ENV, str(self._metrics_dir)), exported(REGISTRY_ENV, registry),
              exported(WORKER_ENV, str(index))):
            proc.start()  # this worker's environment, not the engines'
        log.info("worker %d started (pid %s)", index, proc.pid)
        return proc

    async def _start_engines(self) -> None:
        """The engines, run here for every worker (`gateway.control.engine_host`); a pool whose engines fail to
        start is reported by the workers' /readyz (503 for it), the others serve."""
        # the workers start no engines: restarts and scale events are counted here, once (`EngineHost.counters`)
        self.engines = EngineHost(self._settings, self._registry, self._metrics_dir, self._command)
        await self.engines.start()

    async def _watch(self) -> None:
        """Restart dead workers with a growing delay until stopped."""
        delays = [1.0] * len(self.procs)
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            for i, proc in enumerate(self.procs):
                if proc.exitcode is None or self._stopping.is_set():
                    continue
                log.error("worker %d (pid %s) exited with code %s; restarting in %.0f s", i, proc.pid,
                          proc.exitcode, delays[i])
                worker_exited(proc.pid or 0, self._metrics_dir)
                await asyncio.sleep(delays[i])
                delays[i] = min(30.0, delays[i] * 2)
                self.procs[i] = self._spawn(i)

    async def run(self) -> int:
        """Serve until SIGTERM / SIGINT; returns the exit code (1 when the port is taken). The port is bound here
        first (failing in one log line when it is taken) and held, bound and never listening so it takes no
        connection, while the group runs: nothing else binds it before the workers do, or while one restarts (a
        fresh clone's test once lost the port in that window)."""
        host, port = self._args[0], self._args[1]
        try:
            held = reuse_port_socket(host, port)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc)
            return 1
        with held:
            return await self._serve()

    async def _serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        prepare_multiprocess_dir(self._metrics_dir)
        shutil.rmtree(self._registry, ignore_errors=True)  # an earlier run's ports are not this one's
        engines = asyncio.create_task(self._start_engines()) if self._settings.start_engines else None
        self.procs = [self._spawn(i) for i in range(self._count)]
        try:
            await self._watch()
        finally:
            await self._stop(engines)
        return 0

    async def _stop(self, engines: asyncio.Task[None] | None) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                proc.terminate()  # SIGTERM: uvicorn drains requests in flight
        deadline = time.monotonic() + 40
        for proc in self.procs:
            await asyncio.to_thread(proc.join, max(0.1, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                await asyncio.to_thread(proc.join, 5)
        if engines is not None:
            engines.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await engines
        if self.engines is not None:
            await self.engines.aclose()


def run_workers(settings: Settings, host: str, port: int, count: int, log_level: str, json_logs: bool) -> int:
    """Run `count` workers (and the local engines) until SIGTERM / SIGINT; returns the exit code."""
    return asyncio.run(WorkerGroup(settings, host, port, count, log_level, json_logs).run())
