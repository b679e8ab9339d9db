"""Files of the Batch API expire and uploads are bounded: every file carries OpenAI's `expires_at` (the policy's
`batches.file_ttl_days`, or the upload's shorter `expires_after`), an expired one is a 404 and the workers' sweep
deletes it from Redis and disk, never while an open batch still reads it; an upload without a Content-Length is
refused (413) once its body passes the limit, not read to its end. In-process over fake engines, the real Redis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.batches.expiry import FileExpiry
from gateway.batches.files import FileStore
from gateway.batches.running import BatchParts
from policies.loader import PolicyError, parse_policy
from tests.conftest import GatewayFactory, Upstreams, policy_yaml
from tests.gateway.batches.test_batch_api import A, batch_policy, chat_line, create, finished, jsonl, on_loop, started
from tests.harness import Gateway
from tests.servers import until

pytestmark = pytest.mark.redis
DAY_S = 86_400


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "batch-files"


@pytest.fixture
def gateway(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str,
            folder: Path) -> Gateway:
    batches = f"batches: {{max_file_bytes: 4096, file_ttl_days: 2, folder: '{folder}'}}\n"
    return make_gateway(batch_policy(tmp_path, fake_upstreams, batches), ledger="redis", redis_prefix=prefix)


def _parts(gateway: Gateway) -> BatchParts:
    parts = gateway.runtime.batches
    assert parts is not None
    return parts


def _upload(gateway: Gateway, content: bytes, **form: str) -> httpx.Response:
    return gateway.client.post("/v1/files", headers=A, data={"purpose": "batch", **form},
                               files={"file": ("input.jsonl", content, "application/jsonl")})


async def _expire_now(parts: BatchParts, file_id: str) -> None:
    """The file as it is once its `expires_at` has passed."""
    file = await parts.store.file(file_id)
    assert file is not None
    await parts.store.put_file(replace(file, expires_at=int(time.time()) - 1))


def test_a_policy_refuses_a_file_ttl_under_a_day_naming_the_field() -> None:
    yaml = policy_yaml("http://micro.engine.test", "http://flagship.engine.test", "batches: {file_ttl_days: 0}\n")
    with pytest.raises(PolicyError, match=r"batches\.file_ttl_days: Input should be greater than or equal to 1"):
        parse_policy(yaml)
    assert parse_policy(policy_yaml("http://m.test", "http://f.test")).policy.batches.file_ttl_days == 30


def test_every_file_expires_after_the_policy_ttl_or_the_uploads_shorter_expires_after(gateway: Gateway) -> None:
    plain = _upload(gateway, jsonl([chat_line("x")])).json()
    assert plain["expires_at"] == plain["created_at"] + 2 * DAY_S
    hour = _upload(gateway, jsonl([chat_line("x")]), **{"expires_after[anchor]": "created_at",
                                                        "expires_after[seconds]": "3600"}).json()
    assert hour["expires_at"] == hour["created_at"] + 3600
    month = _upload(gateway, jsonl([chat_line("x")]), **{"expires_after[anchor]": "created_at",
                                                         "expires_after[seconds]": "2592000"}).json()
    assert month["expires_at"] == month["created_at"] + 2 * DAY_S  # the policy's ttl bounds the client's
    for seconds in ("3599", "2592001", "soon"):
        r = _upload(gateway, b"{}\n", **{"expires_after[anchor]": "created_at", "expires_after[seconds]": seconds})
        assert r.status_code == 400 and r.json()["error"]["param"] == "expires_after[seconds]", r.text
    r = _upload(gateway, b"{}\n", **{"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "expires_after[anchor]"
    done = finished(gateway, create(gateway, plain["id"]).json()["id"])
    output = gateway.client.get(f"/v1/files/{done['output_file_id']}", headers=A).json()
    assert output["purpose"] == "batch_output" and output["expires_at"] == output["created_at"] + 2 * DAY_S


def test_an_expired_file_is_404_and_the_sweep_deletes_it_from_redis_and_disk(gateway: Gateway, folder: Path) -> None:
    parts, disk = _parts(gateway), FileStore(folder)
    file_id = _upload(gateway, jsonl([chat_line("x")])).json()["id"]
    kept_id = _upload(gateway, jsonl([chat_line("y")])).json()["id"]
    assert disk.path(file_id).exists()
    on_loop(gateway, _expire_now(parts, file_id))
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        r = gateway.client.get(path, headers=A)
        assert r.status_code == 404 and r.json()["error"]["param"] == "file_id", r.text
    assert create(gateway, file_id).status_code == 404
    # the gateway's own worker sweeps every second
    until(lambda: not disk.path(file_id).exists() and on_loop(gateway, parts.store.file(file_id)) is None, 10,
          lambda: f"{file_id} still on disk or in Redis")
    assert disk.path(kept_id).exists() and gateway.client.get(f"/v1/files/{kept_id}", headers=A).status_code == 200


def test_the_input_of_an_open_batch_is_kept_until_the_batch_ends(gateway: Gateway, folder: Path) -> None:
    parts, disk = _parts(gateway), FileStore(folder)
    later = FileExpiry(parts.store, disk, clock=lambda: time.time() + 120, recheck_s=0)  # past any recheck
    on_loop(gateway, parts.worker.aclose())  # nothing answers: the batch stays in progress
    file_id = _upload(gateway, jsonl([chat_line("a"), chat_line("b")])).json()["id"]
    batch = create(gateway, file_id).json()
    assert batch["status"] == "in_progress"
    on_loop(gateway, _expire_now(parts, file_id))
    assert on_loop(gateway, later.sweep()) == 0
    assert disk.path(file_id).exists() and gateway.client.get(f"/v1/files/{file_id}", headers=A).status_code == 404
    # the batch's window passes: its finalizer reads the input again to name every line not answered
    stored = on_loop(gateway, parts.store.batch(batch["id"]))
    assert stored is not None
    on_loop(gateway, parts.store.set_status(replace(stored, expires_at=int(time.time()) - 1)))
    on_loop(gateway, started(parts.worker))
    done = finished(gateway, batch["id"])
    assert done["status"] == "expired", done
    errors = gateway.client.get(f"/v1/files/{done['error_file_id']}/content", headers=A).content.splitlines()
    assert [orjson.loads(e)["error"]["code"] for e in errors] == ["batch_expired", "batch_expired"]
    assert on_loop(gateway, later.sweep()) == 1  # the batch ended: its input goes
    until(lambda: not disk.path(file_id).exists(), 10, lambda: f"{file_id} still on disk")
    assert on_loop(gateway, parts.store.file(file_id)) is None
    assert gateway.client.get(f"/v1/files/{done['error_file_id']}", headers=A).status_code == 200


async def _post_chunked(gateway: Gateway, total: int, chunk: int) -> tuple[httpx.Response, int]:
    """A multipart upload of a `total`-byte file sent chunked (no Content-Length); the answer and how many bytes of
    the body the gateway read."""
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        head = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b\r\nContent-Disposition: '
                b'form-data; name="file"; filename="input.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n')
        line = jsonl([chat_line("x")])
        parts = [head, *[line * (chunk // len(line))] * (total // chunk), b"\r\n--b--\r\n"]
        for part in parts:
            sent += len(part)
            yield part

    headers = {**A, "content-type": "multipart/form-data; boundary=b"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gateway.app), base_url="http://gateway.test") as client:
        answer = await client.post("/v1/files", headers=headers, content=body())
    return answer, sent


def test_a_chunked_upload_is_refused_once_it_passes_the_limit_not_read_to_its_end(gateway: Gateway,
                                                                                   folder: Path) -> None:
    small, _ = on_loop(gateway, _post_chunked(gateway, 2048, 512))
    assert small.status_code == 200 and small.json()["bytes"] > 1500, small.text  # chunked within the limit: kept
    assert "content-length" not in small.request.headers
    big, read = on_loop(gateway, _post_chunked(gateway, 8 * 1024 * 1024, 16 * 1024))
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large", big.text
    limit = 4096 + 64 * 1024  # the policy's max_file_bytes and the form's slack
    assert read <= limit + 16 * 1024, f"read {read} bytes of an 8 MiB body past a {limit}-byte limit"
    assert sorted(p.name for p in folder.iterdir()) == [f"{small.json()['id']}.jsonl"]  # nothing of the big one


def test_a_body_that_is_not_a_multipart_form_is_a_400_envelope(gateway: Gateway) -> None:
    r = gateway.client.post("/v1/files", headers={**A, "content-type": "multipart/form-data; boundary=b"},
                            content=b"--b\r\nbroken")
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text
    r = gateway.client.post("/v1/files", headers=A, json={"purpose": "batch"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text
