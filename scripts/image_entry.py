#!/opt/cascade/bin/python
"""The container image's entry point (`cascade-image`, deploy/Dockerfile): one role per container.

    cascade-image gateway [--engine POOL=URL ...] [--policy FILE] [--port 8080] [-- SERVE_ARGS...]
    cascade-image engine POOL [--policy FILE] [--port 8000]
    cascade-image health [--port 8080] [--path /readyz]
    cascade-image cascade ARGS...            (any `cascade` command, e.g. `cascade-image cascade costs report`)

`gateway` checks Redis once (`CASCADE_REDIS_URL`) and, when it does not answer, logs one line saying so and
that /readyz stays 503 until it does; then it becomes `cascade serve` on 0.0.0.0. Without `--engine` the
policy's local engines run inside this container (the supervisor starts them); each `--engine POOL=URL`
turns local pool POOL into a remote pool on that engine, as `cascade deploy render` does for Kubernetes.
`engine` becomes the vLLM server of one local pool of the policy, with exactly the arguments and variables
the supervisor would use (`backends.engines.args.engine_command` / `engine_env`), listening on 0.0.0.0.
`health` exits 0 when the gateway's /readyz (an engine's /health, with --path) answers 200: the image's
HEALTHCHECK (the image has no curl).
Every role replaces this process (exec), so signals reach the server directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = ["main", "redis_problem", "remote_policy"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _log(level: str, msg: str, **fields: object) -> None:
    """One JSON line on stderr, in the gateway's own log format."""
    record = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
              "level": level, "logger": "cascade.image", "msg": msg, **fields}
    print(json.dumps(record, separators=(",", ":")), file=sys.stderr, flush=True)


def _default_policy() -> Path:
    return Path(str(files("policies").joinpath("default.yaml")))


def redacted(url: str) -> str:
    """A Redis URL without its credentials: scheme://host:port/db."""
    parts = urlparse(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


def redis_problem(url: str, timeout_s: float = 2.0) -> str | None:
    """None when Redis at `url` answers PING within `timeout_s`, else why not, in one line."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def remote_policy(raw: dict[str, Any], engines: dict[str, str]) -> dict[str, Any]:
    """The policy `raw` with each local pool named in `engines` ({pool: base URL}) turned into a remote pool
    on that URL (`policies.pools.as_remote_pool`). Raises ValueError for a name that is not a local pool of
    the policy."""
    from policies.pools import as_remote_pool

    pools = dict(raw["pools"])
    for name, url in engines.items():
        old = pools.get(name)
        if not isinstance(old, dict) or old.get("type") != "local":
            raise ValueError(f"--engine {name}=...: the policy has no local pool {name!r}")
        pools[name] = as_remote_pool(old, [url])
    return {**raw, "pools": pools}


def _engine_pairs(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise SystemExit(f"error: --engine wants POOL=http://HOST:PORT, got {item!r}")
        pairs[name] = url.rstrip("/")
    return pairs


def _gateway(args: argparse.Namespace) -> int:
    import yaml

    url = os.environ.get("CASCADE_REDIS_URL", DEFAULT_REDIS_URL)
    problem = redis_problem(url)
    if problem:
        _log("error", f"Redis is not reachable at {redacted(url)} ({problem}); the gateway starts but /readyz "
             "stays 503 until Redis answers: check CASCADE_REDIS_URL and that Redis runs",
             redis=redacted(url))
    policy = Path(args.policy)
    if args.engine:
        raw = yaml.safe_load(policy.read_text(encoding="utf-8"))
        try:
            rendered = remote_policy(raw, _engine_pairs(args.engine))
        except ValueError as exc:
            _log("error", str(exc))
            return 2
        policy = Path(os.environ.get("CASCADE_HOME", "/var/lib/cascade")) / "run" / "policy.yaml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(yaml.safe_dump(rendered, sort_keys=False), encoding="utf-8")
    serve = ["cascade", "serve", "--host", "0.0.0.0", "--port", str(args.port), "--policy", str(policy),
             *args.serve_args]
    os.execvp(serve[0], serve)


def _engine(args: argparse.Namespace) -> int:
    from backends.engines.args import DEMO_PREFIX, engine_command, engine_env
    from backends.models.demo import ensure_demo_models, models_root
    from policies.loader import PolicyError, load_policy
    from policies.pools import LocalPool

    try:
        pool = load_policy(Path(args.policy)).policy.pools.get(args.pool)
    except PolicyError as exc:
        _log("error", str(exc))
        return 2
    if not isinstance(pool, LocalPool):
        _log("error", f"the policy {args.policy} has no local pool {args.pool!r}")
        return 2
    if pool.engine.model.startswith(DEMO_PREFIX):
        ensure_demo_models(models_root())  # baked into the image: verified against their manifests here
    argv = engine_command(pool.engine, args.port, models_root())
    argv[argv.index("--host") + 1] = "0.0.0.0"  # a container listens on its own interface
    _log("info", f"starting the {args.pool} engine on 0.0.0.0:{args.port}", argv=argv[1:])
    os.execve(argv[0], argv, os.environ | engine_env(pool.engine))


def _health(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{args.port}{args.path}", timeout=4) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cascade-image", description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="role", required=True)
    gw = sub.add_parser("gateway", help="cascade serve on 0.0.0.0, local pools optionally on remote engines")
    gw.add_argument("--policy", default=str(_default_policy()))
    gw.add_argument("--port", type=int, default=8080)
    gw.add_argument("--engine", action="append", default=[], metavar="POOL=URL")
    gw.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: more `cascade serve` arguments")
    gw.set_defaults(func=_gateway)
    en = sub.add_parser("engine", help="the vLLM engine of one local pool, on 0.0.0.0")
    en.add_argument("pool")
    en.add_argument("--policy", default=str(_default_policy()))
    en.add_argument("--port", type=int, default=8000)
    en.set_defaults(func=_engine)
    he = sub.add_parser("health", help="exit 0 when /readyz (or --path) answers 200")
    he.add_argument("--port", type=int, default=8080)
    he.add_argument("--path", default="/readyz", help="/health for an engine")
    he.set_defaults(func=_health)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cascade"]:
        os.execvp("cascade", argv)
    args = _parser().parse_args(argv)
    if getattr(args, "serve_args", None) and args.serve_args[0] == "--":
        args.serve_args = args.serve_args[1:]
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
