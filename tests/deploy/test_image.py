"""The container image end to end, with podman: built by scripts/build_image.sh (or reused when an image of the
same build inputs exists), the compose stack (deploy/compose.yaml: gateway, two vLLM engines, Redis) answers
a routed request sent with the official openai client and records its cost in Redis; a gateway started
without a reachable Redis stays up and not ready, says why in one log line, and is never restarted.

Slow (a first build takes many minutes; the engines 2-4 minutes to load), so these run only when selected:
`pytest tests/deploy/test_image.py -m image` (.ci/run does). Needs podman and mmdebstrap, which
scripts/build_image.sh installs as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
REDIS_IMAGE = "localhost/cascade-redis:bookworm"
READY_TIMEOUT_S = 900.0

pytestmark = pytest.mark.image


def _can_build() -> bool:
    return shutil.which("podman") is not None or (os.geteuid() == 0 and shutil.which("apt-get") is not None)


if not _can_build():
    pytest.skip("needs podman (or root with apt-get to install it)", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _only_when_selected(request: pytest.FixtureRequest) -> None:
    """A plain `pytest` run (the README's test command) does not build images: `-m image` opts in."""
    if "image" not in str(request.config.getoption("markexpr") or ""):
        pytest.skip("container image tests run only when selected: -m image")


def _source_hash() -> str:
    out = subprocess.run(["python3", str(ROOT / "scripts" / "image_hash.py"), "cpu"], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def _podman_env(image: str) -> dict[str, str]:
    """The environment for podman here (scripts/podman_env.sh: CONTAINERS_CONF where this machine needs it)."""
    script = f'. scripts/podman_env.sh && cascade_podman_env {image} && echo "${{CONTAINERS_CONF:-}}"'
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:  # podman's own words, not only the exit status (CI once failed with nothing more)
        pytest.fail(f"podman cannot run {image} on this machine:\n{done.stderr.strip()}", pytrace=False)
    conf = done.stdout
    env = dict(os.environ)
    if conf.strip():
        env["CONTAINERS_CONF"] = conf.strip()
    return env


@dataclass(frozen=True)
class Built:
    image: str
    env: dict[str, str]

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, check=check, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def built() -> Built:
    """The image of this tree: `localhost/cascade-gateway:src-HASH`, built unless it exists."""
    image = f"localhost/cascade-gateway:src-{_source_hash()}"
    have = shutil.which("podman") and subprocess.run(["podman", "image", "exists", image]).returncode == 0
    have = have and subprocess.run(["podman", "image", "exists", REDIS_IMAGE]).returncode == 0
    if not have:
        started = time.monotonic()
        subprocess.run(["bash", str(ROOT / "scripts" / "build_image.sh")], cwd=ROOT, check=True, timeout=3600)
        print(f"image built in {time.monotonic() - started:.0f} s")
    return Built(image, _podman_env(image))


def _wait_ready(base: str, timeout_s: float, until: str = "ready") -> dict[str, Any]:
    """Poll /readyz until `until` holds ("ready": 200; "engines-not-redis": every pool ready, Redis not)."""
    deadline, body = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(base + "/readyz", timeout=3)
            body = dict(resp.json())
        except (httpx.HTTPError, ValueError):
            time.sleep(2)
            continue
        pools = body.get("pools") or {}
        if until == "ready" and resp.status_code == 200:
            return body
        if until == "engines-not-redis" and pools and all(pools.values()) and body.get("redis") is False:
            assert resp.status_code == 503
            return body
        time.sleep(2)
    raise AssertionError(f"/readyz not {until} after {timeout_s:.0f} s: {body}")


@dataclass(frozen=True)
class Stack:
    built: Built
    project: str
    base: str

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"


@pytest.fixture(scope="module")
def stack(built: Built) -> Iterator[Stack]:
    """deploy/compose.yaml up under a project of its own, ready (or the test fails with the logs); down -v after."""
    project, port = f"cascadetest{uuid.uuid4().hex[:8]}", free_port()
    env = built.env | {"CASCADE_IMAGE": built.image, "CASCADE_REDIS_IMAGE": REDIS_IMAGE, "CASCADE_PORT": str(port)}
    compose = ["podman-compose", "-p", project, "-f", str(COMPOSE)]
    subprocess.run([*compose, "up", "-d"], env=env, check=True, capture_output=True, timeout=300)
    result = Stack(built, project, f"http://127.0.0.1:{port}")
    try:
        started = time.monotonic()
        try:
            _wait_ready(result.base, READY_TIMEOUT_S)
        except AssertionError:
            for service in ("gateway", "engine-micro", "engine-flagship", "redis"):
                logs = built.podman("logs", "--tail", "30", result.container(service), check=False)
                print(f"--- {service}\n{logs.stdout}{logs.stderr}")
            raise
        print(f"stack ready in {time.monotonic() - started:.0f} s")
        yield result
    finally:
        subprocess.run([*compose, "down", "-v"], env=env, capture_output=True, timeout=300)


def test_routed_request_through_the_stack(stack: Stack) -> None:
    import openai

    client = openai.OpenAI(base_url=stack.base + "/v1", api_key="unused-in-the-demo-policy", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Translate 'good morning' into French."}], max_tokens=8)
    answer = raw.parse()
    assert raw.headers["x-cascade-pool"] in {"micro", "flagship"}
    assert 0.0 <= float(raw.headers["x-cascade-score"]) <= 1.0
    assert answer.model == raw.headers["x-cascade-pool"]  # each engine serves its pool's name
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert isinstance(answer.choices[0].message.content, str)
    # the cost record is in the stack's Redis, which runs AOF fsynced on every write
    redis_ctr = stack.container("redis")
    deadline = time.monotonic() + 10
    keys = ""
    while time.monotonic() < deadline and not keys:
        keys = stack.built.podman("exec", redis_ctr, "redis-cli", "--scan", "--pattern", "cascade:*").stdout
        time.sleep(0.5)
    assert keys.strip(), "no ledger keys in the stack's Redis"
    fsync = stack.built.podman("exec", redis_ctr, "redis-cli", "config", "get", "appendfsync").stdout.split()
    assert fsync == ["appendfsync", "always"]


def test_gateway_runs_unprivileged_and_its_healthcheck_passes(stack: Stack) -> None:
    gateway = stack.container("gateway")
    assert stack.built.podman("exec", gateway, "id", "-u").stdout.strip() == "10001"
    assert stack.built.podman("healthcheck", "run", gateway, check=False).returncode == 0
    inspect = json.loads(stack.built.podman("image", "inspect", stack.built.image).stdout)[0]
    assert inspect["Config"]["User"] == "cascade"
    healthcheck = inspect.get("Healthcheck") or inspect["Config"].get("Healthcheck") or {}  # podman's or Docker's
    assert healthcheck.get("Test") == ["CMD", "cascade-image", "health"]


def test_gateway_without_redis_stays_not_ready_and_never_restarts(stack: Stack) -> None:
    """Started on the stack's network with its engines but a Redis port nothing listens on."""
    port, name = free_port(), f"{stack.project}_noredis"
    redis_url = "redis://redis:6390/0"
    stack.built.podman(
        "run", "-d", "--name", name, "--network", f"{stack.project}_default", "--restart", "unless-stopped",
        "-p", f"127.0.0.1:{port}:8080", "-e", f"CASCADE_REDIS_URL={redis_url}", stack.built.image, "gateway",
        "--engine", "micro=http://engine-micro:8000", "--engine", "flagship=http://engine-flagship:8000")
    try:
        body = _wait_ready(f"http://127.0.0.1:{port}", 180, until="engines-not-redis")
        assert body["ready"] is False
        time.sleep(20)  # long enough for a crash loop to show as restarts
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=3).status_code == 503
        state = stack.built.podman("inspect", "--format", "{{.State.Status}} {{.RestartCount}}", name).stdout.split()
        assert state == ["running", "0"]
        logs = stack.built.podman("logs", name)
        text = logs.stdout + logs.stderr
        assert f"Redis is not reachable at {redis_url}" in text
        assert "/readyz stays 503 until Redis answers" in text
        assert "Traceback" not in text
    finally:
        stack.built.podman("rm", "-f", name, check=False)
