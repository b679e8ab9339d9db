"""Process settings: where state lives, what to start, which stores to use, and every request limit.

One table (`OPTIONS`) names each setting once: its `cascade serve` flag, its environment variable and its
help. A flag wins over the variable, the variable over the default. `Settings` is parsed once and frozen.
Stdlib only (and the light `backends.clients.transports`): `cascade --help` imports this.

The state folder (`home`) is `$CASCADE_HOME`, else `./.cascade` resolved against the current directory.
`cascade` exports the resolved folder as `$CASCADE_HOME` before any command runs (`export_home`), so the
engines, the demo models (`backends.models.demo`), the router's caches and artifact store
(`router_models`) and the ledger outbox all land in the same place whichever folder it was started from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from backends.clients.transports import DEFAULT_TRANSPORT, TRANSPORTS, Transport

__all__ = ["OPTIONS", "Option", "Settings", "add_arguments", "argparse_type", "default_home", "export_home",
           "from_args", "positive_int"]

HOME_ENV = "CASCADE_HOME"
REDIS_URL = "redis://127.0.0.1:6379/0"  # the default, where $CASCADE_REDIS_URL is not set
REDIS_PREFIX = "cascade:"  # the default, where $CASCADE_REDIS_PREFIX is not set (the tests set their own)
OVERFLOW_ENV = "CASCADE_ROUTER_OVERFLOW"  # tests/conftest.py sets it to none: scores stay the primary's
OVERFLOW_DEFAULT = "auto"


def default_home(env: Mapping[str, str] | None = None) -> Path:
    """State folder for models, caches, logs and the ledger outbox: $CASCADE_HOME or ./.cascade, resolved."""
    env = os.environ if env is None else env
    return Path(env.get(HOME_ENV) or ".cascade").expanduser().resolve()


def export_home(home: Path | None = None) -> Path:
    """Resolve the state folder once and export it as $CASCADE_HOME for this process and its children."""
    resolved = (home or default_home()).expanduser().resolve()
    os.environ[HOME_ENV] = str(resolved)
    return resolved


@dataclass(frozen=True, slots=True)
class Settings:
    policy_path: Path
    redis_url: str = field(default_factory=lambda: os.environ.get("CASCADE_REDIS_URL", REDIS_URL))
    redis_prefix: str = field(default_factory=lambda: os.environ.get("CASCADE_REDIS_PREFIX") or REDIS_PREFIX)
    scorer: Literal["classifier", "length", "none"] = "classifier"
    start_engines: bool = True
    ledger: Literal["redis", "memory"] = "redis"
    ledger_retention_days: int = 35  # per-request records and idempotency keys; rollups are kept
    transport: Transport = DEFAULT_TRANSPORT
    max_body_bytes: int = 1 << 20
    max_messages: int = 1024
    max_tokens_cap: int | None = None  # clamp on max_tokens / max_completion_tokens (None: pool context)
    deadline_s: float = 300.0  # until the whole answer (non-streaming) or the first chunk (streaming)
    auth_failure_burst: int = 20  # failed authentications a client address may make at once (then 429)
    auth_failures_per_minute: float = 30.0  # how fast that allowance refills
    admin_key: str | None = field(default_factory=lambda: os.environ.get("CASCADE_ADMIN_KEY"))
    # who may read /metrics: unset or "" (anyone), "admin" (the admin key), any other value (that bearer key)
    metrics_key: str | None = field(default_factory=lambda: os.environ.get("CASCADE_METRICS_KEY"))
    home: Path = field(default_factory=default_home)
    probe_interval_s: float = 1.0
    policy_watch_interval_s: float = 2.0  # 0 disables reloading on file change
    request_log: Path | None = None  # JSONL replay log (holds prompts: off unless set)
    request_log_sample: float = 1.0  # the share of requests the replay log keeps, in (0, 1]
    access_log: str | None = "-"  # one JSON line per request, no text (`gateway.serving.records.access_log`): "-"
                                  # stdout
    access_log_sample: float = 1.0  # share of requests that get an access line
    access_log_buffer: int = 10_000  # access lines queued for a slow reader; more are dropped and counted
    router_artifact: Path | None = None  # None: $CASCADE_ROUTER_ARTIFACT, else the last promoted, else shipped
    router_overflow: str = field(default_factory=lambda: os.environ.get(OVERFLOW_ENV) or OVERFLOW_DEFAULT)
    # freeze the long-lived heap out of the cyclic collector (gateway.telemetry.gc_pauses): `cascade serve` turns it
    # on, its process being the gateway's own; an app built inside another process (tests, a host app) leaves
    # that process's heap alone
    gc_freeze: bool = False
    # "avoid": a process that serves and starts no engine keeps off the host's CPU engines' cores
    # (gateway.control.fleet.host_cores); "share": it runs on every core
    engine_cores: Literal["share", "avoid"] = "share"

    def __post_init__(self) -> None:
        if self.auth_failure_burst < 1:  # 0 would answer every client 429 at its first wrong key
            raise ValueError(f"auth_failure_burst: must be >= 1, got {self.auth_failure_burst}")
        if not self.auth_failures_per_minute > 0:
            raise ValueError(f"auth_failures_per_minute: must be > 0, got {self.auth_failures_per_minute}")

    @property
    def outbox_dir(self) -> Path:
        return self.home / "outbox"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {text}")
    return value


def _access_target(text: str) -> str | None:
    return None if text.strip().lower() in ("", "off", "none") else text


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be in [0, 1], got {text}")
    return value


def _optional_cap(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "0") else positive_int(text)


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: the `Settings` field it fills, its flag and environment variable, how to parse it."""

    name: str
    env: str
    parse: Callable[[str], Any]
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("redis_url", "CASCADE_REDIS_URL", str, "Redis of the ledger, limits, budgets and the shared ladder "
           "(redis+cluster://HOST:PORT for a Redis Cluster)", metavar="URL"),
    Option("redis_prefix", "CASCADE_REDIS_PREFIX", str, "key prefix of everything the gateway keeps in Redis"),
    Option("ledger", "CASCADE_LEDGER", str, "where cost records go (memory: experiments only, nothing is kept)",
           choices=("redis", "memory")),
    Option("ledger_retention_days", "CASCADE_LEDGER_RETENTION_DAYS", positive_int,
           "keep per-request cost records this long (rollups are kept for good)", metavar="DAYS"),
    Option("scorer", "CASCADE_SCORER", str, "complexity scorer: the trained classifier, a length heuristic, or "
           "none (everything 'auto' goes to the micro pool)", choices=("classifier", "length", "none")),
    Option("engine_cores", "CASCADE_ENGINE_CORES", str, "avoid: a process that serves and starts no engine (each "
           "of --workers N, or with --no-engines) binds itself to the cores the host's CPU engines' model workers are "
           "not bound to, checked every 10 s, for a host where other work competes with the engines; share: it runs "
           "on every core (gateway.control.fleet.host_cores; BENCHMARKS.md: avoid cut the TTFT p99 on a busy host "
           "and cost rate at 8+ streams on a quiet one)", choices=("share", "avoid")),
    Option("transport", "CASCADE_TRANSPORT", str, "HTTP client for plain-http engines on this host (remote and "
           "TLS pools always use aiohttp; see BENCHMARKS.md)", choices=TRANSPORTS),
    Option("max_body_bytes", "CASCADE_MAX_BODY_BYTES", positive_int,
           "largest request body accepted (413 above it)", metavar="BYTES"),
    Option("max_messages", "CASCADE_MAX_MESSAGES", positive_int, "most messages in one request (400 above it)",
           metavar="N"),
    Option("max_tokens_cap", "CASCADE_MAX_TOKENS_CAP", _optional_cap,
           "clamp max_tokens / max_completion_tokens to this (none: up to the pool's context)", metavar="TOKENS"),
    Option("auth_failure_burst", "CASCADE_AUTH_FAILURE_BURST", positive_int, "failed authentications (missing, "
           "unknown, revoked or expired key) one client address may make at once; then 429 with Retry-After, its "
           "keys not looked up (gateway.api.auth_limits)", metavar="N"),
    Option("auth_failures_per_minute", "CASCADE_AUTH_FAILURES_PER_MINUTE", _positive_float,
           "how fast a client address's allowance of failed authentications refills", metavar="N"),
    Option("deadline_s", "CASCADE_DEADLINE_S", _positive_float,
           "seconds until the whole answer (or a stream's first chunk); 504 after it", metavar="SECONDS"),
    Option("probe_interval_s", "CASCADE_PROBE_INTERVAL_S", _positive_float,
           "seconds between health probes of each replica and ladder signal reads", metavar="SECONDS"),
    Option("policy_watch_interval_s", "CASCADE_POLICY_WATCH_INTERVAL_S", _non_negative_float,
           "seconds between checks of the policy file for changes (0: reload only on POST /admin/policy/reload)",
           metavar="SECONDS"),
    Option("home", HOME_ENV, Path, "state folder: engine logs, demo models, router caches, the ledger outbox",
           metavar="DIR"),
    Option("router_artifact", "CASCADE_ROUTER_ARTIFACT", Path, "router artifact (.json) the classifier scorer "
           "serves (none: the last one promoted into $CASCADE_HOME/router, else the shipped one; "
           "router_models/artifacts/complexity-router-static.json is the fast one, see the model card)",
           metavar="FILE"),
    Option("router_overflow", OVERFLOW_ENV, str, "the classifier's overflow artifact: what a surge's requests are "
           "scored with when the primary model would keep them waiting over 10 ms (auto: the fast "
           "complexity-router-static.json beside the shipped default, nothing beside any other primary; none; or "
           "a .json path). The default's is the fast artifact already in front of the transformer (ready at once); "
           "another loads in the background; `cascade_router_scored_total{model}` counts each",
           metavar="auto|none|FILE"),
    Option("request_log", "CASCADE_REQUEST_LOG", Path, "append each request (with its prompt) as JSONL for "
           "`cascade policy replay` and `cascade router calibrate`; off by default", metavar="FILE"),
    Option("request_log_sample", "CASCADE_REQUEST_LOG_SAMPLE", _fraction, "the share of requests the replay log "
           "keeps, each drawn at random (it holds prompts: keep no more than replay and calibration need)",
           metavar="SHARE"),
    Option("access_log", "CASCADE_ACCESS_LOG", _access_target, "one JSON line per request (ids, tenant, key id, "
           "pool, status, latency, TTFT, tokens, cost; never prompt text): - for stdout, a file, or off",
           metavar="-|FILE|off"),
    Option("access_log_sample", "CASCADE_ACCESS_LOG_SAMPLE", _share, "share of requests written to the access "
           "log (0 to 1)", metavar="SHARE"),
    Option("access_log_buffer", "CASCADE_ACCESS_LOG_BUFFER", positive_int, "access-log lines held for a reader "
           "slower than the traffic (a stalled pipe); lines beyond it are dropped and counted in "
           "cascade_access_log_dropped_total, never a request held", metavar="LINES"),
)
# built-in defaults; the fields read from the environment when built directly default to these without it
_DEFAULTS = {f.name: f.default for f in fields(Settings) if not callable(f.default_factory)} | {
    "redis_url": REDIS_URL, "redis_prefix": REDIS_PREFIX, "router_overflow": OVERFLOW_DEFAULT}


