"""Ledger tests: validation and codec (no I/O), the outbox (disk only), and RedisLedger against real
Redis servers: the shared one on 127.0.0.1:6379 (unique key prefix per test, cleaned up) and, for the
outage and restart cases, a redis-server each test starts on a free port and stops by its PID."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.costs.report import Counters
from gateway.ledger.layouts import stream_keys
from gateway.ledger.outbox import Outbox, OutboxBusy
from gateway.ledger.store import (
    CostRecord,
    InvalidCostRecord,
    LedgerKeys,
    RedisLedger,
    record_from_fields,
    record_to_fields,
    rollup_slot,
    validate_record,
)
from tests.conftest import SHARED_URL
from tests.servers import PrivateRedis, free_port

DAY0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def make_record(i: int, **changes: object) -> CostRecord:
    """A valid record; tenants, pools, models and hours vary with `i`; money is integer micro-USD."""
    rec = CostRecord(
        request_id=f"req-{i}",
        tenant=f"tenant-{i % 3}",
        pool="micro" if i % 4 else "flagship",
        model="tiny-llama" if i % 4 else "tiny-moe",
        prompt_tokens=100 + i,
        completion_tokens=20 + i % 7,
        cost_micro_usd=37 * i + 5,
        flagship_cost_micro_usd=90 * i + 11,
        rule="default",
        policy_version="v1",
        started_at=DAY0 + 3600.0 * (i % 30) + 0.25,
        ttft_ms=12.5,
        latency_ms=80.0,
        scored_by="overflow" if i % 5 == 0 else "primary",  # every rollup test counts `overflow_scored` too
        output_check=("", "pass", "fail:json", "fail:empty,repetition")[i % 4],  # and the output-check counters
        in_domain=None if i % 6 == 0 else (i % 11) / 10,  # and the in-domain tenths (1.0 counts in the last)
    )
    return dataclasses.replace(rec, **changes)  # type: ignore[arg-type]


def sums(recs: Iterable[CostRecord]) -> Counters:
    """What `recs` add to the rollups, summed: the cost report's total over them."""
    return sum((Counters.of(rec) for rec in recs), Counters())


async def spill(outbox: Path, recs: Iterable[CostRecord]) -> None:
    """Put `recs` in the outbox folder `outbox`, as a ledger whose Redis calls timed out on them would."""
    box = Outbox(outbox)
    await box.open()
    for rec in recs:
        await box.append(record_to_fields(rec))
    await box.aclose()


async def replay_half_recorded(outbox: Path, prefix: str, recs: list[CostRecord]) -> None:
    """One ledger records the first half of `recs`, then all of them land in its outbox (as if every call had timed
    out, the first half's after Redis applied them); a second ledger replays the outbox as it starts, the first half
    as duplicates."""
    half = len(recs) // 2
    first = RedisLedger(SHARED_URL, outbox, prefix)
    await first.start()
    for rec in recs[:half]:
        await first.record(rec)
    await first.aclose()
    await spill(outbox, recs)
    second = RedisLedger(SHARED_URL, outbox, prefix)
    await second.start()  # drains before returning
    assert (second.counts.replayed, second.counts.duplicates) == (len(recs) - half, half)
    await second.aclose()


def expected_rollups(keys: LedgerKeys, recs: list[CostRecord]) -> dict[str, Counters]:
    out: dict[str, Counters] = {}
    for rec in recs:
        day, member, hour_member = rollup_slot(rec)
        one = Counters.of(rec)
        for key in (keys.day(day, member), keys.hour(day, hour_member)):
            out[key] = out.get(key, Counters()) + one
    return out


async def assert_exact(url: str, keys: LedgerKeys, recs: list[CostRecord]) -> None:
    """Every day/hour rollup equals the sum of `recs`, and the stream holds each request exactly once."""
    client = aioredis.Redis.from_url(url)
    try:
        want = expected_rollups(keys, recs)
        got = {k: Counters.from_hash(await client.hgetall(k)) for k in want}
        assert got == want
        streams = await stream_keys(client, keys)
        entries = [e for s in streams for e in await client.xrange(s) or []]
        ids = [(fields or {})[b"request_id"] for _, fields in entries]
        assert sorted(ids) == sorted(r.request_id.encode() for r in recs)
    finally:
        await client.aclose()


