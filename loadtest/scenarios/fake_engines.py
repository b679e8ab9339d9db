"""Backends of the load scenarios: fake engines served in this process (so a scenario can slow one down or
kill it mid-run), a gateway process with or without its real local engines, and the policies they use.

The tenants `gold` (priority 5) and `free` (priority 0) are the scenarios' own, with fixed demo keys; their
traffic mix shows the ladder's priority shedding. Every process started here is stopped by `Procs.stop_all`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import yaml

from loadtest.fake_upstream import FakeUpstream
from loadtest.processes import Procs, free_port, wait_ready

__all__ = ["FREE_KEY", "GOLD_KEY", "SHIPPED_POLICY", "InProcessServer", "ShedStep", "fake_policy", "ladder_yaml",
           "real_policy", "shipped_routing", "start_gateway", "tenants_yaml"]

GOLD_KEY, FREE_KEY = "sk-load-gold", "sk-load-free"


def _sha(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def tenants_yaml() -> str:
    return (f"tenants:\n  gold: {{api_key_sha256: ['{_sha(GOLD_KEY)}'], priority: 5}}\n"
            f"  free: {{api_key_sha256: ['{_sha(FREE_KEY)}'], priority: 0}}\n")


@dataclass(frozen=True, slots=True)
class ShedStep:
    """A ladder step that sheds priority < 1 when `signal` of `pool` goes above `enter` (below `exit` + hold)."""

    name: str
    signal: str
    pool: str
    enter: float
    exit: float
    hold_s: float = 5.0
    retry_after_s: int = 5


def ladder_yaml(steps: Sequence[ShedStep]) -> str:
    lines = ["degradation:", "  steps:"]
    for s in steps:
        lines.append(f"    - {{name: {s.name}, signal: {s.signal}, pool: {s.pool}, enter_above: {s.enter}, "
                     f"exit_below: {s.exit}, hold_s: {s.hold_s}, action: {{type: shed, below_priority: 1, "
                     f"retry_after_s: {s.retry_after_s}}}}}")
    return "\n".join(lines) + "\n"


SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def shipped_routing(policy: Path = SHIPPED_POLICY) -> str:
    """The `routing:` block of the shipped policy, as its text (comments and all), so that a scenario routes as
    a deployment does: its share-based threshold keeps a share of the requests on the flagship whatever the
    scorer's scale (a fixed cut above the calibrated scores sent every request to micro). The scenarios' pools
    are named as the shipped ones; a block that names others is refused here."""
    lines = policy.read_text().splitlines()
    start = lines.index("routing:")
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
    block = "\n".join(lines[start:end]).rstrip() + "\n"
    routing = yaml.safe_load(block)["routing"]
    if (routing.get("micro_pool"), routing.get("flagship_pool")) != ("micro", "flagship"):
        raise ValueError(f"{policy}: the scenarios' pools are micro and flagship, its routing block names "
                         f"{routing.get('micro_pool')} and {routing.get('flagship_pool')}")
    return block


def fake_policy(micro_urls: Sequence[str], flagship_urls: Sequence[str], steps: Sequence[ShedStep]) -> str:
    """Two remote pools of fake engines (several replicas each allowed), the tenants, the ladder."""
    def pool(name: str, urls: Sequence[str], price: tuple[str, str]) -> str:
        quoted = ", ".join(f'"{u}"' for u in urls)
        return (f"  {name}:\n    type: remote\n    urls: [{quoted}]\n    model: {name}-model\n"
                f'    price: {{input_per_mtok: "{price[0]}", output_per_mtok: "{price[1]}"}}\n')
    return ("version: 1\npools:\n" + pool("micro", micro_urls, ("0.20", "0.20"))
            + pool("flagship", flagship_urls, ("3.00", "15.00")) + shipped_routing() + tenants_yaml()
            + ladder_yaml(steps))


def real_policy(steps: Sequence[ShedStep], max_num_seqs: int | None = None, micro_autoscale: str = "") -> str:
    """The demo pools (local vLLM engines with the tiny demo models, as `policies/demo-ladder.yaml`), the
    scenario tenants, the ladder. `max_num_seqs`: cap both engines' batch (a surge then queues).
    `micro_autoscale`: the micro pool's `autoscale:` mapping in flow style (`policies.autoscale`)."""
    engine = "max_model_len: 1024, dtype: bfloat16, kv_cache_space_gib: 1"
    if max_num_seqs is not None:
        engine += f', extra_args: ["--max-num-seqs", "{max_num_seqs}"]'
    return f"""version: 1
pools:
  micro:
    type: local
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
    engine: {{model: demo:micro, served_name: micro, {engine}, base_port: 8101}}
{f"    autoscale: {micro_autoscale}{chr(10)}" if micro_autoscale else ""}  flagship:
    type: local
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
    engine: {{model: demo:flagship, served_name: flagship, {engine}, base_port: 8201}}
{shipped_routing()}{tenants_yaml()}{ladder_yaml(steps)}"""


class InProcessServer:
    """A fake engine on a loopback port, served by uvicorn in a thread of this process. `kill()` drops it
    at once (open connections too), as a crashed replica would; `start()` brings it back on the same port."""

    def __init__(self, app: FakeUpstream, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> InProcessServer:
        self.app.waiting = 0  # a restarted engine starts empty (the killed loop's waiters never finished)
        self.app.running = 0
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", loop="asyncio",
                                http="httptools", lifespan="off")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake engine on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = self._server.force_exit = True
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()


def start_gateway(procs: Procs, policy: Path, home: Path | None, *, engines: bool, scorer: str, redis_prefix: str,
                  ready_timeout_s: float, name: str = "gateway", env: dict[str, str] | None = None,
                  log_level: str = "WARNING") -> str:
    """Start `python -m gateway serve` with `policy`; returns its base URL once `/readyz` answers 200 (with
    engines: once every pool has a ready replica, which takes minutes on 2 cores). `home`: its CASCADE_HOME
    (None: the default `.cascade`, where the demo models are built once and reused). `env`: more environment
    variables of the gateway (e.g. `CASCADE_REDIS_URL`)."""
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port),
           "--scorer", scorer, "--redis-prefix", redis_prefix, "--log-level", log_level]
    if not engines:
        cmd.append("--no-engines")
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
    extra = {"CASCADE_HOME": str(home)} if home is not None else {}
    proc = procs.start(name, cmd, extra | (env or {}))
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc, ready_timeout_s, name, lambda: procs.log_tail(name))
    return base
