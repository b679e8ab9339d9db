"""The overhead benchmark's pure helpers: wrk output parsing, summaries, profile digest, SSE scanning.

No servers and no load here: the benchmark itself is run by hand (`python -m loadtest.bench.overhead`).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from loadtest.bench.overhead import build_parser
from loadtest.bench.report import LITELLM_RPS, summarise_nonstream, summarise_stream, top_frames, verdicts
from loadtest.bench.wrk import chat_body, lua_script, parse_latency_ms, parse_wrk
from loadtest.load.stream_client import StreamSample, percentile, scan_sse_line, stream_body

WRK_OUT = """Running 5s test @ http://127.0.0.1:9001/v1/chat/completions
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.10ms    1.20ms  40.12ms   91.00%
    Req/Sec     5.10k   300.00     5.60k    80.00%
  Latency Distribution
     50%  206.12us
     75%    3.20ms
     90%    4.00ms
     99%    1.20s
  25500 requests in 5.00s, 12.34MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:   5099.50
Transfer/sec:      2.47MB
"""


def test_parse_latency_units() -> None:
    assert parse_latency_ms("206.12us") == pytest.approx(0.20612)
    assert parse_latency_ms("1.5ms") == 1.5
    assert parse_latency_ms("2.00s") == 2000.0
    assert parse_latency_ms("1.00m") == 60000.0
    with pytest.raises(ValueError):
        parse_latency_ms("fast")


def test_parse_wrk_full_output() -> None:
    res = parse_wrk(WRK_OUT)
    assert res.rps == 5099.5
    assert res.p50_ms == pytest.approx(0.20612)
    assert res.p99_ms == 1200.0
    assert (res.requests, res.duration_s) == (25500, 5.0)
    assert (res.non2xx, res.socket_errors, res.timeouts) == (7, 2, 3)


def test_parse_wrk_clean_run_and_garbage() -> None:
    clean = "\n".join(line for line in WRK_OUT.splitlines() if "errors" not in line and "Non-2xx" not in line)
    res = parse_wrk(clean)
    assert (res.non2xx, res.socket_errors, res.timeouts) == (0, 0, 0)
    with pytest.raises(ValueError):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_lua_script_embeds_body_verbatim() -> None:
    body = chat_body(16)
    script = lua_script(body)
    assert 'wrk.method = "POST"' in script
    assert f"[==[{body.decode()}]==]" in script
    assert orjson.loads(body)["model"] == "auto"
    with pytest.raises(ValueError):
        lua_script(b'{"x": "]==]"}')


def _cell(rnd: int, target: str, conc: int, rps: float, p50: float, p99: float, non2xx: int = 0) -> dict[str, Any]:
    return {"round": rnd, "target": target, "concurrency": conc, "rps": rps, "p50_ms": p50, "p99_ms": p99,
            "non2xx": non2xx, "socket_errors": 0, "server_cpu_ms_per_req": 0.5}


def test_summarise_nonstream_pairs_rounds() -> None:
    cells = [_cell(1, "direct", 1, 4000, 0.2, 0.5), _cell(1, "gw-aiohttp", 1, 1000, 1.0, 2.0),
             _cell(2, "direct", 1, 4200, 0.3, 0.6), _cell(2, "gw-aiohttp", 1, 1200, 1.5, 2.2, non2xx=1)]
    rows = {r["target"]: r for r in summarise_nonstream(cells)}
    gw = rows["gw-aiohttp"]
    assert gw["rps"] == 1100
    assert gw["added_p50_ms"] == pytest.approx((0.8 + 1.2) / 2)
    assert gw["x_litellm"] == pytest.approx(1100 / LITELLM_RPS)
    assert gw["errors"] == 1
    assert rows["direct"]["added_p50_ms"] is None


def test_verdicts_judge_the_targets() -> None:
    cells = [_cell(1, "direct", c, 5000, 0.2, 1.0) for c in (1, 16, 64)]
    cells += [_cell(1, "gw-aiohttp", 1, 900, 1.0, 2.0), _cell(1, "gw-aiohttp", 16, 900, 5, 9),
              _cell(1, "gw-aiohttp", 64, 800, 20, 40)]
    stream = {"summary": summarise_stream([
        {"round": 1, "target": "direct", "tokens_per_s": 1000.0, "tokens": 10000, "wall_s": 10.0,
         "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0, "errors": 0},
        {"round": 1, "target": "gateway", "tokens_per_s": 970.0, "tokens": 9700, "wall_s": 10.0,
         "ttft_p50_ms": 11.0, "ttft_p99_ms": 25.0, "errors": 0},
    ])}
    assert stream["summary"]["ratio"] == pytest.approx(0.97)
    got = {v["target"]: v["pass"] for v in verdicts({"summary": summarise_nonstream(cells)}, stream, "gw-aiohttp")}
    assert got == {
        "gw-aiohttp req/s at c=16 (10x LiteLLM)": True,
        "gw-aiohttp req/s at c=64 (10x LiteLLM)": False,
        "gw-aiohttp added p50 at c=1": True,
        "non-streaming errors through gateways": True,
        "streaming tokens/s gateway/direct": True,
        "streaming errors": True,
    }


def test_top_frames_self_and_inclusive() -> None:
    raw = "main (a.py:1);handle (gw/service.py:10);post (x.py:3) 6\nmain (a.py:1);handle (gw/service.py:12) 4\n"
    top = top_frames(raw, n=2)
    assert top["self"][0] == ("post (x.py)", 60.0)
    assert top["inclusive"][0][1] == 100.0
    assert ("handle (gw/service.py)", 100.0) in top["inclusive"]


def test_scan_sse_line() -> None:
    sample = StreamSample()
    started = time.monotonic()
    assert not scan_sse_line(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', sample, started)
    assert sample.ttft_s is None
    assert not scan_sse_line(b'data: {"choices":[{"delta":{"content":" hi"}}]}', sample, started)
    assert sample.ttft_s is not None
    assert not scan_sse_line(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":64}}', sample,
                             started)
    assert sample.tokens == 64
    assert scan_sse_line(b"data: [DONE]", sample, started)
    assert not scan_sse_line(b": keep-alive", sample, started)


def test_stream_body_and_percentile() -> None:
    body = orjson.loads(stream_body("micro", 64))
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_parser_defaults() -> None:
    args = build_parser().parse_args([])
    assert args.concurrency == [1, 16, 64] and args.transports == ["h1", "aiohttp"]
    assert args.stream_concurrency == 16 and args.ledger == "redis"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--transports", "curl"])