@pytest.fixture
async def ledger(tmp_path: Path, prefix: str) -> AsyncIterator[RedisLedger]:
    led = RedisLedger(SHARED_URL, tmp_path / "outbox", prefix, drain_interval_s=0.05)
    await led.start()
    yield led
    await led.aclose()


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# --- validation and codec -------------------------------------------------------------------------


BAD_CHANGES: list[dict[str, object]] = [
    {"request_id": ""},
    {"request_id": "has space"},
    {"tenant": "a:b"},
    {"pool": ""},
    {"model": "m{x}"},
    {"tenant": 7},
    {"prompt_tokens": -1},
    {"completion_tokens": 1.5},
    {"cost_micro_usd": True},
    {"cost_micro_usd": 0.1},
    {"flagship_cost_micro_usd": 10**13},
    {"started_at": math.nan},
    {"started_at": 5.0},
    {"started_at": time.time() + 10 * 86_400},
    {"ttft_ms": -1.0},
    {"latency_ms": math.inf},
    {"status": "done"},
    {"output_check": "fail"},
    {"output_check": "fail:JSON"},
    {"usage_source": "guess"},
    {"rule": "line\nbreak"},
    {"scored_by": "a:b"},
    {"in_domain": 1.01},
    {"in_domain": -0.1},
    {"in_domain": math.nan},
]


@pytest.mark.parametrize("changes", BAD_CHANGES, ids=[next(iter(c)) for c in BAD_CHANGES])
def test_validate_rejects_malformed(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidCostRecord):
        validate_record(make_record(1, **changes))


def test_validate_accepts_model_paths_and_no_ttft() -> None:
    validate_record(make_record(1, model="Qwen/Qwen2.5-7B-Instruct", ttft_ms=None, tenant="acme_corp"))


def test_a_limit_left_to_the_engine_is_a_valid_record_and_round_trips() -> None:
    rec = make_record(1, completion_limit_tokens=0, completion_limit_by="engine")
    validate_record(rec)
    assert record_from_fields(record_to_fields(rec)) == rec


def test_fields_round_trip() -> None:
    rec = make_record(5, ttft_ms=None, started_at=DAY0 + 0.123456789)
    assert record_from_fields(record_to_fields(rec)) == rec


def test_a_record_written_before_scored_by_existed_still_decodes() -> None:
    fields = record_to_fields(make_record(5))
    del fields["scored_by"]
    assert record_from_fields(fields) == make_record(5, scored_by="")
    assert Counters.of(make_record(5)).overflow_scored == 1 and Counters.of(make_record(6)).overflow_scored == 0
    del fields["output_check"]
    assert record_from_fields(fields) == make_record(5, scored_by="", output_check="")
    checked = [Counters.of(make_record(i)) for i in range(4)]
    assert [(c.output_checked, c.output_check_failed) for c in checked] == [(0, 0), (1, 0), (1, 1), (1, 1)]


def test_the_in_domain_figure_round_trips_and_counts_once_a_request_in_tenths() -> None:
    assert record_from_fields(record_to_fields(make_record(7, in_domain=0.123456789))).in_domain == 0.123456789
    fields = record_to_fields(make_record(7))
    del fields["in_domain"]  # a record written before the field existed
    assert record_from_fields(fields).in_domain is None
    tenths = [Counters.of(make_record(1, in_domain=v)) for v in (0.0, 0.29, 0.3, 1.0)]
    assert [c.in_domain_scored for c in tenths] == [1, 1, 1, 1]
    assert [[c.in_domain_below(b) for b in (0.1, 0.3, 1.0)] for c in tenths] == [[1, 1, 1], [0, 1, 1], [0, 0, 1],
                                                                                 [0, 0, 1]]
    for status in ("escalated", "discarded"):  # another record of the request follows: it counts there
        assert Counters.of(make_record(1, in_domain=0.2, status=status)).in_domain_scored == 0
    assert Counters.of(make_record(1, in_domain=None)).in_domain_scored == 0


