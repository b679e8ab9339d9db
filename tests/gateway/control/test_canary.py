"""Canary versions of a pool: added, reweighted, promoted and rolled back under traffic with no request lost; a
canary that fails its requests rolled back by its guard (its failures served by the pool's own version); a canary
that does not start refused with its engine's error; the split sticky per conversation.

Engines are fake upstreams run as real processes by the real supervisor (only its command is swapped), as in
`test_pool_change.py`; the same sequence on real vLLM engines is `tests/e2e/test_pool_change_real.py`."""

from __future__ import annotations

import asyncio
import functools
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.engines.supervisor import EngineSupervisor
from gateway.api.app import create_app
from gateway.control.fleet.canaries import CanaryGuard, CanaryRoute, _Window, sticky_key, takes_canary
from gateway.settings import Settings
from gateway.telemetry.percentile import nearest_rank, nearest_rank_sorted
from policies.canary_edit import CanaryEditError, promote_canary, remove_canary
from policies.loader import PolicyError, load_policy
from policies.pools import CanaryGuard as GuardSpec
from tests.servers import alive, fake_engine, free_port, serve, until

ADMIN = "canary-admin-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}

# answers /health and /metrics, fails every chat request with a 500: a canary whose new version is broken
_BROKEN = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        self.send_response(code); self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self): self._send(200, b'{}' if self.path != '/metrics' else b'')
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length') or 0))
        self._send(500, b'{"error": {"message": "the new version is broken", "type": "server_error"}}')
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def _engine(spec: Any, port: int, models_dir: Path) -> list[str]:
    if spec.model == "broken-weights":  # cannot load its model: says why and exits
        return [sys.executable, "-c", "import sys; print('OSError: no weights in broken-weights'); sys.exit(3)"]
    if spec.served_name == "broken-canary":
        return [sys.executable, "-c", _BROKEN, str(port)]
    return fake_engine(spec, port, models_dir)


def _canary(served_name: str, weight: float, port: int, guard: str = "", model: str = "fake-weights") -> str:
    return f"""    canary:
      weight: {weight}
      engine: {{model: {model}, served_name: {served_name}, base_port: {port}, startup_timeout_s: 30}}
{guard}"""


@pytest.fixture
def gateway(policy_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Settings]:
    supervisor = functools.partial(EngineSupervisor, command=_engine, check_interval_s=0.2, stop_grace_s=5)
    monkeypatch.setattr("gateway.control.fleet.pool_set.EngineSupervisor", supervisor)
    pool = f"""
  spare:
    type: local
    price: {{input_per_mtok: "0.10", output_per_mtok: "0.10"}}
    engine: {{model: fake-weights, served_name: spare-model, base_port: {free_port()}, startup_timeout_s: 30}}
"""
    policy_file.write_text(policy_file.read_text().replace("pools:\n", "pools:" + pool, 1))
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=True, ledger="memory",
                        home=tmp_path, admin_key=ADMIN, policy_watch_interval_s=0)
    return policy_file, settings


def _ready(url: str) -> bool:
    return httpx.get(url + "/readyz").json()["pools"].get("spare") is True


def _add_canary(policy_file: Path, block: str) -> None:
    text = policy_file.read_text()
    at = text.index("startup_timeout_s: 30}\n") + len("startup_timeout_s: 30}\n")  # after spare's engine line
    policy_file.write_text(text[:at] + block + text[at:])


async def _reload(client: httpx.AsyncClient, url: str) -> httpx.Response:
    return await client.post(url + "/admin/policy/reload", headers=AUTH, timeout=90)


