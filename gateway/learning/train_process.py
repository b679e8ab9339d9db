"""One router training in a child process: `cascade router train --from-ledger`, niced, with a deadline.

The gateway never trains in its own process (embedding thousands of prompts and fitting is CPU work for
minutes). `TrainerProcess.run` starts ``nice -n 10 timeout -k 30 <deadline> python -m gateway router train
--from-ledger --redis-prefix P --held-back H [--embedder E]`` in a session of its own, logs every line the
training prints (logger `cascade.retrain`, each line prefixed ``retrain:``) and reads the outcome from its
exit code (`router_models.training.exit_codes`, the contract of `router_models.training.pipeline.run_training`):

- ``promoted``: exit 0: the candidate is the store's current artifact now (its version from the report line
  ``promoted as version V``);
- ``not_better``: exit `NOT_BETTER` (3): the candidate was not better on the held-back labels, not promoted;
- ``failed``: any other exit (1 a crash, 2 a refused input such as a bad label row, 124/137 the deadline).

The printed lines never decide the outcome (a failure may print anything); they only fill in its detail.
The verdict line (``candidate APGR X vs current Y (+D) on N held-back labels of your traffic``) is kept
whatever the outcome: it says by how much. The deadline is enforced by coreutils `timeout` around the
training, so a child outlives neither its deadline nor, by more than that, a gateway killed meanwhile; a
gateway that shuts down stops it at once (SIGTERM to its process group, SIGKILL 10 s later).
The Redis URL reaches the child in `CASCADE_REDIS_URL`, not on its command line, where `ps` would show a
password. Everything else of the gateway's environment is inherited: `CASCADE_HOME` (so the child promotes into
the store this gateway watches), `CASCADE_ROUTING_DATA` (the public outcomes it trains on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from policies.learning import Retrain
from router_models.training.exit_codes import NOT_BETTER

__all__ = ["NICENESS", "CommandFactory", "Outcome", "TrainResult", "Trainer", "TrainerProcess", "train_command"]

log = logging.getLogger("cascade.retrain")

Outcome = Literal["promoted", "not_better", "skipped", "failed"]
NICENESS = 10  # below every request-serving thread: a training shares the machine with the gateway
_KILL_AFTER_S = 30  # `timeout -k`: SIGKILL this long after the deadline's SIGTERM
_VERDICT = re.compile(r"candidate APGR .* \(([+-]\d+\.\d+)\) on .*")
_PROMOTED = re.compile(r"promoted as version (\S+)")
_TAIL = 5  # lines of a failed training's output kept in its result


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What one look at the labels came to. `detail`: one line, the verdict (by how much) or why not;
    `version`: the promoted version; `apgr_delta`: candidate minus current APGR, when a comparison ran."""

    outcome: Outcome
    detail: str
    version: str | None = None
    apgr_delta: float | None = None


class Trainer(Protocol):
    async def run(self, retrain: Retrain) -> TrainResult:
        """Train a candidate as `retrain` says and promote it if better; never raises for a failed training
        (outcome ``failed``)."""
        ...


CommandFactory = Callable[[Retrain, str], list[str]]
"""(policy section, ledger key prefix) -> argv of the training, without nice and timeout (tests pass smaller ones)."""


def train_command(retrain: Retrain, redis_prefix: str) -> list[str]:
    """`cascade router train --from-ledger` for `retrain`, as this interpreter runs it."""
    argv = [sys.executable, "-m", "gateway", "router", "train", "--from-ledger", "--redis-prefix", redis_prefix,
            "--held-back", f"{retrain.held_back:g}"]
    return argv + (["--embedder", retrain.embedder] if retrain.embedder else [])


class TrainerProcess:
    """Runs one training at a time as a child process (module docstring); owns the child while it runs."""

    def __init__(self, redis_url: str, redis_prefix: str, command: CommandFactory = train_command) -> None:
        self._redis_url = redis_url
        self._prefix = redis_prefix
        self._command = command

    def _argv(self, retrain: Retrain) -> list[str]:
        deadline = f"{retrain.timeout_minutes * 60}s"
        return ["nice", "-n", str(NICENESS), "timeout", "-k", f"{_KILL_AFTER_S}s", deadline,
                *self._command(retrain, self._prefix)]

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CASCADE_REDIS_URL": self._redis_url}
        env.pop("CASCADE_ROUTER_ARTIFACT", None)  # the child compares with, and promotes into, the store
        return env

    async def run(self, retrain: Retrain) -> TrainResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(retrain), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=self._env(), start_new_session=True, limit=1 << 20)
        except OSError as exc:
            return TrainResult("failed", f"the training could not start: {exc}")
        log.info("retrain: training started (pid %d, deadline %d min)", proc.pid, retrain.timeout_minutes)
        try:
            lines = await _relay(proc)
            code = await proc.wait()
        finally:
            await _stop(proc)
        return _result(code, lines, retrain.timeout_minutes)


async def _relay(proc: asyncio.subprocess.Process) -> list[str]:
    """Log the child's output line by line until it closes it; returns the lines."""
    assert proc.stdout is not None
    lines: list[str] = []
    while raw := await proc.stdout.readline():
        line = raw.decode("utf-8", "replace").rstrip().rsplit("\r", 1)[-1]  # a progress bar: its last state
        lines.append(line)
        log.info("retrain: %s", line)
    return lines


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End the child's process group if it still runs (the gateway is shutting down): SIGTERM, then SIGKILL."""
    if proc.returncode is not None:
        return
    try:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            _signal(proc, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), wait_s)
                return
    except asyncio.CancelledError:  # asked again to stop while waiting: no more patience
        _signal(proc, signal.SIGKILL)
        raise
    log.error("retrain: training pid %d did not stop", proc.pid)


def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _result(code: int, lines: list[str], timeout_minutes: int) -> TrainResult:
    """The outcome from the exit code (module docstring); the report lines give only version, verdict and delta."""
    verdict = next((line.removeprefix("[train] ") for line in reversed(lines) if _VERDICT.search(line)), None)
    delta = float(match[1]) if verdict and (match := _VERDICT.search(verdict)) else None
    if code == 0:
        version = next((m[1] for line in lines if (m := _PROMOTED.search(line))), None)
        detail = verdict or (f"promoted as version {version}" if version else "promoted (no version reported)")
        return TrainResult("promoted", detail, version, delta)
    if code == NOT_BETTER:
        return TrainResult("not_better", verdict or "not better than the current artifact", None, delta)
    if code in (124, 137):  # `timeout`: the deadline's SIGTERM, or its SIGKILL
        return TrainResult("failed", f"stopped after {timeout_minutes} min (learning.retrain.timeout_minutes)")
    tail = " | ".join(lines[-_TAIL:]) or "no output"
    return TrainResult("failed", f"the training exited with {code}: {tail}", None, delta)
