"""Engine-core pinning on real processes named like vLLM's (the kernel's affinity calls, no fakes)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.cpu_pinning import engine_processes, pin_engine_core, thread_affinity
from backends.supervisor import Backoff, EngineSupervisor
from policies.schema import EngineSpec

ALL_CPUS = frozenset(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(ALL_CPUS) < 2 or not Path("/proc/self/task").is_dir(),
                                    reason="needs Linux and at least 2 usable CPUs")

# A stand-in for vLLM's API server: two children renamed like vLLM's, the worker bound to `worker_cpus`
# (as vLLM binds its OpenMP threads), the engine core unbound and with a second thread.
FAKE_API_SERVER = r"""
import subprocess, sys, time
worker_cpus = sys.argv[1]
child = r'''
import os, sys, threading, time
name, cpus = sys.argv[1], sys.argv[2]
open("/proc/self/comm", "w").write(name)
if cpus != "-":
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
'''
kids = [subprocess.Popen([sys.executable, "-c", child, name, cpus], stdout=subprocess.PIPE)
        for name, cpus in (("VLLM::EngineCore", "-"), ("VLLM::Worker", worker_cpus))]
for kid in kids:
    kid.stdout.readline()
print("up", flush=True)
time.sleep(600)
"""


@pytest.fixture
def api_server() -> Iterator[object]:
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
def test_an_unbound_worker_leaves_the_engine_core_alone(api_server: object) -> None:
    pid = api_server("-")  # type: ignore[operator]  # a CUDA engine's worker: may run anywhere
    assert pin_engine_core(pid) is None
    assert thread_affinity(engine_processes(pid).engine_cores[0]) == ALL_CPUS


def test_no_such_process_finds_nothing() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert engine_processes(gone.pid).engine_cores == ()
    assert pin_engine_core(gone.pid) is None


@needs_two_cpus
@pytest.mark.parametrize("pin", [True, False])
async def test_the_supervisor_pins_a_started_replica_unless_told_not_to(tmp_path: Path, pin: bool) -> None:
    from tests.backends.test_supervisor import FAKE_ENGINE, _free_port

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
