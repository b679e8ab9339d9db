"""The quick start's main job: real engines, the gateway, sample traffic through the openai SDK, a report.

It starts the gateway as a separate process (`cascade serve`), which starts the policy's local vLLM
engines; it shows what it waits for while they load, sends a mixed batch of prompts (streaming and
not), prints where each went, then the ledger's cost totals, and stops everything it started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import redis

from gateway.settings import default_home

__all__ = ["DEMO_PREFIX", "SAMPLE_PROMPTS", "ensure_redis", "gateway_command", "register", "run_demo",
           "stop_process_group"]

DEMO_PREFIX = "cascade-demo:"  # the quick start's records, apart from a real gateway's (cascade:) and the tests'

SAMPLE_PROMPTS: tuple[tuple[str, bool], ...] = (
    ("Hi! How are you today?", False),
    ("Classify the sentiment of this review as positive or negative: 'The battery died after two days.'", False),
    ("Extract the email address from: 'Contact Jane at jane.doe@example.com for details.'", True),
    ("Summarize in one sentence: The meeting moved from Tuesday to Thursday because the room was booked.", False),
    ("Translate 'good morning' into French.", True),
    ("A train leaves at 3:40 pm and travels 210 km at 84 km/h, then waits 25 minutes and covers another 96 km "
     "at 64 km/h. Reason step by step: when does it arrive, and what was its average speed overall?", True),
    ("Write a thread-safe LRU cache in Python with O(1) get and put, TTL expiry per entry, and unit tests. "
     "Explain the locking strategy and its trade-offs under heavy contention.", False),
    ("Prove that there are infinitely many primes of the form 4k+3, and explain why the same argument fails "
     "for primes of the form 4k+1.", True),
    ("Our startup must choose between raising a bridge round at a flat valuation or cutting 30% of staff. "
     "Weigh runway, morale, signalling to investors and hiring plans, and recommend one with reasons.", False),
)


def ensure_redis(url: str) -> str:
    """Find Redis at `url`, or start a local non-persistent one when `url` is on this host. Returns what
    it did, in words. Raises RuntimeError with the fix when neither works."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
        return f"Redis found at {url}"
    except redis.RedisError:
        pass
    parsed = urlparse(url)
    binary = shutil.which("redis-server")
    if parsed.hostname not in ("127.0.0.1", "localhost") or binary is None:
        raise RuntimeError(f"Redis is not reachable at {url}; start one (e.g. `apt-get install -y redis-server`) "
                           "or set CASCADE_REDIS_URL")
    port = str(parsed.port or 6379)
    subprocess.run([binary, "--daemonize", "yes", "--bind", "127.0.0.1", "--port", port, "--save", "",
                    "--appendonly", "no"], check=True, capture_output=True)
    for _ in range(50):
        try:
            client.ping()
            return f"Redis was not running: started redis-server on 127.0.0.1:{port} (no persistence)"
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError(f"started redis-server on port {port} but it does not answer")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `demo` to a `cascade` subparsers object."""
    from policies.loader import default_policy_path

    p = sub.add_parser(
        "demo", help="the quick start: engines + gateway + sample traffic + cost report, then stop",
        description="Builds the demo models if needed, finds or starts Redis, starts the gateway with both "
        "demo engines, sends a mixed batch of prompts through the openai SDK, prints the routing and the "
        "cost totals, and stops everything it started.",
    )
    p.set_defaults(func=run_demo)
    p.add_argument("--policy", default=str(default_policy_path()), help="policy YAML (default: the demo policy)")
    p.add_argument("--port", type=int, default=8080, help="gateway port")
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for the engines")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--micro", choices=["smollm2", "tiny"], default=os.environ.get("CASCADE_DEMO_MICRO") or "smollm2",
                   help="model of the micro pool: SmolLM2-135M-Instruct, a real instruct model installed from its "
                   "PyPI wheel (default; falls back to tiny when it cannot be had), or the tiny random model "
                   "the tests use ($CASCADE_DEMO_MICRO)")
    p.add_argument("--prefix", default=DEMO_PREFIX,
                   help="Redis key prefix of the demo's gateway, ledger and report (default: %(default)s, apart "
                   "from a real gateway's cascade:)")
    p.add_argument("--with-fallback", action="store_true",
                   help="build the flagship's calibrated int8 fallback (cascade quantize --demo, minutes the first "
                   "time) and run policies/demo-ladder.yaml, whose ladder uses it")


def gateway_command(args: argparse.Namespace) -> list[str]:
    """`cascade serve` as the demo runs it: its policy, port and Redis key prefix."""
    return [sys.executable, "-m", "gateway", "serve", "--policy", args.policy, "--port", str(args.port),
            "--redis-prefix", args.prefix]


def _start_gateway(args: argparse.Namespace, log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(gateway_command(args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> None:
    started, last = time.monotonic(), ""
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {proc.returncode}; see {log_path}")
        try:
            body = httpx.get(base + "/readyz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            body = {"engines": {}, "ready": False}
        if body.get("ready"):
            print(f"  ready after {time.monotonic() - started:.0f} s", flush=True)
            return
        engines = body.get("engines") or {"gateway": "loading the classifier"}
        line = ", ".join(f"{k}: {v}" for k, v in engines.items())
        if line != last or int(time.monotonic() - started) % 15 == 0:
            print(f"  [{time.monotonic() - started:4.0f} s] waiting for {line}", flush=True)
            last = line
        time.sleep(1)
    raise RuntimeError(f"engines not ready after {timeout:.0f} s; see {log_path} and {log_path.parent}")


def _one_line(text: str, width: int = 100) -> str:
    """An answer on one line, cut to `width` characters."""
    flat = " ".join(text.split()) or "(empty answer)"
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _send_prompts(base: str, max_tokens: int) -> None:
    try:
        import openai
    except ImportError as exc:
        raise RuntimeError("the demo sends its traffic with the official openai SDK: "
                           "pip install 'cascade-gateway[demo]'") from exc

    client = openai.OpenAI(base_url=base + "/v1", api_key=os.environ.get("CASCADE_API_KEY", "demo"))
    print(f"\n{'prompt':<52} {'stream':>6} {'pool':>9} {'score':>6} {'in':>4} {'out':>4} {'ttft ms*':>8}")
    for prompt, stream in SAMPLE_PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        started = time.monotonic()
        ttft, parts = None, []
        if stream:
            with client.chat.completions.with_streaming_response.create(  # type: ignore[call-overload]
                model="auto", messages=messages, max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True},
            ) as raw:
                headers, usage = raw.headers, None
                for chunk in raw.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        ttft = (time.monotonic() - started) * 1000 if ttft is None else ttft
                        parts.append(chunk.choices[0].delta.content)
                    usage = chunk.usage or usage
        else:
            raw_resp = client.chat.completions.with_raw_response.create(
                model="auto", messages=messages, max_tokens=max_tokens  # type: ignore[arg-type]
            )
            completion = raw_resp.parse()
            headers, usage = raw_resp.headers, completion.usage
            parts = [completion.choices[0].message.content or ""] if completion.choices else []
            ttft = (time.monotonic() - started) * 1000
        tokens = (usage.prompt_tokens, usage.completion_tokens) if usage else ("?", "?")
        short = prompt if len(prompt) <= 50 else prompt[:47] + "..."
        print(f"{short:<52} {'yes' if stream else 'no':>6} {headers['x-cascade-pool']:>9} "
              f"{headers['x-cascade-score']:>6} {tokens[0]:>4} {tokens[1]:>4} {ttft or 0:8.1f}")
        print(f"    -> {_one_line(''.join(parts))}")
    print("* streaming: time to the first token; non-streaming: time to the whole answer")


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 90.0) -> None:
    """Stop a process started with `start_new_session=True` and everything it spawned (engines): SIGTERM
    to the group, SIGKILL after `grace_s`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _needs_int8_demo(policy: Path) -> bool:
    """Whether the policy has a pool serving the demo's calibrated int8 flagship (`cascade quantize --demo`)."""
    try:
        return "demo:flagship-w8a8" in policy.read_text(encoding="utf-8")
    except OSError:
        return False  # the gateway reports an unreadable policy itself


