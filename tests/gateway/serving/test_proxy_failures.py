"""What one failed attempt does to the replica it went to: a refused connection marks it down at once (its probe
brings it back); a timeout marks it down only while another replica serves, and otherwise counts against its breaker,
so a stalled or saturated engine, which is still serving its batch, is not taken out of a one-replica pool on one
slow answer. A stub client raises the errors; the
retries and the breaker through the real gateway are `test_retry_http.py`'s."""

from __future__ import annotations

import pytest

from backends.clients.breaker import BreakerState
from backends.clients.pool import Pool
from backends.clients.shared import EngineTimeout, EngineUnavailable
from gateway.errors import NoReplicaAvailable
from gateway.serving.sending.proxy import Proxy

URL = "http://127.0.0.1:9"


class _Failing:
    """An engine client whose every call raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def post_json(self, *_: object) -> bytes:
        self.calls += 1
        raise self.error

    async def get_text(self, *_: object, **__: object) -> str:
        raise self.error


@pytest.mark.parametrize(("error", "down"), [
    (EngineUnavailable(f"{URL}: ConnectionRefusedError"), True),
    (EngineTimeout("127.0.0.1:9: no connection in 3 s"), False),
    (EngineTimeout(f"{URL}: no answer in 30 s"), False),
])
async def test_a_refusal_marks_the_replica_down_and_a_timeout_does_not(error: Exception, down: bool) -> None:
    client = _Failing(error)
    pool = Pool("micro", [], client)  # type: ignore[arg-type]
    pool.set_urls([URL], ready=True)
    (replica,) = pool.replicas
    with pytest.raises(NoReplicaAvailable):  # one replica, tried once: this request fails either way
        await Proxy(client).complete(pool, b"{}")  # type: ignore[arg-type]
    assert client.calls == 1 and replica.healthy is not down and pool.ready is not down
    assert replica.failures == int(down)
    if not down:  # timeouts that go on open the breaker (5 in a row by default): then it is skipped
        for _ in range(4):
            with pytest.raises(NoReplicaAvailable):
                await Proxy(client).complete(pool, b"{}")  # type: ignore[arg-type]
        assert replica.breaker.state is BreakerState.OPEN and not replica.available


async def test_a_timeout_marks_a_replica_down_while_another_serves() -> None:
    client = _Failing(EngineTimeout(f"{URL}: no answer in 30 s"))
    pool = Pool("micro", [], client)  # type: ignore[arg-type]
    pool.set_urls([URL, "http://127.0.0.1:10"], ready=True)
    with pytest.raises(NoReplicaAvailable):  # both tried (the stub fails every call), the first marked down
        await Proxy(client).complete(pool, b"{}")  # type: ignore[arg-type]
    first, second = pool.replicas
    assert client.calls == 2 and [first.healthy, second.healthy].count(False) == 1  # not the last one
