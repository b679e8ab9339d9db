"""The Files and Batch APIs in-process (over fake engines, the real Redis): OpenAI's object shapes and statuses, bad
input answered as OpenAI answers it, and tenancy (another tenant's id is a 404)."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from gateway.api.auth import hash_key
from gateway.batches.worker import BatchWorker
from loadtest.scenarios.chaos_figures import ledger_records
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway, InProcessGateway
from tests.servers import until

pytestmark = pytest.mark.redis
A, B = {"authorization": "Bearer sk-team-a"}, {"authorization": "Bearer sk-team-b"}
TENANTS = f"""tenants:
  a: {{api_key_sha256: ['{hash_key("sk-team-a")}']}}
  b: {{api_key_sha256: ['{hash_key("sk-team-b")}']}}
"""


def chat_line(custom_id: str, model: str = "micro", content: str = "hi", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)


def batch_policy(tmp_path: Path, upstreams: Upstreams, batches: str = "") -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams[1], upstreams[3], TENANTS + batches))
    return path


@pytest.fixture
def gateway(make_gateway: GatewayFactory, tmp_path: Path, fake_upstreams: Upstreams, prefix: str) -> Gateway:
    return make_gateway(batch_policy(tmp_path, fake_upstreams, "batches: {max_file_bytes: 4096}\n"),
                        ledger="redis", redis_prefix=prefix)


def upload(gateway: Gateway, content: bytes, headers: dict[str, str] = A, purpose: str = "batch") -> Any:
    return gateway.client.post("/v1/files", headers=headers, data={"purpose": purpose},
                               files={"file": ("input.jsonl", content, "application/jsonl")})


def create(gateway: Gateway, file_id: str, headers: dict[str, str] = A, **extra: Any) -> Any:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}
    return gateway.client.post("/v1/batches", headers=headers, json=body)


def finished(gateway: Gateway, batch_id: str, headers: dict[str, str] = A, timeout_s: float = 60.0) -> Any:
    until(lambda: gateway.client.get(f"/v1/batches/{batch_id}", headers=headers).json()["status"]
          in ("completed", "failed", "expired", "cancelled"), timeout_s, lambda: f"batch {batch_id} not finished")
    return gateway.client.get(f"/v1/batches/{batch_id}", headers=headers).json()


T = TypeVar("T")


def on_loop(gateway: Gateway, work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on an in-process gateway's event loop (where its worker runs)."""
    assert isinstance(gateway, InProcessGateway)
    return gateway.run(work)


async def started(worker: BatchWorker) -> None:
    worker.start()