async def test_a_canary_added_weighted_promoted_and_rolled_back_loses_no_request(
    gateway: tuple[Path, Settings],
) -> None:
    policy_file, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _ready(url))
        (first,) = pool_set.supervisors["spare"].replicas
        first_version = pool_set.pools["spare"].version
        async with httpx.AsyncClient(timeout=30) as client:
            done = asyncio.Event()
            steps: dict[str, Any] = {}
            outcomes: list[tuple[str, str, str]] = []  # (outcome, the version that answered, user) per request

            async def traffic(worker: int) -> None:
                stream, i = worker % 2 == 0, 0
                while not done.is_set():
                    i += 1
                    user = f"u{worker}-{i % 7}"
                    body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
                            "user": user, "metadata": {"fake_tokens": "6", "fake_delay_ms": "10"}}
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and (not stream or r.text.rstrip().endswith("data: [DONE]"))
                    outcomes.append(("ok" if ok else f"{r.status_code} {r.text[:200]}",
                                     r.headers.get("x-cascade-pool-version", ""), user))

            async def answered(version: str, n: int = 8) -> None:
                """Until `n` more requests were answered by `version` (traffic on it after each step)."""
                start, deadline = len(outcomes), time.monotonic() + 30
                while sum(v == version for _, v, _ in outcomes[start:]) < n:
                    assert time.monotonic() < deadline, f"{version} answered no traffic: {outcomes[-3:]}"
                    await asyncio.sleep(0.02)

            async def change() -> None:
                try:
                    await answered(first_version)
                    _add_canary(policy_file, _canary("spare-canary", 0.3, free_port()))
                    steps["add"] = await _reload(client, url)
                    steps["canary"] = pool_set.canaries["spare"]
                    (replica,) = pool_set.supervisors_of_canary("spare")
                    await answered(steps["canary"].version)
                    policy_file.write_text(policy_file.read_text().replace("weight: 0.3", "weight: 0.8"))
                    steps["weight"] = await _reload(client, url)
                    assert pool_set.supervisors_of_canary("spare") == (replica,)  # reweighted, not restarted
                    steps["canary_pid"] = replica.pid
                    await answered(steps["canary"].version)
                    policy_file.write_text(promote_canary(policy_file.read_text(), "spare"))
                    steps["promote"] = await _reload(client, url)
                    await answered(steps["canary"].version)  # the promoted canary is the pool's version
                    _add_canary(policy_file, _canary("spare-canary2", 0.5, free_port()))
                    steps["add2"] = await _reload(client, url)
                    steps["canary2"] = pool_set.canaries["spare"]
                    (steps["canary2_replica"],) = pool_set.supervisors_of_canary("spare")
                    await answered(steps["canary2"].version)
                    policy_file.write_text(remove_canary(policy_file.read_text(), "spare"))
                    steps["rollback"] = await _reload(client, url)
                    await answered(steps["canary"].version)
                finally:
                    done.set()

            await asyncio.gather(*(traffic(w) for w in range(4)), change())
        for step in ("add", "weight", "promote", "add2", "rollback"):
            assert steps[step].status_code == 200, (step, steps[step].text)
        assert [o for o, _, _ in outcomes if o != "ok"] == []
        served = {version for _, version, _ in outcomes}
        canary, canary2 = steps["canary"].version, steps["canary2"].version
        assert {first_version, canary, canary2} <= served  # every version answered its share
        sup = pool_set.supervisors["spare"]
        assert sup.replicas[0].pid == steps["canary_pid"]  # the promoted canary is the pool: nothing restarted
        assert pool_set.pools["spare"].version == canary and "spare" not in pool_set.canaries
        assert pool_set.specs["spare"].engine.served_name == "spare-canary"
        assert first.pid is not None and steps["canary2_replica"].pid is not None
        await asyncio.to_thread(until, lambda: not alive(first.pid) and not alive(steps["canary2_replica"].pid))
        versions = httpx.get(url + "/readyz").json()["versions"]["spare"]
        assert versions == {"version": canary}


