"""What a policy needs from the machine it runs on, checked there.

Parsing a policy reads no file but the policy (`policies.loader`). Three things depend on the machine: whether
a quantized pool's measured loss (`cascade-quant.json` in its checkpoint) fits the pool's `max_quant_loss`,
whether the PEM files a remote pool's `connection` names (CA bundle, client certificate) are usable, and whether
a pool's draft model shares its model's vocabulary (`backends.engines.draft_check`).
They are checked where the gateway runs: by the pool set before it starts or reloads pools, by `cascade
serve` at start-up and by `cascade policy validate`, each with the policy's file:line.
"""

from __future__ import annotations

from backends.clients.connection import ConnectionSettings, ConnectionSettingsError, ssl_context
from backends.engines.draft_check import draft_problems
from backends.quantization.metadata import ceiling_problems, checkpoint_dir, read_figures, read_metadata
from policies.loader import LoadedPolicy, PolicyError
from policies.schema import LocalPool, Policy, RemotePool

__all__ = ["checked_here", "connection_settings", "machine_problems", "quant_lines"]


def machine_problems(loaded: LoadedPolicy) -> list[str]:
    """One `file:line: pools.NAME...: ...` line per problem: a ceiling that a checkpoint here breaks (a
    checkpoint not built yet is not judged: its engine cannot start anyway), or a connection file that
    cannot be used."""
    problems = []
    for name, pool in loaded.policy.pools.items():
        if isinstance(pool, RemotePool):
            try:
                ssl_context(connection_settings(pool))
            except ConnectionSettingsError as exc:
                problems.append(loaded.at(("pools", name, "connection"), str(exc)))
        else:
            problems += [loaded.at(("pools", name, "engine", "speculative"), p) for p in draft_problems(pool.engine)]
            if pool.max_quant_loss is not None:
                for problem in ceiling_problems(pool.engine.model, **pool.max_quant_loss.model_dump()):
                    problems.append(loaded.at(("pools", name, "max_quant_loss"), problem))
    return problems


def connection_settings(pool: RemotePool) -> ConnectionSettings:
    """The client settings of a remote pool's `connection` block."""
    return ConnectionSettings(**pool.connection.model_dump())


def checked_here(loaded: LoadedPolicy) -> LoadedPolicy:
    """`loaded`, once its pools are known to run on this machine as written; else raises `PolicyError` listing
    every `machine_problems` line."""
    problems = machine_problems(loaded)
    if problems:
        raise PolicyError(loaded.source, problems)
    return loaded


def _ceiling_text(pool: LocalPool) -> str:
    ceiling = pool.max_quant_loss
    if ceiling is None:
        return "no ceiling in the policy"
    parts = [f"{name} {value:g}" for name, value in ceiling.model_dump().items() if value is not None]
    return f"ceiling {', '.join(parts) or 'empty'}: within"  # pools over their ceiling do not start


def quant_lines(policy: Policy) -> list[str]:
    """Measured quantization loss of each local pool serving a `cascade quantize` checkpoint (reads each
    checkpoint's cascade-quant.json; pools without one are not listed)."""
    lines = []
    for name, pool in policy.pools.items():
        path = checkpoint_dir(pool.engine.model) if isinstance(pool, LocalPool) else None
        if path is None or read_metadata(path) is None:
            continue
        figures = read_figures(path)
        shown = figures.summary() if figures else "not evaluated (run `cascade quantize --evaluate`)"
        assert isinstance(pool, LocalPool)
        lines.append(f"  {name}: {shown}; {_ceiling_text(pool)}")
    return ["quantized pools:", *lines] if lines else []
