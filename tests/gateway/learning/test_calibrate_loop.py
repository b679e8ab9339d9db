"""`cascade router calibrate` on a request log the real gateway wrote, then the calibrated policy reloaded
into the same gateway: the realised flagship share on the same traffic is the share that was asked for."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.api.app import create_app
from gateway.cli.main import main
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from policies.loader import load_policy
from tests.conftest import policy_yaml
from tests.servers import serve

pytestmark = pytest.mark.redis
# prompts of 1..40 words: the length scorer gives 40 distinct scores, so every share is reachable exactly
PROMPTS = [" ".join(["word"] * n) + "?" for n in range(1, 41)]


def _send_all(url: str) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    pools = []
    for prompt in PROMPTS:
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
        pools.append(raw.headers["x-cascade-pool"])
    return pools


def _wait_for_lines(path: Path, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(path.read_text().splitlines()) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(path.read_text().splitlines()) == count


def test_calibrated_threshold_gives_the_asked_share_on_the_same_traffic(
    upstreams: tuple[FakeUpstream, str, FakeUpstream, str], tmp_path: Path, prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy, log = tmp_path / "policy.yaml", tmp_path / "requests.jsonl"
    policy.write_text(policy_yaml(micro_url, flagship_url))
    settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="redis",
                        redis_prefix=prefix, home=tmp_path, policy_watch_interval_s=0, request_log=log,
                        admin_key="admin-secret")
    with serve(create_app(settings)) as url:
        before = _send_all(url)
        assert before.count("flagship") == 0  # the length scorer stays under 0.5 for these prompts
        _wait_for_lines(log, len(PROMPTS))  # each line is written just after its answer is sent
        code = main(["router", "calibrate", "--log", str(log), "--policy", str(policy),
                     "--flagship-share", "0.25", "--write"])
        out = capsys.readouterr().out
        assert code == 0, out
        threshold = load_policy(policy).policy.routing.threshold
        assert isinstance(threshold, float) and 0 < threshold < 0.5, out
        r = httpx.post(url + "/admin/policy/reload", headers={"authorization": "Bearer admin-secret"}, timeout=10)
        assert r.status_code == 200, r.text
        after = _send_all(url)
    assert after.count("flagship") == 10, (threshold, after)  # 25% of 40
    assert after[-10:] == ["flagship"] * 10  # the longest prompts, as the scorer ranks them