async def test_a_failing_canary_is_rolled_back_by_its_guard_and_its_requests_are_served(
    gateway: tuple[Path, Settings],
) -> None:
    policy_file, settings = gateway
    app = create_app(settings)
    guard = "      guard: {max_error_rate: 0.2, min_requests: 4}\n"
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _ready(url))
        own = pool_set.pools["spare"].version
        async with httpx.AsyncClient(timeout=30) as client:
            _add_canary(policy_file, _canary("broken-canary", 0.5, free_port(), guard))
            assert (await _reload(client, url)).status_code == 200
            (broken,) = pool_set.supervisors_of_canary("spare")
            replies = []
            for i in range(40):
                body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}], "user": f"user-{i}",
                        "stream": i % 2 == 0}
                replies.append(await client.post(url + "/v1/chat/completions", json=body))
            assert [r.status_code for r in replies] == [200] * 40  # the canary's failures went to the pool
            assert {r.headers["x-cascade-pool-version"] for r in replies} == {own}
            fell_back = "pinned:spare, canary:spare, canary-fallback:spare"  # the split, then the pool's own version
            routes = {r.headers["x-cascade-route"] for r in replies}
            assert fell_back in routes and routes <= {fell_back, "pinned:spare"}, routes
            assert "spare" not in pool_set.canaries
            canary = httpx.get(url + "/readyz").json()["versions"]["spare"]["canary"]
            assert "error rate" in canary["rolled_back"] and "max_error_rate" in canary["rolled_back"]
            assert broken.pid is not None
            await asyncio.to_thread(until, lambda: not alive(broken.pid))
            assert (await _reload(client, url)).status_code == 200  # the same canary: it stays rolled back
            assert "spare" not in pool_set.canaries and pool_set.supervisors_of_canary("spare") == ()