def _env_default(option: Option, env: Mapping[str, str]) -> Any:
    text = env.get(option.env)
    if text is None or text == "":
        if option.name == "home":
            return default_home(env)
        return _DEFAULTS.get(option.name)
    try:
        value = option.parse(text)
    except ValueError as exc:
        raise SystemExit(f"error: ${option.env}={text!r}: {exc}") from exc
    if option.choices is not None and value not in option.choices:
        raise SystemExit(f"error: ${option.env}={text!r}: choose one of {', '.join(option.choices)}")
    return value


def argparse_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """`parse` as an argparse `type=`: its ValueError becomes a usage error that keeps the message."""
    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    checked.__name__ = name  # argparse names the type in its error message
    return checked


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Add one flag per `OPTIONS` entry; each defaults to its environment variable, else the built-in default,
    and says both in `--help`."""
    env = os.environ if env is None else env
    group = parser.add_argument_group("settings (flag > environment variable > default)")
    for option in OPTIONS:
        default = _env_default(option, env)
        shown = "none" if default is None else default
        group.add_argument(option.flag, dest=option.name, type=argparse_type(option.parse, option.name),
                           default=default, choices=option.choices, metavar=option.metavar,
                           help=f"{option.help} (${option.env}; default {shown})")
    group.add_argument("--no-engines", dest="start_engines", action="store_false",
                       help="do not start local engines; expect them on their base ports")


def from_args(args: argparse.Namespace, policy_path: Path) -> Settings:
    """The `Settings` of parsed `add_arguments` flags (the admin key comes from $CASCADE_ADMIN_KEY only: a
    secret does not belong on a command line)."""
    values = {option.name: getattr(args, option.name) for option in OPTIONS}
    values["home"] = Path(values["home"]).expanduser().resolve()
    return Settings(policy_path=policy_path, start_engines=args.start_engines, **values)
