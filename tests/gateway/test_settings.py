"""The gateway's settings: what their help names exists, and the replay log keeps the share it is given."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import OPTIONS, Settings
from tests.servers import serve


def test_every_endpoint_the_settings_help_names_is_served(policy_file: Path, tmp_path: Path) -> None:
    named = {m for o in OPTIONS for m in re.findall(r"\b(GET|POST) (/[\w/]+)", o.help)}
    assert ("POST", "/admin/policy/reload") in named
    settings = Settings(policy_path=policy_file, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        admin_key="k")
    with serve(create_app(settings)) as url:
        for method, path in sorted(named):
            r = httpx.request(method, url + path)  # no admin key: a served admin endpoint answers 401
            assert r.status_code != 404, f"{method} {path}: {r.status_code}"


def test_the_replay_log_keeps_its_sample_of_requests(policy_file: Path, tmp_path: Path) -> None:
    log, sent = tmp_path / "requests.jsonl", 60
    settings = Settings(policy_path=policy_file, scorer="length", start_engines=False, ledger="memory",
                        home=tmp_path, request_log=log, request_log_sample=0.5)
    with serve(create_app(settings)) as url:
        for _ in range(sent):
            body = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    kept = len(log.read_text().splitlines())  # the server's shutdown waited for every record and log line
    # Binomial(60, 0.5): outside [12, 48] with a probability under 1e-5
    assert 12 <= kept <= 48, kept


@pytest.mark.parametrize("share", ["0", "1.5", "-0.1"])
def test_a_replay_log_share_outside_0_to_1_is_refused(share: str) -> None:
    option = next(o for o in OPTIONS if o.name == "request_log_sample")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        option.parse(share)