def run_demo(args: argparse.Namespace) -> int:
    from backends.models.demo import MICRO_ENV
    from gateway.settings import Settings
    from policies.loader import default_policy_path

    if args.with_fallback and Path(args.policy) == default_policy_path():
        args.policy = str(default_policy_path().with_name("demo-ladder.yaml"))
    os.environ[MICRO_ENV] = args.micro  # the gateway and its engines inherit it: demo:micro follows
    settings = Settings(policy_path=Path(args.policy))
    try:
        print(ensure_redis(settings.redis_url), flush=True)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if _needs_int8_demo(Path(args.policy)):
        from backends.quantization.cli import build_demo_fallback

        if build_demo_fallback() != 0:
            return 1
    log_path = default_home() / "logs" / "gateway.log"
    base = f"http://127.0.0.1:{args.port}"
    print(f"starting the gateway and its engines (log: {log_path}); on 2 CPU cores this takes a few minutes",
          flush=True)
    proc = _start_gateway(args, log_path)
    try:
        _wait_ready(base, proc, args.timeout, log_path)
        _print_models()
        _send_prompts(base, args.max_tokens)
        time.sleep(0.5)  # cost records are written just after each answer
        print()
        return _print_costs(settings.redis_url, args.prefix)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping the gateway and its engines", flush=True)
        stop_process_group(proc)


def _print_models() -> None:
    """Which model answers in the micro pool: read once its engine is up, since the engine's start built it
    (a real model that could not be had leaves the tiny one in its place)."""
    from backends.models.demo import demo_model_dir, models_root

    micro = demo_model_dir(models_root(), "micro").name
    shown = "SmolLM2-135M-Instruct (real answers)" if micro == "smollm2" else "tiny random Llama (meaningless text)"
    print(f"micro pool model: {shown}; flagship: tiny random Mixtral (meaningless text)", flush=True)


def _print_costs(redis_url: str, prefix: str) -> int:
    from gateway.costs.cli import print_report

    print(f"cost totals in the ledger under the quick start's prefix {prefix} (last 7 days, every quick start run "
          "in them):")
    return print_report(redis_url, by="pool", days=7, prefix=prefix)
