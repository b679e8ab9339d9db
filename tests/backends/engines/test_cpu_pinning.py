"""Engine-core pinning on real processes named like vLLM's (the kernel's affinity calls, no fakes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.engines.cpu_pinning import (
    cores_beside,
    engine_processes,
    engine_worker_cores,
    hold_engine,
    parse_cpus,
    pin_engine_core,
    release_front_end,
    thread_affinity,
)
from backends.engines.supervisor import Backoff, EngineSupervisor
from loadtest.processes import free_port, policy_text
from policies.schema import EngineSpec
from tests.engines import SharedEngines
from tests.servers import start_gateway, until

ALL_CPUS = frozenset(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(ALL_CPUS) < 2 or not Path("/proc/self/task").is_dir(),
                                    reason="needs Linux and at least 2 usable CPUs")
# The pinning looks at every vLLM worker process on the host (another engine's worker on the same cores leaves
# an engine core unbound), so these tests must not overlap the real engines' tests nor one another under
# pytest-xdist: they run on the worker of the "engines" group, after its engine tests (the shared engines are
# stopped first), and wait for the engines of the tests beside that group to end (`_no_other_vllm_workers`).
pytestmark = pytest.mark.xdist_group("engines")

# A stand-in for vLLM's API server: it starts an engine core (unbound, with a second thread), which starts a
# worker bound to `worker_cpus` (as vLLM binds its OpenMP threads); each renamed like vLLM's.
FAKE_API_SERVER = r"""
import subprocess, sys, time
worker_cpus = sys.argv[1]
child = r'''
import os, subprocess, sys, threading, time
name, cpus, grandchild = sys.argv[1], sys.argv[2], sys.argv[3:]
open("/proc/self/comm", "w").write(name)
if cpus != "-":
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
if grandchild:
    kid = subprocess.Popen([sys.executable, "-c", sys.argv[0] if False else CODE, *grandchild], stdout=subprocess.PIPE)
    kid.stdout.readline()
print("ready", flush=True)
time.sleep(600)
'''
code = "CODE = " + repr(child) + "\n" + child
core = subprocess.Popen([sys.executable, "-c", code, "VLLM::EngineCore", "-", "VLLM::Worker", worker_cpus],
                        stdout=subprocess.PIPE)
