"""Shared fixtures: fake engine upstreams (served on ports, or in-process), gateways in front of them (`make_gateway`:
in-process by default, served by uvicorn where the claim is end to end), Redis prefixes and real engines."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import ExitStack
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from gateway.costs.report import CostReport, Reconciliation, load_report, verify
from gateway.ledger.keys import LedgerKeys
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from tests.engines import SharedEngines
from tests.harness import FakeEngines, Gateway, InProcessGateway, ServedGateway
from tests.servers import PrivateRedis, serve

if TYPE_CHECKING:
    from tests.gateway.serving.test_tracing import Receiver

# The tests assert the tiny demo models' behaviour: a real micro model chosen for the demo must not leak in.
os.environ.pop("CASCADE_DEMO_MICRO", None)
# Scores stay the primary model's (tests assert them), and no gateway under test builds the overflow model's
# table in the background; tests/router_models/serving/test_overflow.py attaches one on purpose.
os.environ["CASCADE_ROUTER_OVERFLOW"] = "none"
# Whatever a test writes to Redis without a prefix of its own (a gateway built with the default settings, a
# `cascade serve` it starts) goes under this one, never under the `cascade:` a real gateway or report reads.
TEST_PREFIX = "cascade-test:"
os.environ["CASCADE_REDIS_PREFIX"] = TEST_PREFIX

SHARED_URL = "redis://127.0.0.1:6379/0"
SHIPPED_THRESHOLD = "  threshold: {flagship_share: 0.3, initial: 0.28}\n"


def cascade_home(path: Path) -> Path:
    """`path` made a $CASCADE_HOME (its own artifact and memory store) whose embedder caches are the session's (the
    fast artifact's table, the ONNX export, the vectors of prompts embedded): a cache changes how long a run takes,
    never what it computes. Call before $CASCADE_HOME names `path`. Returns `path`."""
    from router_models.embedders.onnx_minilm import default_cache_dir

    link = path / "router-cache"
    if not link.exists():
        cache = default_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        path.mkdir(parents=True, exist_ok=True)
        link.symlink_to(cache, target_is_directory=True)
    return path


def with_fixed_threshold(text: str, threshold: str = "0.5") -> str:
    """A shipped policy's text with its flagship-share threshold replaced by a fixed cut, for tests of rules and
    decisions that need a known threshold. Fails if the shipped line changed, so the edit cannot silently miss."""
    assert text.count(SHIPPED_THRESHOLD) == 1, "the shipped routing threshold line changed; update SHIPPED_THRESHOLD"
    return text.replace(SHIPPED_THRESHOLD, f"  threshold: {threshold}\n")


T = TypeVar("T")


async def _over_recent_days(read: Callable[[aioredis.Redis, LedgerKeys, date, date], Awaitable[T]],
                            prefix: str, url: str) -> T:
    client = aioredis.Redis.from_url(url)
    try:
        today = datetime.now(UTC).date()
        return await read(client, LedgerKeys(prefix), today - timedelta(days=1), today)
    finally:
        await client.aclose()


async def verify_recent(prefix: str, url: str = SHARED_URL) -> Reconciliation:
    """`cascade costs verify` of the ledger under `prefix` over yesterday and today (UTC)."""
    return await _over_recent_days(verify, prefix, url)


async def report_recent(prefix: str, url: str = SHARED_URL) -> CostReport:
    """The cost report of the ledger under `prefix` over yesterday and today (UTC)."""
    return await _over_recent_days(load_report, prefix, url)


def ledger_record(prefix: str, request_id: str, timeout_s: float = 10.0, url: str = SHARED_URL) -> dict[str, str]:
    """The Redis ledger's record of `request_id` under `prefix`, once written (the accountant writes after the
    answer); fails the test after `timeout_s`."""
    from loadtest.scenarios.chaos_figures import ledger_records

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for fields in ledger_records(url, prefix):
            if fields.get("request_id") == request_id:
                return dict(fields)
        time.sleep(0.05)
    raise AssertionError(f"no ledger record for {request_id}")


def delete_prefix(prefix: str, url: str = SHARED_URL) -> None:
    """Delete every key under `prefix` (tests share one Redis; each uses its own prefix)."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    """A unique key prefix on the shared Redis; its keys are deleted afterwards."""
    value = f"test:{uuid.uuid4().hex}:"
    yield value
    delete_prefix(value)


def policy_yaml(micro_url: str, flagship_url: str, extra: str = "") -> str:
    return f"""
