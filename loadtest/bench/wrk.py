"""wrk for the overhead benchmark: the Lua request script, running wrk, and parsing its `--latency` output."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = [
    "WRK_INSTALL_HINT",
    "WrkResult",
    "chat_body",
    "distinct_lua",
    "lua_script",
    "parse_latency_ms",
    "parse_wrk",
    "run_wrk",
]

WRK_INSTALL_HINT = "wrk is not installed: `apt-get install -y wrk` (Debian/Ubuntu) or `brew install wrk` (macOS)"
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_LAT = re.compile(r"^\s*(50|75|90|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s|m|h)\s*$", re.MULTILINE)


@dataclass(slots=True)
class WrkResult:
    """One wrk run. Latencies in ms; `non2xx` counts HTTP status >= 400; `socket_errors` sums connect, read
    and write errors; `timeouts` counts requests slower than wrk's --timeout (not failures of the server)."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    duration_s: float
    non2xx: int
    socket_errors: int
    timeouts: int = 0


def parse_latency_ms(text: str) -> float:
    """wrk's time format ('206.12us', '1.20ms', '2.00s', '1.00m') in milliseconds."""
    match = re.fullmatch(r"\s*([0-9.]+)(us|ms|s|m|h)\s*", text)
    if match is None:
        raise ValueError(f"not a wrk latency: {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def _int_after(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else 0


def parse_wrk(text: str) -> WrkResult:
    """Parse the output of `wrk --latency`. Raises ValueError when the summary lines are missing."""
    lat = {int(q): float(v) * _UNITS_MS[u] for q, v, u in _LAT.findall(text)}
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.MULTILINE)
    total = re.search(r"^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m|h)", text, re.MULTILINE)
    if rps is None or total is None or 50 not in lat or 99 not in lat:
        raise ValueError(f"unexpected wrk output:\n{text}")
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return WrkResult(
        rps=float(rps.group(1)), p50_ms=lat[50], p99_ms=lat[99], requests=int(total.group(1)),
        duration_s=float(total.group(2)) * _UNITS_MS[total.group(3)] / 1e3,
        non2xx=_int_after(r"Non-2xx or 3xx responses:\s+(\d+)", text),
        socket_errors=sum(int(g) for g in sock.groups()[:3]) if sock else 0,
        timeouts=int(sock.group(4)) if sock else 0,
    )


def chat_body(max_tokens: int = 16) -> bytes:
    """The non-streaming request: model 'auto', a short user message."""
    return orjson.dumps({"model": "auto", "max_tokens": max_tokens,
                         "messages": [{"role": "user", "content": "What is the capital of France?"}]})


def lua_script(body: bytes) -> str:
    """A wrk script that POSTs `body` as JSON (Lua long bracket: no escaping needed)."""
    text = body.decode()
    if "]==]" in text:
        raise ValueError("body must not contain ']==]'")
    return (f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = [==[{text}]==]\n")


def distinct_lua(prompts: list[str], body: dict[str, object]) -> str:
    """A wrk script that POSTs `body` (a chat request without messages) with a different user message each time:
    `prompts` in turn, each after a number of its own ("#N "), so no two requests share a scoring text (the gateway's
    score cache never answers; every request is embedded and scored). The number leads the message, where a long
    prompt's cut at the scorer's `SCORING_CHARS` does not drop it, and each run of the script starts its numbers at
    its start second times 100,000, so runs a second or more apart and under 100,000 requests a second share none
    (a cache kept from an earlier round of the same bench answers nothing). One wrk thread numbers its own requests:
    run it with -t1."""
    level = "=" * 8
    mark = "@@number@@"
    pieces = []
    for prompt in prompts:
        head = orjson.dumps({**body, "messages": [{"role": "user", "content": f"#{mark} {prompt}"}]}).decode()
        front, sep, back = head.partition(mark)
        if not sep or mark in back or f"]{level}]" in front or f"]{level}]" in back:
            continue
        pieces.append(f"{{[{level}[{front}]{level}], [{level}[{back}]{level}]}}")
    if not pieces:
        raise ValueError("no prompt fits the Lua script")
    return ('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"local prompts = {{{', '.join(pieces)}}}\nlocal n = (os.time() % 100000) * 100000\n"
            "request = function()\n  n = n + 1\n  local p = prompts[(n % #prompts) + 1]\n"
            "  return wrk.format(nil, nil, nil, p[1] .. string.format('%d', n) .. p[2])\nend\n")


def run_wrk(url: str, lua: Path, connections: int, duration_s: float, threads: int, timeout_s: float) -> WrkResult:
    """Run wrk against `url` (full URL) and parse it."""
    cmd = ["wrk", f"-t{min(threads, connections)}", f"-c{connections}", f"-d{duration_s:g}s",
           f"--timeout={timeout_s:g}s", "--latency", "-s", str(lua), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)