core.stdout.readline()
print("up", flush=True)
time.sleep(600)
"""


SIBLING_ENGINES_S = 600.0
"""How long a pinning test waits for the engines of a test beside it under pytest-xdist (the int8 demo's, the chaos
run's: each ends its engines with itself, within minutes; one that does not is that test's failure)."""
OTHER_ENGINES_S = 10.0
"""How long it waits for any other vLLM worker (an engine of an earlier test still dying, another checkout's)."""


def _no_other_vllm_workers() -> None:
    """Stop this session's shared real engines (a later test that wants one starts it again), then wait until no
    vLLM worker is left on the host: the pinning rightly leaves an engine core alone when another worker shares its
    cores. A worker of a test running beside this one (another pytest-xdist worker of this session: the int8 demo
    and the chaos run have groups of their own) is waited for up to `SIBLING_ENGINES_S`; any other, e.g. a real
    engine of an earlier test on this worker still dying, or another checkout's, `OTHER_ENGINES_S`."""
    for engines in SharedEngines.instances:
        engines.stop_all()
    started = other_since = time.monotonic()
    while workers := _vllm_workers():
        now = time.monotonic()
        if all(_beside_this_worker(pid) for pid in workers):
            other_since, waited, limit = now, now - started, SIBLING_ENGINES_S
        else:  # counted from when one was first not a sibling's: a sibling's worker whose engine core has just
            # died is reparented, so it is no longer seen as beside for the moment it takes to die itself
            waited, limit = now - other_since, OTHER_ENGINES_S
        assert waited < limit, (
            f"another vLLM worker runs on this host (pids {', '.join(map(str, workers))}, waited {waited:.0f} s)")
        time.sleep(0.1)


def _vllm_workers() -> list[int]:
    return [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/comm") if _comm(p).startswith("VLLM::Worker")]


def _beside_this_worker(pid: int) -> bool:
    """Whether process `pid` descends from another pytest-xdist worker of this session (a sibling of this process,
    both children of the session's controller), not from this process nor from outside the session."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return False
    controller, me = os.getppid(), os.getpid()
    while pid > 1:
        parent = _parent(pid)
        if parent in (me, None):
            return False
        if parent == controller:
            return True
        pid = parent
    return False


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None  # the process ended meanwhile


def _comm(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""  # the process ended meanwhile


@pytest.fixture
def api_server() -> Iterator[object]:
    _no_other_vllm_workers()
    started: list[subprocess.Popen[bytes]] = []

    def start(worker_cpus: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", FAKE_API_SERVER, worker_cpus], stdout=subprocess.PIPE,
                                start_new_session=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        return proc.pid

    yield start
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait()
    deadline = time.monotonic() + 10
    while any(_group_alive(proc.pid) for proc in started):  # the next test must not see these workers
        assert time.monotonic() < deadline, "the fake engine processes outlived SIGKILL"
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@needs_two_cpus
def test_the_engine_core_moves_to_its_workers_cores(api_server: object) -> None:
    first = min(ALL_CPUS)
    pid = api_server(str(first))  # type: ignore[operator]
    procs = engine_processes(pid)
    assert len(procs.engine_cores) == 1 and len(procs.workers) == 1
    assert thread_affinity(procs.engine_cores[0]) == ALL_CPUS

    pinned = pin_engine_core(pid)

    assert pinned == (procs, frozenset({first}))
    assert thread_affinity(procs.engine_cores[0]) == {first}
    assert len(os.listdir(f"/proc/{procs.engine_cores[0]}/task")) == 2  # every thread, not just the main one
    assert all(os.sched_getaffinity(int(t)) == {first} for t in os.listdir(f"/proc/{procs.engine_cores[0]}/task"))
    assert pin_engine_core(pid) is None  # already there: nothing more to do


@needs_two_cpus
def test_two_engines_on_the_same_cores_leave_both_engine_cores_unbound(api_server: object) -> None:
    first = min(ALL_CPUS)
    one = api_server(str(first))  # type: ignore[operator]
    assert pin_engine_core(one) is not None
    assert thread_affinity(engine_processes(one).engine_cores[0]) == {first}

    two = api_server(str(first))  # type: ignore[operator]  # vLLM binds the second engine's worker there too
    assert pin_engine_core(two) is None
    assert thread_affinity(engine_processes(two).engine_cores[0]) == ALL_CPUS
    assert thread_affinity(engine_processes(one).engine_cores[0]) == ALL_CPUS  # the first one is released
    assert pin_engine_core(one) is None  # and stays so while the other is there


@needs_two_cpus
def test_an_unbound_worker_leaves_the_engine_core_alone(api_server: object) -> None:
    pid = api_server("-")  # type: ignore[operator]  # a CUDA engine's worker: may run anywhere
    assert pin_engine_core(pid) is None
    assert thread_affinity(engine_processes(pid).engine_cores[0]) == ALL_CPUS


@needs_two_cpus
def test_a_new_version_is_placed_off_the_cores_of_the_one_it_replaces(api_server: object) -> None:
    first = min(ALL_CPUS)
    old = api_server(str(first))  # type: ignore[operator]
    bind = cores_beside((old,))
    assert bind is not None
    low, _, high = bind.partition("-")
    chosen = set(range(int(low), int(high or low) + 1))
    assert chosen and chosen <= ALL_CPUS - {first}  # e.g. "1" on a 2-core machine whose core 0 is taken
    everywhere = api_server(",".join(map(str, sorted(ALL_CPUS))))  # type: ignore[operator]
    assert cores_beside((everywhere,)) is None  # no core free of it
    assert cores_beside(()) is None


@needs_two_cpus
def test_a_starting_engine_is_held_on_its_cores_then_its_front_end_released(api_server: object) -> None:
    held = frozenset({max(ALL_CPUS)})
    pid = api_server("-")  # type: ignore[operator]  # its engine core is unbound, as vLLM leaves it at start
    (engine_core,) = engine_processes(pid).engine_cores
    hold_engine(pid, held)
    assert thread_affinity(pid) == held and thread_affinity(engine_core) == held  # every process, every thread
    release_front_end(pid)
    assert thread_affinity(pid) == ALL_CPUS  # the API server serves from every core again
    assert thread_affinity(engine_core) == held  # the engine core stays: pin_engine_core places it


@needs_two_cpus
def test_the_cores_of_cpu_engines_workers_are_found_and_a_serving_gateway_keeps_off_them(
        api_server: object, tmp_path: Path) -> None:
    first = min(ALL_CPUS)
    assert engine_worker_cores(ALL_CPUS) == frozenset()
    api_server("-")  # type: ignore[operator]  # a CUDA engine's worker, bound to nothing: takes no core
    assert engine_worker_cores(ALL_CPUS) == frozenset()
    api_server(str(first))  # type: ignore[operator]
    assert engine_worker_cores(ALL_CPUS) == {first}
    assert engine_worker_cores(ALL_CPUS - {first}) == frozenset()  # only cores the caller may use count

    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "loadtest.fake_upstream", "--port", str(port), "--model", "m"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(f"http://127.0.0.1:{port}", "m", f"http://127.0.0.1:{port}", "m"))
    try:
        for mode, expected in (("avoid", ALL_CPUS - {first}), ("share", ALL_CPUS)):
            gateway = start_gateway(policy, free_port(), f"test:cores:{mode}:", tmp_path / mode,
                                    env={"CASCADE_ENGINE_CORES": mode})
            try:  # the first check runs as the gateway starts: bound by the time it answers, or soon after
                _until_bound(gateway.pid, expected)
            finally:
                gateway.kill()
                gateway.wait()
    finally:
        upstream.kill()
        upstream.wait()


def _until_bound(pid: int, cores: frozenset[int]) -> None:
    until(lambda: thread_affinity(pid) == cores, timeout=10,
          describe=lambda: f"bound to {sorted(thread_affinity(pid))}, not {sorted(cores)}")


# A stand-in for another pytest-xdist worker of the session: it starts a process named like a vLLM worker, which
# lives `sys.argv[1]` seconds, and waits for it.
FAKE_SIBLING = r"""
import subprocess, sys
worker = ("import sys, time; open('/proc/self/comm', 'w').write('VLLM::Worker'); print('up', flush=True); "
          "time.sleep(float(sys.argv[1]))")
child = subprocess.Popen([sys.executable, "-c", worker, sys.argv[1]], stdout=subprocess.PIPE)
print(child.stdout.readline().decode(), end="", flush=True)
child.wait()
"""


def _only_group(monkeypatch: pytest.MonkeyPatch, pgid: int) -> None:
    """Have the wait see only the stand-in's workers (its process group `pgid`): a real engine of a test running
    beside this one (the int8 demo's, the chaos run's) is not the stand-in this test times."""
    every = _vllm_workers

    def in_group(pid: int) -> bool:
        try:
            return os.getpgid(pid) == pgid
        except ProcessLookupError:
            return False

    monkeypatch.setattr(sys.modules[__name__], "_vllm_workers", lambda: [p for p in every() if in_group(p)])


@pytest.mark.parametrize("sibling", [True, False])
def test_the_wait_for_vllm_workers_gives_a_test_beside_this_one_time_and_no_other(
        sibling: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    lives_s = 2.0 if sibling else 600.0
    beside = subprocess.Popen([sys.executable, "-c", FAKE_SIBLING, str(lives_s)], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert beside.stdout is not None and beside.stdout.readline() == b"up\n"
        _only_group(monkeypatch, beside.pid)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw9")
        # the session's controller: the stand-in's parent when it is this test's sibling, else somewhere else
        monkeypatch.setattr(os, "getppid", lambda: beside.pid if sibling else 1)
        monkeypatch.setattr(sys.modules[__name__], "OTHER_ENGINES_S", 1.0)
        started = time.monotonic()
        if sibling:
            _no_other_vllm_workers()  # waits for it to end
            assert time.monotonic() - started >= 1.0
        else:
            with pytest.raises(AssertionError, match="another vLLM worker runs on this host"):
                _no_other_vllm_workers()
            assert 1.0 <= time.monotonic() - started < 5.0
    finally:
        os.killpg(beside.pid, 9)
        beside.wait()


def test_a_siblings_worker_orphaned_while_it_dies_gets_the_other_limit_from_then(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sibling's worker whose engine core dies first is reparented, so it stops looking like a sibling's: it gets
    `OTHER_ENGINES_S` from that moment, not from when the wait began (which failed at once after a long wait)."""
    worker = subprocess.Popen([sys.executable, "-c", FAKE_SIBLING, "600"], stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"up\n"
        _only_group(monkeypatch, worker.pid)
        started = time.monotonic()
        monkeypatch.setattr(sys.modules[__name__], "_beside_this_worker", lambda pid: time.monotonic() - started < 1.5)
        monkeypatch.setattr(sys.modules[__name__], "OTHER_ENGINES_S", 1.0)
        with pytest.raises(AssertionError, match="another vLLM worker runs on this host"):
            _no_other_vllm_workers()
        assert 2.4 <= time.monotonic() - started < 6.0  # a sibling's for 1.5 s, then 1 s as another's
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()


def test_cpu_lists_are_parsed() -> None:
    assert parse_cpus("1") == {1} and parse_cpus("2-4") == {2, 3, 4} and parse_cpus("0, 2-3") == {0, 2, 3}


def test_no_such_process_finds_nothing() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert engine_processes(gone.pid).engine_cores == ()
    assert pin_engine_core(gone.pid) is None


@needs_two_cpus
@pytest.mark.parametrize("pin", [True, False])
async def test_the_supervisor_pins_a_started_replica_unless_told_not_to(tmp_path: Path, pin: bool) -> None:
    from tests.backends.engines.test_supervisor import FAKE_ENGINE, _free_port

    _no_other_vllm_workers()
    first = min(ALL_CPUS)
    # the fake engine answers /health; its child is the fake API server's process tree
    engine = FAKE_ENGINE.replace(
        'child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])',
        f"child = subprocess.Popen([sys.executable, '-c', {FAKE_API_SERVER!r}, '{first}'], stdout=subprocess.PIPE)\n"
        "child.stdout.readline()",
    )
    assert engine != FAKE_ENGINE
    spec = EngineSpec(model="fake", served_name="fake", base_port=_free_port(), startup_timeout_s=30,
                      pin_engine_core=pin)
    messages: list[str] = []
    sup = EngineSupervisor("fake", spec, home=tmp_path, progress=messages.append, check_interval_s=0.2,
                           stop_grace_s=5, backoff=Backoff(base_s=0.1, cap_s=1),
                           command=lambda spec, port, models: [sys.executable, "-c", engine, str(port), "serve"])
    async with sup:
        pid = sup.replicas[0].pid
        assert pid is not None
        cores = engine_processes(pid).engine_cores
        assert len(cores) == 1
        assert thread_affinity(cores[0]) == ({first} if pin else ALL_CPUS)
        said = any(f"engine core (pid {cores[0]}) pinned to its worker's CPUs [{first}]" in m for m in messages)
        assert said is pin
    deadline = time.monotonic() + 10
    while _group_alive(pid):  # the next test must not see these workers
        assert time.monotonic() < deadline, "the fake engine processes outlived the supervisor"
        await asyncio.sleep(0.05)