version: 1
pools:
  micro:
    type: remote
    urls: ["{micro_url}"]
    model: micro-model
    price: {{input_per_mtok: "0.20", output_per_mtok: "0.20"}}
  flagship:
    type: remote
    urls: ["{flagship_url}"]
    model: flagship-model
    price: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
routing:
  micro_pool: micro
  flagship_pool: flagship
  threshold: 0.5
{extra}
"""


Upstreams = tuple[FakeUpstream, str, FakeUpstream, str]
"""The micro and flagship fake engines and their base URLs."""


@pytest.fixture
def upstreams() -> Iterator[Upstreams]:
    """The two fake engines on uvicorn servers (ports), for gateways in other processes or served ones."""
    micro, flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    with serve(micro) as micro_url, serve(flagship) as flagship_url:
        yield micro, micro_url, flagship, flagship_url


def _policy_over(tmp_path: Path, upstreams: Upstreams) -> Path:
    """`tmp_path/policy.yaml`: `policy_yaml` over the micro and flagship engines of `upstreams`."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams[1], upstreams[3]))
    return path


@pytest.fixture
def policy_file(tmp_path: Path, upstreams: Upstreams) -> Path:
    return _policy_over(tmp_path, upstreams)


@pytest.fixture
def fake_engines() -> FakeEngines:
    """The test's in-process fake engines (none yet), which the gateways of `make_gateway` reach."""
    return FakeEngines()


@pytest.fixture
def fake_upstreams(fake_engines: FakeEngines) -> Upstreams:
    """`upstreams` without ports: the two fake engines in-process (`fake_engines`), for in-process gateways."""
    micro, flagship = FakeUpstream("micro-model"), FakeUpstream("flagship-model")
    return micro, fake_engines.add("micro", micro), flagship, fake_engines.add("flagship", flagship)


@pytest.fixture
def fake_policy_file(tmp_path: Path, fake_upstreams: Upstreams) -> Path:
    """`policy_file` over `fake_upstreams`."""
    return _policy_over(tmp_path, fake_upstreams)


GATEWAY_DEFAULTS: dict[str, Any] = {"scorer": "length", "start_engines": False, "ledger": "memory"}
"""The settings a test gateway starts from: the length scorer, no engines of its own, the in-memory ledger."""


class GatewayFactory(Protocol):
    def __call__(self, policy: Path, *, served: bool = False, **settings: Any) -> Gateway:
        ...


@pytest.fixture
def make_gateway(tmp_path: Path, fake_engines: FakeEngines) -> Iterator[GatewayFactory]:
    """Builds gateways for the test, closed at its end: `make_gateway(policy, **settings)` is `GATEWAY_DEFAULTS`
    updated with `settings` (each gateway's home `tmp_path/gateway<n>` unless given), in-process over `fake_engines`
    and any engine on a port; `served=True` puts it on a uvicorn server instead (a port, for end-to-end claims)."""
    made: list[Gateway] = []
    with ExitStack() as stack:

        def make(policy: Path, *, served: bool = False, **settings: Any) -> Gateway:
            home = tmp_path / f"gateway{len(made)}"
            config = Settings(**{"policy_path": policy, "home": home, **GATEWAY_DEFAULTS, **settings})
            gateway = ServedGateway(config) if served else InProcessGateway(config, fake_engines)
            stack.enter_context(gateway)
            made.append(gateway)
            return gateway

        yield make


@pytest.fixture
def stopped_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private redis-server not started yet (the test starts it, e.g. after an outage), its data in
    `tmp_path`; killed afterwards. Skips where no `redis-server` binary is installed."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    server = PrivateRedis(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def private_redis(stopped_redis: PrivateRedis) -> PrivateRedis:
    """`stopped_redis`, started."""
    stopped_redis.start()
    return stopped_redis


