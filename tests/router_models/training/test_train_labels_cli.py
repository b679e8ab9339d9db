"""`cascade router train --labels`: the label files are read and checked before anything is loaded or fitted; a bad
row exits 2 with one line naming the file, the line and the field (no traceback), and contradicting labels are
counted and one pair shown. The label rows are written here: they test the checks, never what labels buy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from gateway.cli.main import main
from router_models.training.ledger_labels import LabelKeys
from tests.conftest import SHARED_URL

ROOT = Path(__file__).resolve().parents[3]


def _labels(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_bad_score_exits_2_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    bad = _labels(tmp_path / "bad.jsonl", [{"prompt": "Say hello.", "needs_flagship": 0},
                                           {"prompt": "Say goodbye.", "needs_flagship": float("nan")}])
    env = {**os.environ, "CASCADE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "gateway", "router", "train", "--labels", str(bad),
                           "--routing-dir", str(tmp_path / "no-outcomes-here")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr == f"error: {bad}:2: field 'needs_flagship' must be a number in [0, 1], got nan\n"
    assert not (tmp_path / "home" / "router").exists()  # nothing trained, nothing promoted


def test_contradicting_labels_are_counted_before_the_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    labels = _labels(tmp_path / "l.jsonl", [{"id": "r1", "prompt": "Translate this.", "needs_flagship": 0},
                                            {"prompt": "Say hello.", "needs_flagship": 1},
                                            {"id": "r1", "prompt": "Translate this, please.", "micro": 0.0,
                                             "flagship": 1.0}])
    code = main(["router", "train", "--labels", str(labels), "--routing-dir", str(tmp_path / "no-outcomes-here")])
    out, err = capsys.readouterr()
    assert (f"[train] 1 prompts with contradicting labels (targets at least 0.5 apart), e.g. {labels}:1 (target "
            f"0.5) against {labels}:3 (target 1)") in out.splitlines()
    assert code == 2 and "no-outcomes-here" in err  # then the missing outcomes stop it: nothing was fitted


@pytest.mark.redis
def test_check_ids_refuses_a_request_the_ledger_did_not_keep(tmp_path: Path, prefix: str,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    client = redis.Redis.from_url(SHARED_URL)
    try:
        client.hset(LabelKeys(prefix).prompt("req-1"), mapping={"text": "Say hello.", "tenant": "acme"})
    finally:
        client.close()
    labels = _labels(tmp_path / "l.jsonl", [{"id": "req-1", "prompt": "Say hello.", "needs_flagship": 0},
                                            {"id": "req-2", "prompt": "Say goodbye.", "needs_flagship": 1}])
    code = main(["router", "train", "--labels", str(labels), "--check-ids", "--redis-url", SHARED_URL,
                 "--redis-prefix", prefix, "--routing-dir", str(tmp_path / "no-outcomes-here")])
    assert code == 2
    assert capsys.readouterr().err == (f"error: {labels}:2: field 'id': no request 'req-2' is on record in the ledger "
                                       "(unknown or expired id; use the x-request-id of a kept request)\n")
