"""Engine supervisor: pure command/env building, supervision with a fake engine, and real vLLM engines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.engines.args import engine_command, engine_env
from backends.engines.cpu_pinning import engine_processes
from backends.engines.supervisor import Backoff, EngineStartError, EngineSupervisor, choose_ports, live_group_members
from backends.engines.vllm_plugin import NO_DETOKENIZE_XARG
from loadtest.processes import cpu_seconds
from policies.loader import parse_policy
from policies.schema import EngineSpec, LocalPool
from policies.speculative import NgramSpeculation
from tests.engines import SharedEngines, assert_engine_cores_placed, demo_policy_text
from tests.servers import until_async

FAKE_ENGINE = r"""
import http.server, subprocess, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
print("fake engine starting on", port, flush=True)
if mode == "die":
    print("fatal: out of cheese", flush=True)
    sys.exit(3)
if mode == "nodevice":  # vLLM's CUDA build where no GPU is visible (split: this source is in the log too)
    print("RuntimeError: Failed to infer " + "device type, please set the environment variable "
          "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.", flush=True)
    sys.exit(1)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("fake-child", child.pid, flush=True)
if mode == "hang":
    time.sleep(600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return min(port, 60000)


def test_engine_command_for_demo_model(tmp_path: Path) -> None:
    spec = EngineSpec(model="demo:micro", served_name="micro", max_model_len=1024, dtype="bfloat16")
    cmd = engine_command(spec, 8123, tmp_path)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--model": str(tmp_path / "micro"),
        "--served-model-name": "micro",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--max-model-len": "1024",
        "--dtype": "bfloat16",
    }
    assert not (tmp_path / "micro").exists()  # pure: nothing built


def test_engine_command_with_every_option() -> None:
    spec = EngineSpec(
        model="/models/big",
        served_name="big",
        quantization="compressed-tensors",
        gpu_memory_utilization=0.85,
        speculative=NgramSpeculation(method="ngram", num_speculative_tokens=4),
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpus_per_node=4,
        extra_args=("--enforce-eager", "--seed", "7"),
    )
    cmd = engine_command(spec, 9000)
    assert cmd[cmd.index("--model") + 1] == "/models/big"
    assert cmd[cmd.index("--quantization") + 1] == "compressed-tensors"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.85"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--pipeline-parallel-size") + 1] == "2"
    assert cmd[-3:] == ["--enforce-eager", "--seed", "7"]


def test_engine_command_rejects_unknown_demo_model() -> None:
    with pytest.raises(ValueError, match="unknown demo model"):
        engine_command(EngineSpec(model="demo:nope", served_name="x"), 8000)


def test_engine_env() -> None:
    spec = EngineSpec(
        model="m", served_name="m", kv_cache_space_gib=2, env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "0"}
    )
    env = engine_env(spec)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["OMP_NUM_THREADS"] == "1"
    assert env["HF_HUB_OFFLINE"] == "0"  # spec.env wins
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env(EngineSpec(model="m", served_name="m"))
    assert engine_env(EngineSpec(model="m", served_name="m"))["HF_HUB_OFFLINE"] == "1"


def test_choose_ports_skips_busy_ones() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        chosen = choose_ports(port, 2, taken=[port + 1])
    assert port not in chosen and port + 1 not in chosen and len(set(chosen)) == 2


