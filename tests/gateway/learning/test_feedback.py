"""`POST /v1/feedback` against a gateway in-process (`tests.harness`), the real Redis and fake engines: stored for the
caller's own requests only, read back by the training reader, refused with the OpenAI envelope otherwise."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
import redis

from gateway.api.auth import hash_key
from gateway.errors import BadRequest
from gateway.learning.feedback import parse_feedback
from router_models.serving.scorer import conversation_shape, conversation_text
from router_models.training.ledger_labels import LabelKeys, read_ledger_labels
from tests.conftest import SHARED_URL, GatewayFactory, Upstreams, policy_yaml
from tests.harness import Gateway

TENANTS = f"""tenants:
  acme: {{api_key_sha256: ["{hash_key("key-acme")}"]}}
  globex: {{api_key_sha256: ["{hash_key("key-globex")}"]}}
learning:
  keep_prompts: {{sample: 1, ttl_days: 2}}
"""
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a colour"}]


@pytest.fixture
def gateway(make_gateway: GatewayFactory, fake_upstreams: Upstreams, tmp_path: Path, prefix: str) -> Gateway:
    _, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url, TENANTS))
    return make_gateway(path, ledger="redis", redis_prefix=prefix, policy_watch_interval_s=0)


def _chat(gateway: Gateway, key: str, model: str = "auto") -> dict[str, str]:
    client = gateway.openai(key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES,  # type: ignore[arg-type]
                                                           max_tokens=4)
    assert raw.parse().choices[0].message.content
    return dict(raw.headers)


def _feedback(gateway: Gateway, key: str, body: object) -> httpx.Response:
    return gateway.client.post("/v1/feedback", json=body, headers={"authorization": f"Bearer {key}"}, timeout=10)


def _hash(key: str) -> dict[str, str]:
    client = redis.Redis.from_url(SHARED_URL, decode_responses=True)
    try:
        return {str(k): str(v) for k, v in client.hgetall(key).items()}
    finally:
        client.close()


pytestmark = pytest.mark.redis


def test_feedback_is_stored_and_read_back_for_training(gateway: Gateway, prefix: str) -> None:
    headers = _chat(gateway, "key-acme")
    request_id, score = headers["x-request-id"], float(headers["x-cascade-score"])
    assert headers["x-cascade-pool"] == "micro"
    r = _feedback(gateway, "key-acme", {"request_id": request_id, "thumbs": "down", "comment": "wrong colour"})
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "feedback", "request_id": request_id, "score": 0.0, "stored": True}
    keys = LabelKeys(prefix)
    stored = _hash(keys.feedback(request_id))
    assert (stored["score"], stored["thumbs"], stored["comment"], stored["tenant"]) == ("0.0", "down",
                                                                                         "wrong colour", "acme")
    (row,) = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert row == {"id": request_id, "prompt": conversation_text(MESSAGES), "needs_flagship": 1.0,
                   "pools": {"micro": 0.0}, "source": "feedback", "tenant": "acme", "pool": "micro",
                   "score": pytest.approx(score, abs=1e-4),
                   "shape": asdict(conversation_shape(MESSAGES))}  # the shape the gateway scored, for a retrain
    # the last feedback wins, whole: the earlier comment does not linger
    assert _feedback(gateway, "key-acme", {"request_id": request_id, "score": 0.75}).status_code == 200
    assert _hash(keys.feedback(request_id))["comment"] == ""
    (row,) = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert (row["needs_flagship"], row["pools"]) == (pytest.approx(0.25), {"micro": 0.75})
    ttl = redis.Redis.from_url(SHARED_URL).ttl(keys.prompt(request_id))
    assert 0 < ttl <= 2 * 86_400
    metrics = gateway.client.get("/metrics").text
    assert 'cascade_feedback_total{outcome="thumbs"} 1.0' in metrics
    assert 'cascade_feedback_total{outcome="score"} 1.0' in metrics
    assert 'cascade_learning_events_total{event="prompt_kept"} 1.0' in metrics


def test_feedback_on_a_flagship_answer_is_the_flagship_pools_label(make_gateway: GatewayFactory,
                                                                    fake_upstreams: Upstreams, tmp_path: Path,
                                                                    prefix: str) -> None:
    _, micro_url, _, flagship_url = fake_upstreams
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(micro_url, flagship_url, TENANTS).replace("threshold: 0.5", "threshold: 0.0"))
    gateway = make_gateway(path, ledger="redis", redis_prefix=prefix, policy_watch_interval_s=0)
    headers = _chat(gateway, "key-acme")  # scored and kept, and routed to the flagship
    assert headers["x-cascade-pool"] == "flagship"
    r = _feedback(gateway, "key-acme", {"request_id": headers["x-request-id"], "thumbs": "down"})
    assert r.status_code == 200, r.text
    (row,) = read_ledger_labels(SHARED_URL, key_prefix=prefix)
    assert row["pools"] == {"flagship": 0.0} and row["pool"] == "flagship" and row["source"] == "feedback"
    assert "needs_flagship" not in row  # says nothing of the micro pool: no gap label, no router training


def test_unknown_or_another_tenants_request_is_404_and_nothing_is_stored(gateway: Gateway, prefix: str) -> None:
    request_id = _chat(gateway, "key-acme")["x-request-id"]
    keys = LabelKeys(prefix)
    for key, rid in (("key-globex", request_id), ("key-acme", "req_" + "0" * 24)):
        r = _feedback(gateway, key, {"request_id": rid, "score": 0.0})
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "request_not_found",
                                                                  "request_id")
        assert _hash(keys.feedback(rid)) == {}
    assert read_ledger_labels(SHARED_URL, key_prefix=prefix) == []  # kept, but no label
    assert 'cascade_feedback_total{outcome="not_found"} 2.0' in gateway.client.get("/metrics").text


def test_a_request_not_kept_is_found_through_its_ledger_record(gateway: Gateway, prefix: str) -> None:
    headers = _chat(gateway, "key-globex", model="flagship")  # pinned: not scored, so not kept
    request_id = headers["x-request-id"]
    assert _hash(LabelKeys(prefix).prompt(request_id)) == {}
    deadline = time.monotonic() + 5
    r = _feedback(gateway, "key-globex", {"request_id": request_id, "thumbs": "up"})
    while r.status_code == 404 and time.monotonic() < deadline:  # the record lands just after the answer
        r = _feedback(gateway, "key-globex", {"request_id": request_id, "thumbs": "up"})
    assert r.status_code == 200, r.text
    assert _hash(LabelKeys(prefix).feedback(request_id))["score"] == "1.0"
    assert _feedback(gateway, "key-acme", {"request_id": request_id, "thumbs": "up"}).status_code == 404
    assert read_ledger_labels(SHARED_URL, key_prefix=prefix) == []  # stored, but its prompt was not kept: no row


@pytest.mark.parametrize("body, param", [
    ({"request_id": "r", "score": 1.5}, "score"),
    ({"request_id": "r", "score": True}, "score"),
    ({"request_id": "r"}, "score"),
    ({"request_id": "r", "score": 1, "thumbs": "up"}, "thumbs"),
    ({"request_id": "r", "thumbs": "sideways"}, "thumbs"),
    ({"score": 1}, "request_id"),
    ({"request_id": "r", "score": 1, "comment": "x" * 2001}, "comment"),
    ({"request_id": "r", "score": 1, "rating": 5}, "rating"),
])
def test_bad_bodies_are_400_naming_the_field(gateway: Gateway, body: object, param: str) -> None:
    r = _feedback(gateway, "key-acme", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_not_json_no_key_and_too_large(gateway: Gateway) -> None:
    r = gateway.client.post("/v1/feedback", content=b"{nope", headers={"authorization": "Bearer key-acme"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = gateway.client.post("/v1/feedback", json={"request_id": "r", "score": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = _feedback(gateway, "key-acme", {"request_id": "r", "score": 1, "comment": "x" * 20_000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_parse_feedback_maps_thumbs_to_scores() -> None:
    assert parse_feedback(b'{"request_id": "r", "thumbs": "up"}').value == 1.0
    assert parse_feedback(b'{"request_id": "r", "thumbs": "down"}').value == 0.0
    assert parse_feedback(b'{"request_id": "r", "score": 0.3}').value == 0.3
    with pytest.raises(BadRequest):
        parse_feedback(b'["r"]')
