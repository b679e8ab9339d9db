"""`cascade router calibrate` on a generated request log (a fixture of scores and tokens, not training data)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gateway.cli.main import main
from policies.loader import load_policy
from tests.conftest import policy_yaml

CURVE = {"flagship_share": [i / 20 for i in range(21)], "pgr": [min(1.0, 1.6 * i / 20) for i in range(21)],
         "basis": "leave-one-source-out eval"}


def _log(path: Path, n: int = 400, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    scores = [round(rng.random(), 4) for _ in range(n)]
    with path.open("w") as fh:
        for s in scores:
            fh.write(json.dumps({"request": {"model": "auto", "messages": [{"role": "user", "content": "q"}]},
                                 "tenant": "t", "score": s, "pool": "micro", "prompt_tokens": 1000,
                                 "completion_tokens": 100}) + "\n")
    return scores


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    policy = tmp_path / "policy.yaml"
    text = policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    policy.write_text(text.replace("  threshold: 0.5\n", "  # tuned on our traffic\n  threshold: 0.5  # keep\n"))
    artifact = tmp_path / "router.json"
    artifact.write_text(json.dumps({"quality_curve": CURVE}))
    return policy, tmp_path / "requests.jsonl", artifact


def test_share_target_prints_threshold_share_cost_and_quality(
        files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, log, artifact = files
    scores = _log(log)
    code = main(["router", "calibrate", "--log", str(log), "--policy", str(policy), "--flagship-share", "0.3",
                 "--artifact", str(artifact)])
    out = capsys.readouterr().out
    assert code == 0, out
    threshold = float(out.split("threshold: ")[1].split()[0])
    assert sum(s >= threshold for s in scores) == 120  # 30% of 400
    assert "flagship share: 30.0% (120 of 400)" in out
    # micro 1000*0.20 + 100*0.20 = 220 micro-USD; flagship 3000 + 1500 = 4500 micro-USD per request
    per_1k = (280 * 220 + 120 * 4500) * 1000 // 400
    assert f"cost per 1k requests: {per_1k // 10**6}.{per_1k % 10**6:06d} USD" in out
    assert "all micro 0.220000, all flagship 4.500000" in out
    assert "quality kept: ~0.48 of the micro->flagship gap (leave-one-source-out eval" in out
    assert f"threshold: {out.split('threshold: ')[1].split()[0]}" in out.splitlines()[-1]


def test_cost_target_and_write_edits_only_the_threshold_line(
        files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, log, artifact = files
    scores = _log(log)
    before = policy.read_text()
    code = main(["router", "calibrate", "--log", str(log), "--policy", str(policy), "--cost-per-1k", "1.50",
                 "--artifact", str(artifact), "--write"])
    out = capsys.readouterr().out
    assert code == 0, out
    threshold = load_policy(policy).policy.routing.threshold
    assert isinstance(threshold, float)
    flagship = sum(s >= threshold for s in scores)
    assert (400 - flagship) * 220 + flagship * 4500 <= 1.5 * 400 * 1000  # within the target ...
    assert (399 - flagship) * 220 + (flagship + 1) * 4500 > 1.5 * 400 * 1000  # ... and one more would not be
    changed = [(a, b) for a, b in zip(before.splitlines(), policy.read_text().splitlines(), strict=True) if a != b]
    assert changed == [("  threshold: 0.5  # keep", f"  threshold: {threshold:g}  # keep")]


def test_bad_lines_are_named_and_skipped(files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy, log, artifact = files
    _log(log, n=50)
    with log.open("a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"request": {"model": "auto"}, "score": None, "prompt_tokens": 1,
                             "completion_tokens": 1}) + "\n")
        fh.write(json.dumps({"request": {"model": "micro"}, "score": 0.2, "prompt_tokens": 1,
                             "completion_tokens": 1}) + "\n")
        fh.write(json.dumps({"request": {"model": "auto"}, "score": 0.2, "prompt_tokens": -1,
                             "completion_tokens": 1}) + "\n")
    artifact.write_text("{}")
    code = main(["router", "calibrate", "--log", str(log), "--policy", str(policy), "--flagship-share", "0.5",
                 "--artifact", str(artifact)])
    captured = capsys.readouterr()
    assert code == 0
    assert f"skipped {log}:51: " in captured.err and f"skipped {log}:54: `prompt_tokens`" in captured.err
    assert "skipped: 2 bad lines, 1 without a score, 1 not model auto" in captured.out
    assert "quality kept: estimate unavailable (artifact has no evaluation curve)" in captured.out


def test_unusable_input_exits_with_a_message(files: tuple[Path, Path, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    policy, log, _ = files
    args = ["router", "calibrate", "--policy", str(policy)]
    assert main([*args, "--log", str(log), "--flagship-share", "0.3"]) == 2
    assert "cannot read the log" in capsys.readouterr().err
    log.write_text("garbage\n" + json.dumps({"request": {}, "score": None, "prompt_tokens": 1,
                                             "completion_tokens": 1}) + "\n")
    assert main([*args, "--log", str(log), "--flagship-share", "0.3"]) == 2
    assert "no scored `model: auto` requests" in capsys.readouterr().err
    _log(log, n=20)
    assert main([*args, "--log", str(log), "--cost-per-1k", "0.10"]) == 1  # below the all-micro 0.22
    assert "below the cheapest threshold's cost" in capsys.readouterr().err
    assert main([*args, "--log", str(log), "--cost-per-1k", "abc"]) == 1
    assert "not a price in USD" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--log", str(log), "--flagship-share", "1.5"])
    assert "must be within [0, 1]" in capsys.readouterr().err
