"""The ledger on a real Redis Cluster: three masters on free loopback ports, started by the test (one cluster
for the module) and stopped by their PIDs. Records go through `RedisLedger` (a `redis+cluster://` URL:
redis-py's cluster client), a replay from the outbox counts once, and the cost report, `verify`, the budget
guard and the feedback owner check read them back through the cluster client. A record script whose keys
span slots would be refused (CROSSSLOT) and spilled to the outbox: `spilled == 0` is what proves one slot
per record. The rate limiter's and the shared ladder's two-key scripts run on the same cluster, and a
cluster that does not answer is an outage (outbox, fail open), not an error."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
import redis
from redis.asyncio.cluster import RedisCluster

from gateway.control.adaptation.ladder_sync import LadderSync
from gateway.costs.report import load_report, verify
from gateway.errors import RateLimited
from gateway.learning.store import LearningStore
from gateway.ledger.store import LedgerKeys, RedisLedger
from gateway.redis_client import is_cluster_url, redis_from_url
from gateway.tenancy.budgets import BudgetGuard
from gateway.tenancy.limits import RateLimiter
from policies.tenants import Budget, RateLimits
from tests.gateway.ledger.test_ledger import DAY0, make_record, spill, sums
from tests.servers import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
PREFIX = "cl:"
pytestmark = [
    pytest.mark.skipif(not Path(REDIS_SERVER).exists(), reason="redis-server is not installed"),
    pytest.mark.xdist_group("redis-cluster"),  # under pytest-xdist the module's cluster (`cluster`) starts once
]


def _wait(check: object, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        time.sleep(0.05)


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000, which Redis opens beside it) is free too."""
    while True:
        port = free_port()
        if port + 10_000 <= 65_535:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 10_000))
                except OSError:
                    continue
            return port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A three-master Redis Cluster (no replicas, nothing on disk); yields its `redis+cluster://` URL. Shared by
    this module's tests, which use prefixes of their own."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    ports = [_cluster_port() for _ in range(3)]
    procs = [subprocess.Popen([REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(p), "--dir", str(tmp_path),
                               "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    nodes = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=1.0) for p in ports]
    try:
        for node in nodes:
            _wait(node.ping, "redis-server answering")
        subprocess.run([REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=30)
        for node in nodes:
            _wait(lambda n=node: n.cluster("info")["cluster_state"] == "ok", "cluster_state:ok")
        yield f"redis+cluster://127.0.0.1:{ports[0]}"
    finally:
        for node in nodes:
            node.close()
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)


@pytest.mark.redis
async def test_the_ledger_records_and_reads_back_on_a_redis_cluster(cluster: str, tmp_path: Path) -> None:
    recs = [make_record(i, tenant=f"tenant-{i % 5}") for i in range(60)]  # 5 tenants over 2 UTC days
    # 5 s per operation, not the gateway's 0.5: what is tested is the cluster's routing of records, replays and
    # duplicates, and a loaded machine once took longer than 0.5 s to answer the replay (spilled instead)
    led = RedisLedger(cluster, tmp_path / "outbox", PREFIX, op_timeout_s=5)
    await led.start()
    for start in range(0, 50, 10):  # several batches: the registries are written once per tenant and day
        for rec in recs[start:start + 10]:
            await led.record(rec)
    await led.aclose()
    assert (led.counts.recorded, led.counts.spilled, led.counts.lost) == (50, 0, 0)

    await spill(tmp_path / "outbox", recs[45:])  # a replay: 5 already counted (as after a timeout), 10 new
    client = redis_from_url(cluster)
    await client.script_flush()  # on every master: the replay has to load the record script again
    await client.aclose()
    replayer = RedisLedger(cluster, tmp_path / "outbox", PREFIX, op_timeout_s=5)
    await replayer.start()  # drains before returning
    await replayer.record(recs[0])  # a retry on the direct path
    await replayer.aclose()
    assert (replayer.counts.replayed, replayer.counts.duplicates, replayer.counts.spilled) == (10, 6, 0)

    assert is_cluster_url(cluster)
    client = redis_from_url(cluster)
    assert isinstance(client, RedisCluster)
    keys = LedgerKeys(PREFIX)
    try:
        await client.initialize()  # the slot map, read now (else on first use)
        masters = {client.get_node_from_key(keys.stream(f"tenant-{t}")).name
                   for t in range(5)}
        assert len(masters) >= 2, "the tenants' keys must spread over the masters, or the test proves little"
        report = await load_report(client, keys, date(2026, 1, 1), date(2026, 1, 2))
        assert report.total().counters == sums(recs)
        assert len({(c.day, c.tenant, c.pool, c.model) for c in report.cells}) == len(report.cells)
        checked = await verify(client, keys, date(2026, 1, 1), date(2026, 1, 2))
        assert checked.ok and checked.records == 60, checked

        day2 = DAY0 + 86_400 + 3600.0  # 2026-01-02T01:00Z
        mine = [r for r in recs if r.tenant == "tenant-2"]
        on_day2 = sum(r.cost_micro_usd for r in mine if r.started_at >= DAY0 + 86_400)
        guard = BudgetGuard(client, keys, cache_s=0, clock=lambda: day2)
        verdict = await guard.check("tenant-2", Budget.model_validate({"daily_usd": "1000", "monthly_usd": "1000"}))
        assert not verdict.fail_open
        assert (verdict.day_spent_micro_usd, verdict.month_spent_micro_usd) == (
            on_day2, sum(r.cost_micro_usd for r in mine))

        store = LearningStore(client, PREFIX)
        assert await store.owned_by(mine[0].request_id, "tenant-2")
        assert not await store.owned_by(mine[0].request_id, "tenant-3")
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_the_rate_limiter_and_the_shared_ladder_run_on_a_redis_cluster(cluster: str) -> None:
    """Their scripts touch two keys each, kept in one slot by a hash tag (else CROSSSLOT, an error)."""
    client = redis_from_url(cluster)
    try:
        # a generous timeout: the first call learns the cluster's slots and loads the script, which took over the
        # default 0.5 s on a loaded machine (then unchecked, admitted as False); the claim here is CROSSSLOT-free
        limiter = RateLimiter(client, "rl:", op_timeout_s=10)
        limits = RateLimits(requests_per_minute=2)
        assert [await limiter.admit("acme", limits, 10) for _ in range(2)] == [True, True]  # checked, admitted
        with pytest.raises(RateLimited):
            await limiter.admit("acme", limits, 10)
        ladder, other = LadderSync(client, "ls:"), LadderSync(client, "ls:")
        assert (await ladder.hold_lease(), await other.hold_lease()) == (2, 0)
        assert await ladder.write_state({"raise_threshold": 1_767_225_600.0})
        assert not await other.write_state({})  # only the lease holder writes
        assert await other.read_state() == {"raise_threshold": 1_767_225_600.0}
    finally:
        await client.aclose()


async def test_an_unreachable_cluster_is_an_outage_not_an_error(tmp_path: Path) -> None:
    """No node answers: redis-py's cluster client raises `RedisClusterException` (not a `RedisError`); the
    ledger still spills to its outbox and starts, the budget guard and the rate limiter fail open."""
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    await spill(tmp_path / "outbox", [make_record(1)])
    led = RedisLedger(url, tmp_path / "outbox", PREFIX, op_timeout_s=0.2)
    await led.start()  # the replay fails: an outage, logged, retried in the background
    await led.record(make_record(2))
    await led.aclose()
    assert (led.counts.spilled, led.counts.recorded) == (1, 0)
    client = redis_from_url(url, socket_connect_timeout=0.2)
    try:
        verdict = await BudgetGuard(client, LedgerKeys(PREFIX)).check("t", Budget.model_validate({"daily_usd": "1"}))
        assert verdict.fail_open and verdict.state == "ok"
        assert await RateLimiter(client, "rl:").admit("t", RateLimits(requests_per_minute=1), 1) is False
    finally:
        await client.aclose()
