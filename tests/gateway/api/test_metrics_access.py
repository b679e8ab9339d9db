"""Who may read `/metrics` (`CASCADE_METRICS_KEY`: open by default, the admin key, or its own key), and the
warning a policy without tenants gets at start."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.servers import serve

ADMIN = "test-admin-key"


def _codes(policy_file: Path, tmp_path: Path, metrics_key: str | None) -> list[int]:
    """/metrics status with no key, the admin key, and the key `scrape-key`."""
    settings = Settings(policy_path=policy_file, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        admin_key=ADMIN, metrics_key=metrics_key, access_log=None)
    with serve(create_app(settings)) as url:
        keys = [None, ADMIN, "scrape-key"]
        replies = [httpx.get(url + "/metrics", headers={"authorization": f"Bearer {k}"} if k else {}) for k in keys]
    for r in replies:
        assert (r.status_code == 200 and "cascade_" in r.text) or r.json()["error"]["code"] == "invalid_api_key"
    return [r.status_code for r in replies]


def test_metrics_open_by_default(policy_file: Path, tmp_path: Path) -> None:
    assert _codes(policy_file, tmp_path, None) == [200, 200, 200]


def test_metrics_behind_the_admin_key(policy_file: Path, tmp_path: Path) -> None:
    assert _codes(policy_file, tmp_path, "admin") == [401, 200, 401]


def test_metrics_behind_their_own_key(policy_file: Path, tmp_path: Path) -> None:
    assert _codes(policy_file, tmp_path, "scrape-key") == [401, 401, 200]


def test_a_policy_without_tenants_says_everyone_is_default(policy_file: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(policy_path=policy_file, scorer="none", start_engines=False, ledger="memory", home=tmp_path)
    with caplog.at_level(logging.WARNING, logger="cascade.runtime"), serve(create_app(settings)) as url:
        assert httpx.post(url + "/v1/chat/completions", json={"model": "micro", "messages": [
            {"role": "user", "content": "hi"}]}).status_code == 200  # no key: served as `default`
    lines = [r.getMessage() for r in caplog.records if "names no tenants" in r.getMessage()]
    assert len(lines) == 1 and "'default'" in lines[0]