def test_backoff_grows_and_caps() -> None:
    backoff = Backoff(base_s=1, cap_s=10)
    assert [backoff.delay(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff.delay(10_000) == 10


def _fake_supervisor(tmp_path: Path, mode: str, replicas: int = 1, timeout: float = 30,
                     hang_restart_after_s: float | None = None, **options: Any) -> EngineSupervisor:
    spec = EngineSpec(
        model="fake", served_name="fake", replicas=replicas, base_port=_free_port(), startup_timeout_s=timeout,
        hang_restart_after_s=hang_restart_after_s,
    )

    def command(spec: EngineSpec, port: int, models_dir: Path) -> list[str]:
        return [sys.executable, "-c", FAKE_ENGINE, str(port), mode]

    return EngineSupervisor(
        "fake",
        spec,
        home=tmp_path,
        command=command,
        check_interval_s=0.2,
        stop_grace_s=5,
        backoff=Backoff(base_s=0.1, cap_s=1),
        **options,
    )


def _child_pids(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("fake-child ")]


async def test_fake_engine_restart_and_stop(tmp_path: Path) -> None:
    messages: list[str] = []
    supervisor = _fake_supervisor(tmp_path, "serve", replicas=2)
    supervisor._progress = messages.append
    await supervisor.start()
    try:
        assert supervisor.ready_urls == supervisor.urls and len(supervisor.urls) == 2
        victim = supervisor.replicas[0]
        old_pid = victim.pid
        assert old_pid is not None and len(live_group_members(old_pid)) == 2  # server + its child
        os.kill(old_pid, signal.SIGKILL)
        await until_async(lambda: victim.pid != old_pid and victim.ready)
        assert victim.restarts == 1 and live_group_members(old_pid) == []  # orphaned child killed too
        assert any("exited with code -9; restarting" in m for m in messages)
    finally:
        await supervisor.aclose()
    for replica in supervisor.replicas:
        assert replica.pid is not None and live_group_members(replica.pid) == []
        assert not replica.ready
    assert all(not _pid_alive(pid) for pid in _child_pids(tmp_path / "logs" / "fake-0.log"))


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_live_engine_that_stops_answering_is_killed_and_restarted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    restarts: list[tuple[str, int, str]] = []
    supervisor = _fake_supervisor(tmp_path, "serve", hang_restart_after_s=1.0,
                                  on_restart=lambda *event: restarts.append(event))
    await supervisor.start()
    try:
        replica = supervisor.replicas[0]
        hung_pid = replica.pid
        assert hung_pid is not None and replica.ready
        os.kill(hung_pid, signal.SIGSTOP)  # alive, holding its port, answering nothing
        await until_async(lambda: replica.pid != hung_pid and replica.ready, timeout=30)
        assert restarts == [("fake", 0, "hung")] and replica.restarts == 1
        assert live_group_members(hung_pid) == []  # the stopped leader and its child were killed
        assert any("answered no health check or request" in r.getMessage() and r.levelname == "WARNING"
                   for r in caplog.records)
        async with httpx.AsyncClient() as client:
            assert (await client.get(replica.url + "/health")).status_code == 200  # the new one serves
    finally:
        await supervisor.aclose()


async def test_an_engine_that_answers_requests_is_not_hung_though_its_health_check_is_late(tmp_path: Path) -> None:
    restarts: list[tuple[str, int, str]] = []
    supervisor = _fake_supervisor(tmp_path, "serve", hang_restart_after_s=1.0,
                                  on_restart=lambda *event: restarts.append(event),
                                  answered=lambda url: time.monotonic())  # the gateway got an answer just now
    await supervisor.start()
    replica = supervisor.replicas[0]
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        await until_async(lambda: not replica.ready, timeout=30)  # a health check timed out (5 s)...
        await asyncio.sleep(1.5)
        assert restarts == [] and replica.restarts == 0  # ...but it is answering traffic: left alone
    finally:
        os.kill(replica.pid, signal.SIGCONT)
        await supervisor.aclose()


async def test_start_error_carries_log_tail(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError, match=r"(?s)exited with code 3.*out of cheese"):
        await _fake_supervisor(tmp_path, "die").start()


async def test_start_error_without_a_gpu_says_so_first(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError) as caught:
        await _fake_supervisor(tmp_path, "nodevice").start()
    first = str(caught.value).splitlines()[0]
    assert "exited with code 1" in first and "needs a GPU that the engine can see" in first
    assert "Failed to infer device type" in str(caught.value)  # vLLM's own line stays in the tail
    (tmp_path / "other").mkdir()
    with pytest.raises(EngineStartError) as other:  # another failure: no such hint
        await _fake_supervisor(tmp_path / "other", "die").start()
    assert "needs a GPU" not in str(other.value)


async def test_start_timeout_stops_the_group(tmp_path: Path) -> None:
    supervisor = _fake_supervisor(tmp_path, "hang", timeout=1.5)
    with pytest.raises(EngineStartError, match="not healthy after 2 s"):
        await supervisor.start()
    pid = supervisor.replicas[0].pid
    assert pid is not None and live_group_members(pid) == []


# ---------------------------------------------------------------- real vLLM engines (minutes)


def _spec(name: str, port: int) -> EngineSpec:
    return EngineSpec(
        model=f"demo:{name}",
        served_name=name,
        max_model_len=1024,
        dtype="bfloat16",
        kv_cache_space_gib=1,
        base_port=port,
        startup_timeout_s=900,
        extra_args=("--enforce-eager",),
    )  # skips ~80 s of torch.compile per start


async def _chat(client: httpx.AsyncClient, url: str, model: str) -> None:
    body = {
        "model": model,
        "max_tokens": 8,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital?"}],
    }
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    response.raise_for_status()
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    stream = body | {"stream": True, "stream_options": {"include_usage": True}}
    chunks = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=stream) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert any(choice["delta"].get("content") for chunk in chunks for choice in chunk["choices"])


@pytest.mark.engines
async def test_real_engines_serve_side_by_side(shared_engines: SharedEngines) -> None:
    """Two real engines of one host, the demo pair the end-to-end tests share (started by this supervisor): each
    serves (plain and streamed), and their engine cores are placed beside their workers (or both left unbound where
    the workers share cores). That `aclose` stops every process of each group is held each time shared engines are
    stopped (`tests/engines.py`); a killed engine restarted, its old group gone and the new one placed:
    tests/chaos/test_faults_together.py, on the supervisor a gateway runs."""
    pools = parse_policy(demo_policy_text(), "demo.yaml").policy.pools
    local = {name: pool.engine for name, pool in pools.items() if isinstance(pool, LocalPool)}
    engines = dict(zip(local, await asyncio.to_thread(shared_engines.supervisors, list(local.values())),
                       strict=True))
    async with httpx.AsyncClient(timeout=60) as client:
        for pool in engines.values():
            await _chat(client, pool.ready_urls[0], pool.spec.served_name)
        assert_engine_cores_placed(engines)
    # Each engine forked its engine core and its worker (backends/engines/vllm_start.py), where vLLM alone spawns
    # them (an engine start 2.5x the CPU): the plugin says so in the API server and in the engine core as each
    # starts its child
    for pool in engines.values():
        log = pool.replicas[0].log_path.read_text(errors="replace")
        said = [line.split(" pid=")[0] for line in log.splitlines() if "processes start by fork" in line]
        assert set(said) == {"(APIServer", "(EngineCore"}, log[-3000:]  # a restart adds its own pair
    # A completions request that asks is not detokenized (the plugin's NO_DETOKENIZE_XARG: the quantization
    # evaluation's scoring), the same logprobs; one that does not ask is
    async with httpx.AsyncClient(timeout=60) as client:
        for pool in engines.values():
            body = {"model": pool.spec.served_name, "prompt": "one two three", "max_tokens": 1, "temperature": 0,
                    "prompt_logprobs": 2}
            plain, bare = [(await client.post(f"{pool.ready_urls[0]}/v1/completions", json=b)).json()["choices"][0]
                           for b in (body, {**body, "vllm_xargs": {NO_DETOKENIZE_XARG: 0}})]
            entries = [(plain_at, bare_at) for plain_at, bare_at in
                       zip(plain["prompt_logprobs"], bare["prompt_logprobs"], strict=True) if plain_at]
            assert entries and bare["text"] == ""
            for plain_at, bare_at in entries:
                assert plain_at.keys() == bare_at.keys()
                for token, logprob in plain_at.items():
                    assert isinstance(logprob["decoded_token"], str) and bare_at[token]["decoded_token"] is None
                    # one request at a time on the engine: the same batch shape, so equal up to float32 rounding
                    assert bare_at[token]["logprob"] == pytest.approx(logprob["logprob"], rel=1e-5, abs=1e-6)
    # Between requests the workers wait instead of spinning (backends/engines/vllm_plugin.py caps vLLM's 1 s
    # busy-poll at CPU_IDLE_SPIN_S): uncapped, each spun a whole core for the second after its last answer
    workers = [w for pool in engines.values() if pool.replicas[0].pid
               for w in engine_processes(pool.replicas[0].pid).workers]
    assert workers
    before, window_s = {w: cpu_seconds(w) for w in workers}, 2.0
    await asyncio.sleep(window_s)  # the window measured, not a wait for an event
    used = {w: round(cpu_seconds(w) - before[w], 2) for w in workers}
    assert max(used.values()) < 0.25 * window_s, f"CPU seconds of each idle worker in {window_s} s: {used}"



async def test_a_replica_detached_while_its_health_check_runs_is_not_restarted(tmp_path: Path) -> None:
    restarts: list[tuple[str, int, str]] = []
    supervisor = _fake_supervisor(tmp_path, "serve", replicas=2, hang_restart_after_s=1.0,
                                  on_restart=lambda *event: restarts.append(event))
    await supervisor.start()
    leaving = supervisor.replicas[1]
    assert leaving.pid is not None
    try:
        os.kill(leaving.pid, signal.SIGSTOP)  # its health check now waits for the client's 5 s timeout
        await asyncio.sleep(1.0)  # the monitor is inside that check
        supervisor.detach(leaving)  # as a scale-down does: it drains, then its caller stops it
        await asyncio.sleep(6.0)  # the check has ended and the hang limit (1 s) has long passed
        assert restarts == [] and leaving.restarts == 0 and leaving.restart_task is None
        assert supervisor.replicas == (supervisor.replicas[0],) and supervisor.replicas[0].ready
    finally:
        os.kill(leaving.pid, signal.SIGCONT)
        await supervisor.stop(leaving)
        await supervisor.aclose()