def test_a_batch_runs_to_completed_with_openai_shapes(gateway: Gateway) -> None:
    r = upload(gateway, jsonl([chat_line("one"), chat_line("two", model="flagship"),
                               chat_line("three", model="no-such-pool")]))
    assert r.status_code == 200, r.text
    file = r.json()
    assert file["object"] == "file" and file["purpose"] == "batch" and file["id"].startswith("file-")
    assert gateway.client.get(f"/v1/files/{file['id']}", headers=A).json() == file
    r = create(gateway, file["id"], metadata={"job": "nightly"})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["object"] == "batch" and batch["status"] == "in_progress" and batch["metadata"] == {"job": "nightly"}
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert batch["expires_at"] - batch["created_at"] == 86_400
    done = finished(gateway, batch["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert done["completed_at"] and done["finalizing_at"] and done["in_progress_at"]
    out = [orjson.loads(x) for x in gateway.client.get(f"/v1/files/{done['output_file_id']}/content",
                                                         headers=A).content.splitlines()]
    assert [o["custom_id"] for o in out] == ["one", "two"]
    assert {o["response"]["body"]["model"] for o in out} == {"micro-model", "flagship-model"}
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    usage = done["usage"]
    assert usage["input_tokens"] == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out) > 0
    assert usage["output_tokens"] == sum(o["response"]["body"]["usage"]["completion_tokens"] for o in out) > 0
    errors = [orjson.loads(x) for x in gateway.client.get(f"/v1/files/{done['error_file_id']}/content",
                                                            headers=A).content.splitlines()]
    assert [e["custom_id"] for e in errors] == ["three"]
    assert errors[0]["response"]["status_code"] == 404
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"
    listed = gateway.client.get("/v1/batches?limit=1", headers=A).json()
    assert listed["object"] == "list" and [b["id"] for b in listed["data"]] == [batch["id"]]
    assert listed["has_more"] is False


def test_body_errors_are_answered_per_line_and_the_batch_goes_on(gateway: Gateway) -> None:
    embed = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "x", "input": "hi"}}
    lines = [chat_line("ok"), chat_line("no-messages") | {"body": {"model": "micro"}},
             chat_line("streams", stream=True)]
    r = create(gateway, upload(gateway, jsonl(lines)).json()["id"])
    done = finished(gateway, r.json()["id"])
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    errors = gateway.client.get(f"/v1/files/{done['error_file_id']}/content", headers=A).content.splitlines()
    assert {orjson.loads(e)["response"]["status_code"] for e in errors} == {400}
    body = {"input_file_id": upload(gateway, jsonl([embed])).json()["id"], "endpoint": "/v1/embeddings",
            "completion_window": "24h"}
    done = finished(gateway, gateway.client.post("/v1/batches", headers=A, json=body).json()["id"])
    error = orjson.loads(gateway.client.get(f"/v1/files/{done['error_file_id']}/content", headers=A).content)
    assert error["response"]["status_code"] == 404 and error["response"]["body"]["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("content", "code", "line"), [
    (b"not json\n", "invalid_json_line", 1),
    (jsonl([chat_line("x"), chat_line("x")]), "duplicate_custom_id", 2),
    (jsonl([chat_line("x") | {"url": "/v1/images"}]), "invalid_url", 1),
    (jsonl([chat_line("x") | {"url": "/v1/completions"}]), "url_mismatch", 1),
    (jsonl([{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions"}]), "missing_required_parameter", 1),
    (b"\n\n", "empty_file", None),
])
def test_a_file_that_does_not_validate_fails_the_batch(gateway: Gateway, content: bytes, code: str,
                                                         line: int | None) -> None:
    batch = create(gateway, upload(gateway, content).json()["id"]).json()
    assert batch["status"] == "failed" and batch["failed_at"]
    assert batch["errors"]["object"] == "list"
    assert (batch["errors"]["data"][0]["code"], batch["errors"]["data"][0]["line"]) == (code, line)
    assert batch["request_counts"]["total"] == 0


def test_uploads_and_creates_refused_as_openai_refuses_them(gateway: Gateway) -> None:
    big = upload(gateway, b"x" * 5000)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert upload(gateway, b"\xff\xfe").json()["error"]["param"] == "file"
    assert upload(gateway, b"{}\n", purpose="fine-tune").status_code == 400
    file_id = upload(gateway, jsonl([chat_line("x")])).json()["id"]
    assert create(gateway, file_id, completion_window="1h").json()["error"]["param"] == "completion_window"
    assert create(gateway, file_id, endpoint="/v1/images").json()["error"]["param"] == "endpoint"
    assert create(gateway, "file-nope").status_code == 404
    assert gateway.client.post("/v1/batches", headers=A, content=b"{").status_code == 400
    assert gateway.client.get("/v1/batches", headers={}).status_code == 401


def test_another_tenants_files_and_batches_are_404(gateway: Gateway) -> None:
    file_id = upload(gateway, jsonl([chat_line("x")])).json()["id"]
    batch_id = create(gateway, file_id).json()["id"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch_id}"):
        r = gateway.client.get(path, headers=B)
        assert r.status_code == 404 and "x" not in r.json()["error"]["message"].replace(file_id, "").replace(
            batch_id, "").split()[-1:], r.text
    assert gateway.client.post(f"/v1/batches/{batch_id}/cancel", headers=B).status_code == 404
    assert gateway.client.delete(f"/v1/files/{file_id}", headers=B).status_code == 404
    assert create(gateway, file_id, headers=B).status_code == 404
    assert gateway.client.get("/v1/batches", headers=B).json()["data"] == []
    assert gateway.client.get(f"/v1/files/{file_id}", headers=A).status_code == 200


def test_cancel_keeps_what_is_done_and_a_finished_batch_cannot_be_cancelled(gateway: Gateway) -> None:
    done = finished(gateway, create(gateway, upload(gateway, jsonl([chat_line("x")])).json()["id"]).json()["id"])
    r = gateway.client.post(f"/v1/batches/{done['id']}/cancel", headers=A)
    assert r.status_code == 400 and "completed" in r.json()["error"]["message"]
    runtime = gateway.runtime
    assert runtime.batches is not None
    on_loop(gateway, runtime.batches.worker.aclose())  # nothing takes lines: the batch stays in progress
    batch = create(gateway, upload(gateway, jsonl([chat_line("y")])).json()["id"]).json()
    cancelling = gateway.client.post(f"/v1/batches/{batch['id']}/cancel", headers=A).json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"]
    on_loop(gateway, started(runtime.batches.worker))
    cancelled = finished(gateway, batch["id"])
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"]
    assert cancelled["request_counts"] == {"total": 1, "completed": 0, "failed": 0}


def test_deleting_a_file_removes_it(gateway: Gateway) -> None:
    file_id = upload(gateway, jsonl([chat_line("x")])).json()["id"]
    r = gateway.client.delete(f"/v1/files/{file_id}", headers=A)
    assert r.json() == {"id": file_id, "object": "file", "deleted": True}
    assert gateway.client.get(f"/v1/files/{file_id}", headers=A).status_code == 404


def test_a_tenant_has_at_most_its_open_batches_and_lines(make_gateway: GatewayFactory, tmp_path: Path,
                                                         fake_upstreams: Upstreams, prefix: str) -> None:
    policy = batch_policy(tmp_path, fake_upstreams, "batches: {max_open_batches: 2, max_open_lines: 3}\n")
    gateway = make_gateway(policy, ledger="redis", redis_prefix=prefix)
    assert gateway.runtime.batches is not None
    on_loop(gateway, gateway.runtime.batches.worker.aclose())  # nothing answers: the batches stay open
    two = upload(gateway, jsonl([chat_line("a"), chat_line("b")])).json()["id"]
    assert create(gateway, two).json()["status"] == "in_progress"
    r = create(gateway, two)  # 2 + 2 lines open: over 3
    assert r.status_code == 429 and r.json()["error"]["code"] == "batch_limit_exceeded" and "lines" in r.text
    assert create(gateway, upload(gateway, jsonl([chat_line("c")])).json()["id"]).status_code == 200
    r = create(gateway, upload(gateway, jsonl([chat_line("d")])).json()["id"])  # a third open batch
    assert r.status_code == 429 and "batches open" in r.json()["error"]["message"]
    assert create(gateway, two, headers=B).status_code == 404  # the limits are per tenant, the file A's
    assert len(gateway.client.get("/v1/batches", headers=A).json()["data"]) == 2


def test_a_batch_runs_under_the_key_that_created_it(make_gateway: GatewayFactory, tmp_path: Path,
                                                    fake_upstreams: Upstreams, prefix: str) -> None:
    admin = {"authorization": "Bearer test-admin"}
    gateway = make_gateway(batch_policy(tmp_path, fake_upstreams), ledger="redis", redis_prefix=prefix,
                           admin_key="test-admin")
    issued = gateway.client.post("/admin/keys", headers=admin, json={"tenant": "a", "name": "nightly"}).json()
    key = {"authorization": f"Bearer {issued['key']}"}
    done = finished(gateway, create(gateway, upload(gateway, jsonl([chat_line("x")]), key).json()["id"], key)
                    .json()["id"], key)
    assert done["request_counts"]["completed"] == 1
    until(lambda: any(r.get("batch_id") == done["id"] for r in ledger_records(SHARED_URL, prefix)), 10)
    [record] = [r for r in ledger_records(SHARED_URL, prefix) if r.get("batch_id") == done["id"]]
    assert record["key_id"] == issued["id"]  # its limits and budget applied: the record says whose it was
    runtime = gateway.runtime
    assert runtime.batches is not None
    on_loop(gateway, runtime.batches.worker.aclose())
    waiting = create(gateway, upload(gateway, jsonl([chat_line("y")]), key).json()["id"], key).json()
    assert gateway.client.delete(f"/admin/keys/{issued['id']}", headers=admin).status_code == 200
    on_loop(gateway, started(runtime.batches.worker))
    refused = finished(gateway, waiting["id"])  # the tenant's other keys still see it
    assert refused["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    error = orjson.loads(gateway.client.get(f"/v1/files/{refused['error_file_id']}/content", headers=A).content)
    assert error["response"]["status_code"] == 401 and "revoked" in error["response"]["body"]["error"]["message"]