ENGINE_TRACE_ID = "5cf92f3577b34da6a3ce929d0e0e4737"
"""The trace id whose spans `engine_spans` keeps (the one test of the engines' spans sends it)."""


@pytest.fixture(scope="session")
def engine_spans() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver (`tests.gateway.serving.test_tracing.Receiver`) that the shared engines export their
    request spans to, for the whole session; it keeps the spans of `ENGINE_TRACE_ID`. `url` is its base URL."""
    from tests.gateway.serving.test_tracing import Receiver

    receiver = Receiver(trace_ids={ENGINE_TRACE_ID})
    with serve(receiver) as receiver.url:
        yield receiver


@pytest.fixture(scope="session")
def shared_engines(tmp_path_factory: pytest.TempPathFactory,
                   engine_spans: Receiver) -> Iterator[SharedEngines]:
    """Real vLLM engines shared by the session's tests, one per engine configuration (`tests/engines.py`), each
    exporting its request spans to `engine_spans` (as a traced gateway's engines do)."""
    engines = SharedEngines(tmp_path_factory.mktemp("shared-engines"), traces_to=engine_spans.url + "/v1/traces")
    try:
        yield engines
    finally:
        engines.close()


def _engines_of(item: pytest.Item) -> str | None:
    """"shared": the session's shared engines; "own": engines of its own; None: no real engine."""
    if item.get_closest_marker("engines") is None:
        return None
    return "shared" if "shared_engines" in getattr(item, "fixturenames", ()) else "own"


def _timing(item: pytest.Item) -> bool:
    return item.get_closest_marker("timing") is not None


def _order(item: pytest.Item) -> int:
    """Engine tests first (shared, then own), then the `timing` tests, then the `slow` tests without engines, then
    the rest: a test that takes half a minute, handed out last, ran alone at the end while the other workers had
    finished (the fast tier's workers ended 146-153 s in and one 165 s, its last test the learning loop's 29 s)."""
    engines = _engines_of(item)
    if engines is not None:
        return {"shared": 0, "own": 1}[engines]
    if _timing(item):
        return 2
    return 3 if item.get_closest_marker("slow") is not None else 4


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests with real engines run first, those on the shared engines first among them (file order kept within
    each kind), so that each shared engine starts once and is stopped before tests start engines of their own;
    then the `timing` tests, then the `slow` tests without engines, then the rest (`_order`).
    Under pytest-xdist (`-n`, `--dist loadgroup`) they all run on one worker, the first unit handed out (the
    longest; two tests' engines never compete for the first cores, where vLLM binds every CPU worker), but for tests
    that name an xdist group of their own: a heavy one that starts no engine, and the chaos run and the int8 demo,
    which share no engine with the others and bind their engines' workers to the last core; the other tests spread
    over the workers. The groups are handed out largest first, then the single units in this order, so those two
    are the first single units, started in the first minutes beside the shared engines' tests; the CPU-pinning
    tests at the engines group's end wait for their engines (`tests/backends/engines/test_cpu_pinning.py`).
    The `timing` tests join the engines' worker after its engine tests: started early among the `slow` ones, they
    ran beside the engine starts, whose CPU starved them (the knee test of `tests/loadtest/bench/test_saturation.py`
    missed its first run, 80 s lost, in fresh clones on three workers and on four)."""
    items.sort(key=_order)
    for item in items:
        if (_engines_of(item) or _timing(item)) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("engines"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that starts engines of its own, or times processes of this host, gets the cores and the memory the
    shared engines held."""
    if _engines_of(item) == "own" or _timing(item):
        for engines in SharedEngines.instances:
            engines.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used shared engines carries their log tails: a dead or sick engine shows there."""
    report = yield
    if report.failed and "shared_engines" in getattr(item, "fixturenames", ()):
        engines = item.funcargs.get("shared_engines") if hasattr(item, "funcargs") else None
        if isinstance(engines, SharedEngines):
            for name, tail in engines.log_tails().items():
                report.sections.append((f"shared engine {name} (log tail)", tail))
    return report