@pytest.mark.parametrize(("name", "value"), [("cost_micro_usd", "1_000"), ("prompt_tokens", " 5"), ("started_at", "x")])
def test_fields_reject_malformed(name: str, value: str) -> None:
    fields = record_to_fields(make_record(1))
    fields[name] = value
    with pytest.raises(InvalidCostRecord):
        record_from_fields(fields)
    del fields[name]
    with pytest.raises(InvalidCostRecord):
        record_from_fields(fields)


async def test_every_count_is_told_as_it_rises(tmp_path: Path, prefix: str) -> None:
    events: list[str] = []
    up = RedisLedger(SHARED_URL, tmp_path / "up", prefix)
    up.counts.on_event = events.append
    await up.start()
    await up.record(make_record(1))
    await up.record(make_record(1))  # the same request id again: counted once
    await up.aclose()
    down = RedisLedger(f"redis://127.0.0.1:{free_port()}/0", tmp_path / "down", op_timeout_s=0.2)
    down.counts.on_event = events.append
    await down.start()
    await down.record(make_record(2))  # Redis unreachable: to the outbox
    await down.aclose()
    assert events == ["recorded", "duplicates", "spilled"]


async def test_record_rejects_malformed_before_any_io(tmp_path: Path) -> None:
    led = RedisLedger(f"redis://127.0.0.1:{free_port()}/0", tmp_path / "o")
    with pytest.raises(InvalidCostRecord):
        await led.record(make_record(1, cost_micro_usd=-5))
    assert not (tmp_path / "o").exists()
    await led.aclose()


# --- outbox ---------------------------------------------------------------------------------------


