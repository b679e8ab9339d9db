"""The training child process: its outcome read from its exit code (the report lines only fill in the detail), its
output logged line by line, niced, stopped at its deadline and when the gateway shuts down. The commands here are
small Python scripts standing in for `cascade router train` (the real one runs in test_retrain_run.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from gateway.learning.train_process import NICENESS, TrainerProcess, train_command
from policies.learning import Retrain
from router_models.training.exit_codes import NOT_BETTER
from tests.servers import alive

RETRAIN = Retrain(every_hours=24, min_new_labels=10, held_back=0.3)
VERDICT = "[train] candidate APGR 0.6123 vs current 0.5000 (+0.1123) on 18 held-back labels of your traffic"


def _script(body: str) -> TrainerProcess:
    """A trainer whose child runs `body` (Python) instead of the training."""
    return TrainerProcess("redis://127.0.0.1:6379/5", "p:", lambda retrain, prefix: [sys.executable, "-c", body])


async def test_a_promotion_is_read_from_exit_code_and_report_with_its_verdict(
        caplog: pytest.LogCaptureFixture) -> None:
    body = f"print('[train] 40 labelled requests'); print({VERDICT!r}); " \
           "print('[train] promoted as version 20261202T2000-abc (running gateways swap to it)')"
    with caplog.at_level(logging.INFO, logger="cascade.retrain"):
        result = await _script(body).run(RETRAIN)
    assert (result.outcome, result.version, result.apgr_delta) == ("promoted", "20261202T2000-abc", 0.1123)
    assert result.detail == VERDICT.removeprefix("[train] ")
    logged = [r.getMessage() for r in caplog.records]
    assert "retrain: [train] 40 labelled requests" in logged and f"retrain: {VERDICT}" in logged


async def test_not_better_and_failures_are_told_apart_by_exit_code() -> None:
    assert NOT_BETTER not in (0, 1, 2)  # not success, not a crash, not argparse's or the CLI's refusal
    worse = VERDICT.replace("(+0.1123)", "(-0.0420)")
    report = "[train] not promoted (not better than the current artifact); candidate kept at /x"
    body = f"import sys; print({worse!r}); print({report!r}); sys.exit({NOT_BETTER})"
    result = await _script(body).run(RETRAIN)
    assert (result.outcome, result.apgr_delta) == ("not_better", -0.042)
    assert "(-0.0420)" in result.detail
    # a failure that happens to print the not-better report (and a verdict) is still a failure: exit 1
    misleading = await _script(f"import sys; print({worse!r}); print({report!r}); sys.exit('Traceback: boom')"
                               ).run(RETRAIN)
    assert misleading.outcome == "failed" and "exited with 1" in misleading.detail
    assert "Traceback: boom" in misleading.detail and misleading.apgr_delta == -0.042
    # exit 3 is a verdict even without any report line to read
    silent = await _script(f"import sys; sys.exit({NOT_BETTER})").run(RETRAIN)
    assert (silent.outcome, silent.detail, silent.apgr_delta) == (
        "not_better", "not better than the current artifact", None)
    crashed = await _script("import sys; print('loading'); sys.exit(\"Traceback: boom\")").run(RETRAIN)
    assert crashed.outcome == "failed" and "exited with 1" in crashed.detail and "Traceback: boom" in crashed.detail
    bad_labels = await _script("import sys; print('error: ledger row 3: field needs_flagship', file=sys.stderr); "
                               "sys.exit(2)").run(RETRAIN)
    assert bad_labels.outcome == "failed" and "exited with 2" in bad_labels.detail
    assert "ledger row 3" in bad_labels.detail


async def test_the_child_is_niced_gets_the_redis_url_in_its_environment_and_not_the_artifact_override(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_ROUTER_ARTIFACT", "/pinned.json")
    body = "import os, sys; print('nice', os.nice(0)); print('url', os.environ['CASCADE_REDIS_URL']); " \
           "print('pinned', os.environ.get('CASCADE_ROUTER_ARTIFACT')); sys.exit(5)"
    trainer = _script(body)
    assert trainer._argv(RETRAIN)[:7] == ["nice", "-n", str(NICENESS), "timeout", "-k", "30s", "3600s"]
    result = await trainer.run(RETRAIN)
    assert f"nice {min(19, os.nice(0) + NICENESS)}" in result.detail  # 19: the lowest priority
    assert "url redis://127.0.0.1:6379/5" in result.detail and "pinned None" in result.detail
    argv = train_command(Retrain(held_back=0.25, embedder="all-MiniLM-L6-v2:static"), "tenant-a:")
    assert argv[1:] == ["-m", "gateway", "router", "train", "--from-ledger", "--redis-prefix", "tenant-a:",
                        "--held-back", "0.25", "--embedder", "all-MiniLM-L6-v2:static"]
    assert not any("redis://" in arg for arg in argv)  # a password in the URL would show in `ps`


async def test_a_training_past_its_deadline_is_stopped_and_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _script("import time; print('embedding', flush=True); time.sleep(60)")
    monkeypatch.setattr(trainer, "_argv", lambda retrain: ["timeout", "1s", *trainer._command(retrain, "p:")])
    result = await asyncio.wait_for(trainer.run(RETRAIN), 20)
    assert result.outcome == "failed" and "stopped after 60 min" in result.detail


async def test_a_gateway_shutting_down_stops_its_training_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    body = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    task = asyncio.create_task(_script(body).run(RETRAIN))
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not alive(child) or _zombie(child):
            break
        await asyncio.sleep(0.05)
    assert not alive(child) or _zombie(child)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return False
