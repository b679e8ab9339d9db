"""Probe errors reach `/metrics`: a replica whose `/metrics` page cannot be parsed is counted per pool, by error."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from gateway.api.app import create_app
from gateway.settings import Settings
from tests.conftest import Upstreams, policy_yaml
from tests.servers import serve, until

_COUNTED = re.compile(r'^cascade_probe_errors_total\{error="ValueError",pool="micro"\} ([0-9.]+)$', re.MULTILINE)


def test_a_replica_whose_metrics_cannot_be_parsed_is_counted_in_metrics(tmp_path: Path, upstreams: Upstreams) -> None:
    micro, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url))
    settings = Settings(policy_path=policy, scorer="none", start_engines=False, ledger="memory", home=tmp_path,
                        access_log=None, probe_interval_s=0.1)
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=10) as client:
        assert _COUNTED.search(client.get("/metrics").text) is None
        micro.waiting = "1.2.3"  # type: ignore[assignment]  # the engine's page now says what no float is
        until(lambda: _COUNTED.search(client.get("/metrics").text) is not None, timeout=10)
        assert client.get("/readyz").status_code == 200  # the replica stays as its last good probe left it