async def test_outbox_append_claim_release(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    await box.open()
    await asyncio.gather(*(box.append({"n": str(i)}) for i in range(50)))
    assert box.has_lines
    batch = await box.claim(dict)
    assert batch is not None and sorted(int(x["n"]) for x in batch) == list(range(50))
    await box.append({"n": "late"})  # lands in a fresh outbox, not in the claimed batch
    assert await box.claim(dict) == batch  # not released: the same batch again
    await box.release()
    assert await box.claim(dict) == [{"n": "late"}]
    await box.release()
    assert await box.claim(dict) is None and not box.has_lines
    await box.aclose()


async def test_outbox_survives_crash_mid_drain_and_cuts_torn_tail(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    await box.open()
    await box.append({"n": "1"})
    assert await box.claim(dict) == [{"n": "1"}]  # claimed, then the process "dies" before release
    await box.append({"n": "2"})
    await box.aclose()
    with open(tmp_path / "ledger-outbox.jsonl", "ab") as fh:
        fh.write(b'{"n": "torn')  # a write that crashed before its fsync
    again = Outbox(tmp_path)
    await again.open()
    assert await again.claim(dict) == [{"n": "1"}]
    await again.release()
    assert await again.claim(dict) == [{"n": "2"}]
    await again.aclose()


async def test_outbox_rejects_malformed_lines_and_is_exclusive(tmp_path: Path) -> None:
    (tmp_path / "ledger-outbox.jsonl").write_bytes(b'{"n": "1"}\nnot json\n[1]\n{"n": 2}\n')
    box = Outbox(tmp_path)
    await box.open()
    with pytest.raises(OutboxBusy):
        await Outbox(tmp_path).open()
    assert await box.claim(dict) == [{"n": "1"}]
    assert box.rejected == 3
    assert (tmp_path / "ledger-outbox.rejected.jsonl").read_bytes().count(b"\n") == 3
    await box.aclose()


# --- RedisLedger on the shared Redis --------------------------------------------------------------


@pytest.mark.redis
async def test_concurrent_records_sum_exactly(ledger: RedisLedger) -> None:
    recs = [make_record(i) for i in range(300)]
    await asyncio.gather(*(ledger.record(r) for r in recs))
    assert ledger.counts.recorded == 300 and ledger.counts.spilled == 0
    await assert_exact(SHARED_URL, ledger.keys, recs)


@pytest.mark.redis
async def test_a_record_sends_and_writes_only_the_counters_it_moves(ledger: RedisLedger) -> None:
    plain = make_record(1, scored_by="primary", output_check="", in_domain=None)
    scored = make_record(2, scored_by="primary", output_check="fail:json", in_domain=0.35)
    for rec, moved in ((plain, []), (scored, ["output_checked", "output_check_failed", "in_domain_scored",
                                               "in_domain_t3"])):
        _, args = ledger._script_call(rec)
        extra = int(args[10])
        assert extra == len(moved) and args[11:11 + 2 * extra:2] == moved
        await ledger.record(rec)
        day, member, _ = rollup_slot(rec)
        client = aioredis.Redis.from_url(SHARED_URL)
        try:
            fields = await client.hgetall(ledger.keys.day(day, member))
        finally:
            await client.aclose()
        base = {"requests", "prompt_tokens", "completion_tokens", "cost_micro_usd", "flagship_cost_micro_usd"}
        assert {f.decode() for f in fields if isinstance(f, bytes)} == base | set(moved)  # no field made by a 0
    await assert_exact(SHARED_URL, ledger.keys, [plain, scored])


@pytest.mark.redis
async def test_same_request_id_counts_once(ledger: RedisLedger) -> None:
    first = make_record(1)
    await asyncio.gather(*(ledger.record(first) for _ in range(20)))
    await ledger.record(dataclasses.replace(first, cost_micro_usd=999_999))  # first write wins
    assert ledger.counts.recorded == 1 and ledger.counts.duplicates == 20
    await assert_exact(SHARED_URL, ledger.keys, [first])


@pytest.mark.redis
async def test_records_after_redis_forgot_the_script(tmp_path: Path, private_redis: PrivateRedis) -> None:
    """The batch runs the record script by its SHA; a Redis that lost it (restart, SCRIPT FLUSH) gets it
    loaded again and the batch still counts once, not spilled and not doubled."""
    led = RedisLedger(private_redis.url, tmp_path / "outbox", "t:", drain_interval_s=0.05)
    await led.start()
    await asyncio.gather(*(led.record(make_record(i)) for i in range(5)))
    client = aioredis.Redis.from_url(private_redis.url)
    await client.script_flush()
    await client.aclose()
    recs = [make_record(i) for i in range(5, 40)]
    await asyncio.gather(*(led.record(r) for r in recs))
    assert led.counts.recorded == 40 and led.counts.spilled == 0
    await led.aclose()
    await assert_exact(private_redis.url, LedgerKeys("t:"), [make_record(i) for i in range(40)])


@pytest.mark.redis
async def test_outbox_replay_does_not_double_count(tmp_path: Path, prefix: str) -> None:
    recs = [make_record(i) for i in range(10)]
    await replay_half_recorded(tmp_path / "outbox", prefix, recs)
    assert not list((tmp_path / "outbox").glob("*.jsonl"))
    await assert_exact(SHARED_URL, LedgerKeys(prefix), recs)


@pytest.mark.redis
async def test_cancelled_caller_still_records(ledger: RedisLedger) -> None:
    tasks = [asyncio.create_task(ledger.record(make_record(i))) for i in range(50)]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await wait_for(lambda: ledger.counts.recorded == 50)
    await assert_exact(SHARED_URL, ledger.keys, [make_record(i) for i in range(50)])


# --- outages and restarts on a private redis-server -----------------------------------------------


@pytest.mark.redis
async def test_outage_goes_to_outbox_then_drains(tmp_path: Path, stopped_redis: PrivateRedis) -> None:
    led = RedisLedger(stopped_redis.url, tmp_path / "outbox", "t:", drain_interval_s=0.05)
    await led.start()  # nothing listens yet: start must not fail
    recs = [make_record(i) for i in range(200)]
    began = time.monotonic()
    await asyncio.gather(*(led.record(r) for r in recs))
    assert time.monotonic() - began < 3.0, "an outage must not stall requests"
    assert led.counts.spilled == 200
    stopped_redis.start()
    await wait_for(lambda: led.counts.replayed == 200)
    assert await led.drain()  # waits for the background drain to finish; Redis is marked up
    await led.record(recs[0])  # back on the direct path, still idempotent
    assert led.counts.duplicates == 1
    await led.aclose()
    await assert_exact(stopped_redis.url, LedgerKeys("t:"), recs)
    assert not list((tmp_path / "outbox").glob("*.jsonl"))


@pytest.mark.redis
async def test_redis_crash_during_load_loses_and_doubles_nothing(tmp_path: Path, private_redis: PrivateRedis) -> None:
    led = RedisLedger(private_redis.url, tmp_path / "outbox", "t:", drain_interval_s=0.05)
    await led.start()
    recs = [make_record(i) for i in range(600)]

    async def writer(part: list[CostRecord]) -> None:
        for rec in part:
            await led.record(rec)
            await asyncio.sleep(0.01)

    load = asyncio.gather(*(writer(recs[k::20]) for k in range(20)))
    await asyncio.sleep(0.1)
    private_redis.kill()
    await asyncio.sleep(0.3)
    private_redis.start()  # AOF (fsync always) brings back every acknowledged write
    await load
    c = led.counts
    await wait_for(lambda: c.replayed + c.duplicates == c.spilled, timeout=15)  # outbox fully replayed
    assert c.spilled > 0, "the crash should have sent some records to the outbox"
    assert c.lost == 0  # in-flight scripts Redis applied before dying come back as duplicates
    await led.aclose()
    await assert_exact(private_redis.url, LedgerKeys("t:"), recs)


@pytest.mark.redis
async def test_restart_drains_leftover_outbox_first(tmp_path: Path, stopped_redis: PrivateRedis) -> None:
    down = RedisLedger(stopped_redis.url, tmp_path / "outbox", "t:")
    await down.start()
    recs = [make_record(i) for i in range(50)]
    await asyncio.gather(*(down.record(r) for r in recs))
    await down.aclose()  # the "gateway" stops with a non-empty outbox
    assert (tmp_path / "outbox" / "ledger-outbox.jsonl").stat().st_size > 0
    stopped_redis.start()
    restarted = RedisLedger(stopped_redis.url, tmp_path / "outbox", "t:", drain_interval_s=3600)
    await restarted.start()
    assert restarted.counts.replayed == 50
    await restarted.aclose()
    await assert_exact(stopped_redis.url, LedgerKeys("t:"), recs)


def test_outbox_files_are_private(tmp_path: Path) -> None:
    async def run() -> None:
        box = Outbox(tmp_path)
        await box.open()
        await box.append({"n": "1"})
        await box.aclose()

    asyncio.run(run())
    assert os.stat(tmp_path / "ledger-outbox.jsonl").st_mode & 0o077 == 0


def test_the_rollup_slot_is_the_records_utc_hour_at_and_across_hour_boundaries() -> None:
    from datetime import UTC, datetime

    from gateway.ledger.keys import rollup_slot

    for at in (1.8e9 - 0.001, 1.8e9, 1.8e9 + 3599.999, 1.8e9 + 3600, 1.8e9 + 86_399.5):  # 1.8e9 is a whole hour
        rec = CostRecord("r", "t", "micro", "m", 1, 1, 1, 2, "threshold", "v", at, 5.0, 9.0)
        when = datetime.fromtimestamp(at, UTC)
        assert rollup_slot(rec) == (f"{when:%Y-%m-%d}", "t:micro:m", f"{when:%H}:t:micro:m")


class _CountedBatches(RedisLedger):
    """A Redis ledger that counts its record-script round trips."""

    batches = 0

    async def _run_scripts(self, recs: list[CostRecord]) -> list[object]:
        self.batches += 1
        return await super()._run_scripts(recs)


@pytest.mark.redis
async def test_records_a_millisecond_apart_share_one_round_trip_within_the_linger(tmp_path: Path, prefix: str) -> None:
    led = _CountedBatches(SHARED_URL, tmp_path / "outbox", prefix, linger_s=0.2)
    await led.start()
    try:
        recs, pending = [make_record(i) for i in range(20)], []
        for rec in recs:  # ~20 ms in all, well within the linger (a loaded machine may stretch it: 2 allowed)
            pending.append(asyncio.create_task(led.record(rec)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*pending)
    finally:
        await led.aclose()
    assert led.counts.recorded == 20 and led.batches <= 2, led.batches
    await assert_exact(SHARED_URL, led.keys, recs)
