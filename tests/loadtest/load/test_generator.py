"""The load generator against fake engines (real uvicorn servers): counts, percentiles, Poisson phases,
429 / Retry-After accounting, result files, and a short surge through a real gateway whose ladder sheds
the low-priority tenant and then recedes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from gateway.api.app import create_app
from gateway.settings import Settings
from loadtest.fake_upstream import FakeUpstream
from loadtest.load.generator import LoadConfig, LoadRun, TenantKey, main, run_load, write_results
from loadtest.load.metrics import active_steps
from loadtest.load.phases import Phase, parse_phases
from loadtest.load.prompt_mix import PromptMix, parse_mix
from loadtest.scenarios.checks import surge_checks
from loadtest.scenarios.fake_engines import FREE_KEY, GOLD_KEY, ShedStep, fake_policy
from tests.servers import serve


def _run(url: str, phases: list[Phase], mode: str = "open", **kw: object) -> LoadRun:
    config = LoadConfig(base_url=url, model="fake", phases=phases, mode=mode, progress=False, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_load(config))


def test_closed_loop_counts_tokens_and_percentiles() -> None:
    fake = FakeUpstream("fake", delay_ms=5)
    with serve(fake) as url:
        run = _run(url, [Phase("run", 1.0, 2, 2)], mode="closed")
    s = run.summary()["overall"]
    assert s["sent"] == s["ok"] == len(run.samples) == fake.requests > 4
    assert all(x.completion_tokens == 16 and len(x.gaps_s) == 15 for x in run.samples)
    ttft, itl, e2e = s["ttft_ms"], s["itl_ms"], s["e2e_ms"]
    assert 5 <= ttft["p50"] <= ttft["p95"] <= ttft["p99"]
    assert 4 <= itl["p50"] <= itl["p99"] and itl["p50"] < 50
    assert e2e["p50"] >= 16 * 5 and e2e["p50"] > ttft["p50"]
    assert s["tokens_per_s"] == pytest.approx(16 * s["ok"] / run.wall_s, rel=0.01)
    assert s["error_rate"] == 0 and s["kinds"] and set(s["kinds"]) <= {"short-easy", "short-hard", "long-easy",
                                                                       "long-hard"}


def test_poisson_phases_follow_the_rate_and_ramps() -> None:
    with serve(FakeUpstream("fake")) as url:
        run = _run(url, parse_phases("idle:1s@0,flat:2s@30,ramp:2s@0->60"))
    per = run.summary()["phases"]
    assert per["idle"]["sent"] == 0
    assert 35 <= per["flat"]["sent"] <= 90  # Poisson around 60
    ramp = [s.sent_s for s in run.samples if s.phase == "ramp"]
    assert 35 <= len(ramp) <= 90
    assert sum(t > 4.0 for t in ramp) > 2 * sum(t < 4.0 for t in ramp)  # the rate rises through the ramp
    assert run.summary()["overall"]["ok"] == len(run.samples)


class _Shedder:
    """Answers 429 with Retry-After to every 2nd request, 503 to every 5th, a streamed answer otherwise."""

    def __init__(self) -> None:
        self.n = 0
        self.fake = FakeUpstream("fake")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.fake(scope, receive, send)
        self.n += 1
        if self.n % 5 == 0:
            return await self._error(send, 503, [])
        if self.n % 2 == 0:
            return await self._error(send, 429, [(b"retry-after", b"7")])
        await self.fake(scope, receive, send)

    @staticmethod
    async def _error(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        body = orjson.dumps({"error": {"message": "busy", "type": "rate_limit", "param": None, "code": None}})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": body})


def test_429_counted_apart_with_retry_after_and_5xx() -> None:
    app = _Shedder()
    with serve(app) as url:
        run = _run(url, [Phase("run", 1.0, 1, 1)], mode="closed")
    s = run.summary()["overall"]
    n = len(run.samples)
    assert n == app.n >= 10
    assert s["classes"]["5xx"] == n // 5
    assert s["rejected_429"] == s["retry_after_seen"] == sum(1 for i in range(1, n + 1) if i % 2 == 0 and i % 5)
    assert s["retry_after_values"] == ["7"]
    assert s["ok"] == n - s["rejected_429"] - s["classes"]["5xx"]
    assert s["status"]["429"] == s["rejected_429"] and "HTTP 429: busy" in s["error_examples"]


def test_results_json_and_png_written(tmp_path: Path) -> None:
    with serve(FakeUpstream("fake")) as url:
        run = _run(url, parse_phases("a:1s@10,b:1s@20"), tenants=[TenantKey("t1", "k1"), TenantKey("t2", "k2")])
    json_path, png = write_results(run, tmp_path, "unit")
    data = orjson.loads(json_path.read_bytes())
    assert set(data["summary"]["phases"]) == {"a", "b"}
    assert len(data["samples"]) == len(run.samples) and data["series"]
    assert set(data["summary"]["overall"]["tenants"]) <= {"t1", "t2"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_cli_runs_and_rejects_bad_phases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(FakeUpstream("fake")) as url:
        assert main(["--url", url + "/v1", "--model", "fake", "--mode", "closed", "--phases", "x:1s@2", "--quiet",
                     "--out", str(tmp_path), "--label", "cli"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p50/95/99 ms" in out and "results:" in out
    assert len(list(tmp_path.glob("cli-*.json"))) == len(list(tmp_path.glob("cli-*.png"))) == 1
    with pytest.raises(SystemExit) as exc:
        main(["--url", url, "--phases", "steady:twenty@2"])
    assert exc.value.code == 2 and "bad phase" in capsys.readouterr().err


def test_prompt_mix_classes_and_errors() -> None:
    mix = PromptMix(parse_mix("short-easy:1,long-hard:1"), seed=3)
    items = [mix.draw() for _ in range(50)]
    assert {i.kind for i in items} == {"short-easy", "long-hard"}
    long = [len(i.messages[0]["content"].split()) for i in items if i.kind == "long-hard"]
    short = [len(i.messages[0]["content"].split()) for i in items if i.kind == "short-easy"]
    assert min(long) > 250 > max(short)
    with pytest.raises(ValueError, match="unknown prompt class"):
        parse_mix("medium-easy:1")


def test_surge_through_gateway_sheds_low_priority_and_recedes(tmp_path: Path) -> None:
    micro, flagship = (FakeUpstream(m, delay_ms=10, max_running=1) for m in ("micro-model", "flagship-model"))
    steps = [ShedStep(f"{p}-queue", "queue_depth", p, enter=2, exit=1, hold_s=0.5, retry_after_s=3)
             for p in ("micro", "flagship")]
    with serve(micro) as micro_url, serve(flagship) as flagship_url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(fake_policy([micro_url], [flagship_url], steps))
        settings = Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory", home=tmp_path,
                            probe_interval_s=0.1)
        with serve(create_app(settings)) as url:
            tenants = [TenantKey("gold", GOLD_KEY), TenantKey("free", FREE_KEY, 3)]
            config = LoadConfig(base_url=url, model="micro", phases=parse_phases("steady:1.5s@3,surge:3s@25"),
                                max_tokens=8, progress=False, tenants=tenants, metrics_url=url + "/metrics",
                                metrics_interval_s=0.2)
            run = asyncio.run(run_load(config))
            deadline = time.monotonic() + 20
            while active_steps(httpx.get(url + "/metrics").text):  # the queue drains, the step recedes
                assert time.monotonic() < deadline, "the ladder did not recede"
                time.sleep(0.1)
            closed = replace(config, phases=parse_phases("after:1s@2"), mode="closed", metrics_url=None)
            after = asyncio.run(run_load(closed))
    summary = run.summary()
    phases = summary["phases"]
    assert phases["steady"]["rejected_429"] == 0 and phases["steady"]["ok"] == phases["steady"]["sent"]
    assert summary["ladder_engaged"] == ["micro-queue"]
    assert phases["surge"]["tenants"]["free"]["429"] > 0 and summary["overall"]["tenants"]["gold"]["429"] == 0
    assert after.summary()["overall"]["ok"] == len(after.samples) > 0  # back to serving everyone
    checks = {c.name: c.ok for c in surge_checks(summary)}
    assert checks["no 5xx from the gateway"] is True
    assert checks["low priority shed with 429 + Retry-After"] is True