async def test_a_canary_that_does_not_start_is_refused_and_the_pool_keeps_serving(
    gateway: tuple[Path, Settings],
) -> None:
    policy_file, settings = gateway
    app = create_app(settings)
    with serve(app) as url:
        pool_set = app.state.runtime.pool_set
        await asyncio.to_thread(until, lambda: _ready(url))
        before = httpx.get(url + "/readyz").json()["policy_version"]
        async with httpx.AsyncClient(timeout=30) as client:
            _add_canary(policy_file, _canary("spare-canary", 0.5, free_port(), model="broken-weights"))
            refused = await _reload(client, url)
            assert refused.status_code == 422
            problems = " ".join(refused.json()["error"]["problems"])
            assert "its canary did not start" in problems and "no weights in broken-weights" in problems
            assert httpx.get(url + "/readyz").json()["policy_version"] == before
            assert "spare" not in pool_set.canaries
            body = {"model": "spare", "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post(url + "/v1/chat/completions", json=body)).status_code == 200


def test_the_split_is_sticky_and_follows_the_weight() -> None:
    keys = [f"u:user-{i}" for i in range(20_000)]
    at_10 = {k for k in keys if takes_canary("micro", k, 0.10)}
    at_30 = {k for k in keys if takes_canary("micro", k, 0.30)}
    assert 0.09 < len(at_10) / len(keys) < 0.11 and 0.28 < len(at_30) / len(keys) < 0.32
    assert at_10 <= at_30  # raising the weight moves conversations to the canary, never back
    assert at_10 == {k for k in keys if takes_canary("micro", k, 0.10)}  # sticky
    assert at_10 != {k for k in keys if takes_canary("flagship", k, 0.10)}  # each pool splits on its own
    assert sticky_key({"metadata": {"conversation_id": "c1"}, "user": "u1"}) == "c:c1"
    assert sticky_key({"user": "u1"}) == "u:u1" and sticky_key({"metadata": {"x": 1}}) is None


def test_the_guard_judges_only_a_full_window_of_its_canary() -> None:
    now = [0.0]
    tripped: list[tuple[str, str, str]] = []
    spec = GuardSpec(max_p95_ttft_ms=100, min_requests=10, window_s=60)
    routes = {"micro": CanaryRoute(None, "v2", "m2", 0.1, spec)}  # type: ignore[arg-type]
    guard = CanaryGuard(routes, lambda *a: tripped.append(a), clock=lambda: now[0])
    for _ in range(30):
        guard.observe("micro", "v1", 5.0, True)  # the pool's own version: not the guard's business
    for _ in range(9):
        guard.observe("micro", "v2", 0.5, False)
    assert tripped == []  # slow, but fewer than min_requests
    now[0] = 120.0  # the slow answers leave the window
    for _ in range(10):
        guard.observe("micro", "v2", 0.05, False)
    assert tripped == []
    guard.observe("micro", "v2", 0.5, False)
    guard.observe("micro", "v2", 0.5, False)
    assert len(tripped) == 1 and "p95 time to first token 500 ms" in tripped[0][2]


@pytest.mark.parametrize(("block", "expected"), [
    ("    canary: {weight: 1.5, engine: {model: m, served_name: c, base_port: 8300}}\n", "weight"),
    ("    canary: {weight: 0.1, engine: {model: fake-weights, served_name: spare-model, base_port: PORT, "
     "startup_timeout_s: 30}}\n", "must change something"),
    ("    canary: {weight: 0.1, engine: {model: m, served_name: c, base_port: PORT}}\n", "overlap"),
    ("    canary: {weight: 0.1, engine: {model: m, served_name: c, base_port: 8300}, guard: {min_requests: 3}}\n",
     "needs max_error_rate"),
])
def test_a_bad_canary_is_refused_with_its_line(gateway: tuple[Path, Settings], block: str, expected: str) -> None:
    policy_file, _ = gateway
    text = policy_file.read_text()
    port = text.split("base_port: ", 1)[1].split(",", 1)[0]
    _add_canary(policy_file, block.replace("PORT", port))
    with pytest.raises(PolicyError) as err:
        load_policy(policy_file)
    assert expected in str(err.value) and f"{policy_file}:" in str(err.value)


def test_promote_and_remove_touch_only_the_pool_lines() -> None:
    text = """pools:
  # the small pool
  micro:
    type: local
    price: {input_per_mtok: "0.1", output_per_mtok: "0.1"}
    engine:
      model: demo:micro   # the old one
      served_name: micro
    canary:
      weight: 0.05  # 5%
      engine:
        model: demo:micro-v2
        served_name: micro-v2
        base_port: 8110

  flagship:
    type: remote
    price: {input_per_mtok: "1", output_per_mtok: "1"}
routing: {micro_pool: micro}
"""
    promoted = promote_canary(text, "micro")
    assert "    engine:\n      model: demo:micro-v2\n      served_name: micro-v2\n      base_port: 8110\n" in promoted
    assert "canary" not in promoted and "weight" not in promoted and "# the small pool" in promoted
    assert promoted.endswith("\n  flagship:\n    type: remote\n    price: {input_per_mtok: \"1\", "
                             "output_per_mtok: \"1\"}\nrouting: {micro_pool: micro}\n")
    removed = remove_canary(text, "micro")
    assert "canary" not in removed and "model: demo:micro   # the old one" in removed and "\n\n  flagship:" in removed
    with pytest.raises(CanaryEditError):
        remove_canary(removed, "micro")


def test_the_guards_window_counts_and_sorts_as_requests_come_and_go() -> None:
    """The window's failure count and sorted TTFTs, kept as requests enter and leave, equal a recount of the same
    requests at every step (a seeded mix of failures, answers and TTFT-less answers, a clock with ties)."""
    rng = random.Random(7)
    window, seen = _Window(), []
    now = 0.0
    for _ in range(2_000):
        now += rng.choice([0.0, 0.01, 0.3])
        error = rng.random() < 0.2
        ttft = None if rng.random() < 0.1 else round(rng.uniform(0.01, 0.5), 2)  # ties on purpose
        window.add(now, ttft, error)
        seen.append((now, ttft, error))
        window.drop_before(now - 5.0)
        kept = [(t, f, e) for t, f, e in seen if t >= now - 5.0]
        assert len(window) == len(kept) and window.errors == sum(e for _, _, e in kept)
        assert window.ttfts == sorted(f for _, f, e in kept if f is not None and not e)
    assert nearest_rank_sorted(window.ttfts, 0.95) == nearest_rank(window.ttfts, 0.95)
