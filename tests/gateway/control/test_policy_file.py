"""A policy file the gateway no longer serves shows: after an edit the watcher rejects, every gateway process on the
file says so in /readyz (degraded, not failed: the policy before still serves), in /metrics and in
`cascade policy status`, with what to do; a valid edit then clears it."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import httpx
import pytest

from gateway.cli.main import main
from tests.conftest import GatewayFactory
from tests.servers import until


@pytest.fixture
def gateways(make_gateway: GatewayFactory, policy_file: Path) -> list[str]:
    """Two gateway processes' worth (as two workers would be) watching one policy file, each reloading by itself.
    Served (uvicorn): `policy status --gateway` asks them over HTTP."""
    return [make_gateway(policy_file, served=True, scorer="none", admin_key="admin", access_log=None,
                         policy_watch_interval_s=0.05).url for _ in range(2)]


def _ready(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=10)


def _rejected(url: str) -> bool:
    return _ready(url).json()["policy"]["last_error"] is not None


def _serves_another(url: str, version: str) -> bool:
    return bool(_ready(url).json()["policy_version"] != version)


def _save(path: Path, text: str) -> None:
    """An edit saved whole: written beside the file and renamed over it. `write_text` truncates first, and a watcher
    that looks in between reads an empty file, a rejected edit of its own (seen: two rejections counted for one)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _metric(url: str, name: str, labels: str = "") -> float | None:
    text = httpx.get(url + "/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(name)}{{?{re.escape(labels)}[^ ]* ([0-9.e+-]+)$", text, re.M)
    return None if found is None else float(found.group(1))


def test_a_rejected_edit_shows_everywhere_and_a_good_one_clears_it(
        gateways: list[str], policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _ready(gateways[0]).json()
    served = first["policy_version"]
    assert first["status"] == "ready" and first["policy"]["matches_file"] and first["policy"]["file_version"] == served
    good = policy_file.read_text()
    _save(policy_file, good.replace("flagship_pool: flagship", "flagship_pool: nosuchpool"))
    for url in gateways:  # each process looked at the file itself
        until(functools.partial(_rejected, url))
        reply = _ready(url)
        body = reply.json()
        assert reply.status_code == 200 and body["ready"] and body["status"] == "degraded"
        policy = body["policy"]
        assert policy["served_version"] == body["policy_version"] == served != policy["file_version"]
        assert not policy["matches_file"] and policy["last_error"]["result"] == "rejected"
        assert any("nosuchpool" in problem for problem in policy["last_error"]["problems"])
        assert _metric(url, "cascade_policy_reloads_total", 'result="rejected"') == 1.0
        assert _metric(url, "cascade_policy_file_matches") == 0.0
        assert _metric(url, "cascade_policy_served_timestamp_seconds", f'version="{served}"') == policy["served_since"]
    assert main(["policy", "status", "--gateway", gateways[0]]) == 1
    out = capsys.readouterr().out
    assert "degraded" in out and "does NOT match" in out and "nosuchpool" in out and "to do:" in out
    assert "reloads:       applied 0, unchanged 0, rejected 1," in out  # /metrics' series too
    assert f"worker -:      serves {served} since " in out and "file does NOT match" in out
    _save(policy_file, good.replace("threshold: 0.5", "threshold: 0.6"))
    for url in gateways:
        until(functools.partial(_serves_another, url, served))
        body = _ready(url).json()
        assert body["status"] == "ready" and body["policy"]["matches_file"] and body["policy"]["last_error"] is None
        assert _metric(url, "cascade_policy_reloads_total", 'result="applied"') == 1.0
        assert _metric(url, "cascade_policy_file_matches") == 1.0
    assert main(["policy", "status", "--gateway", gateways[1]]) == 0
    out = capsys.readouterr().out
    assert "(matches what is served)" in out and "applied 1," in out and ", file matches" in out


def test_policy_status_says_when_it_cannot_ask(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "status", "--gateway", "http://127.0.0.1:9"]) == 2
    assert "cannot read http://127.0.0.1:9/readyz" in capsys.readouterr().err


def test_a_reload_on_a_gateway_started_without_the_admin_key_says_what_to_do(make_gateway: GatewayFactory,
                                                                              fake_policy_file: Path) -> None:
    gateway = make_gateway(fake_policy_file, scorer="none", admin_key=None, access_log=None)
    reply = gateway.client.post("/admin/policy/reload", headers={"authorization": "Bearer anything"})
    error = reply.json()["error"]
    assert reply.status_code == 401 and "started without an admin key" in error["message"]
    assert "CASCADE_ADMIN_KEY" in error["message"] and "restart" in error["message"]


def test_a_refused_reload_says_what_to_do_and_readiness_says_why(make_gateway: GatewayFactory,
                                                                  fake_policy_file: Path) -> None:
    gateway = make_gateway(fake_policy_file, scorer="none", admin_key="admin", access_log=None,
                           policy_watch_interval_s=0)
    first = gateway.client.get("/readyz").json()
    served = first["policy_version"]
    assert first["status"] == "ready" and first["reasons"] == [] and first["policy"]["reason"] is None
    good = fake_policy_file.read_text()
    _save(fake_policy_file, good.replace("flagship_pool: flagship", "flagship_pool: nosuchpool"))
    edited = gateway.client.get("/readyz").json()  # no reload yet (no watcher here)
    assert edited["status"] == "degraded" and len(edited["reasons"]) == 1
    assert "not applied here yet" in edited["reasons"][0] and f"version {served} still serves" in edited["reasons"][0]
    reply = gateway.client.post("/admin/policy/reload", headers={"authorization": "Bearer admin"})
    error = reply.json()["error"]
    assert reply.status_code == 422 and error["code"] == "invalid_policy"
    assert f"version {served} still serves" in error["message"]
    assert f"`cascade policy validate {fake_policy_file}`" in error["message"] and "reload again" in error["message"]
    assert any("nosuchpool" in problem for problem in error["problems"])
    rejected = gateway.client.get("/readyz")
    (reason,) = rejected.json()["reasons"]
    assert rejected.status_code == 200 and rejected.json()["status"] == "degraded" and rejected.json()["ready"]
    assert "was rejected" in reason and "cascade policy validate" in reason
    fake_policy_file.unlink()
    (reason,) = gateway.client.get("/readyz").json()["reasons"]
    assert "cannot be read" in reason and f"version {served} still serves" in reason
    _save(fake_policy_file, good)  # the served version back: nothing to say
    back = gateway.client.get("/readyz").json()
    assert back["status"] == "ready" and back["reasons"] == [] and back["policy_version"] == served


def test_policy_status_reads_metrics_behind_their_key(make_gateway: GatewayFactory, policy_file: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = make_gateway(policy_file, served=True, scorer="none", access_log=None, metrics_key="metrics-secret",
                       policy_watch_interval_s=0).url
    monkeypatch.delenv("CASCADE_METRICS_KEY", raising=False)
    assert main(["policy", "status", "--gateway", url]) == 0  # /readyz alone still answers
    out = capsys.readouterr().out
    assert "metrics:       not read (" in out and "needs a key: set CASCADE_METRICS_KEY" in out
    monkeypatch.setenv("CASCADE_METRICS_KEY", "metrics-secret")
    assert main(["policy", "status", "--gateway", url]) == 0
    out = capsys.readouterr().out
    assert "reloads:       applied 0," in out and ", file matches" in out
