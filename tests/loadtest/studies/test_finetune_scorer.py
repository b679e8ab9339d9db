"""The fine-tuning benchmark: its folds keep every copy of a held-out prompt out of both training halves, and a
tiny run on the real outcomes (a few rows, two steps) prints its table and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.studies.finetune_loso import fold_rows
from loadtest.studies.finetune_loso import main as loso_main
from loadtest.studies.finetune_scorer import main, split
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, Example


def _ex(source: str, key: str, i: int) -> Example:
    return Example(f"{source} prompt {i} ({key})", source, "g", 0.5, 0.5, key)


def test_split_keeps_held_out_keys_out_and_the_halves_apart() -> None:
    rows = [_ex("held", f"h{i}", i) for i in range(10)]
    rows += [_ex("big", f"b{i}", i) for i in range(40)] + [_ex("big", f"h{i}", 100 + i) for i in range(5)]
    rows += [_ex("small", f"s{i % 6}", i) for i in range(12)]  # each key twice: halves must not share one
    tune, ridge, test = split(rows, "held", tune_n=10, ridge_n=20, seed=1)
    assert [ex.source for ex in test] == ["held"] * 10
    held_keys = {ex.key for ex in test}
    assert not held_keys & {ex.key for ex in tune + ridge}
    assert not {ex.key for ex in tune} & {ex.key for ex in ridge}
    assert sum(ex.source == "big" for ex in tune) == 10 and sum(ex.source == "big" for ex in ridge) == 20
    assert sum(ex.source == "small" for ex in tune) == 4  # short of 30 rows: a third to tuning, like 10:20
    assert split(rows, "held", 10, 20, seed=1) == (tune, ridge, test)  # seeded
    assert split(rows, "held", 10, 20, seed=2)[0] != tune


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
def test_a_tiny_run_reports_every_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "finetune.json"
    main(["--held-out", "routellm-gsm8k", "--max-per-source", "24", "--tune-per-source", "8",
          "--ridge-per-source", "12", "--max-steps", "2", "--batch-size", "4", "--json", str(out)])
    (fold,) = json.loads(out.read_text())["folds"]
    assert fold["held_out"] == "routellm-gsm8k" and fold["n"] == 24 and fold["steps"] == 2
    for column in ("frozen", "frozen_both_halves", "tuned", "tuned_head"):
        assert 0.0 < fold[column]["auc"] < 1.0
    assert "mean APGR" in capsys.readouterr().out


def test_loso_folds_keep_held_out_and_validation_prompts_out_of_tuning() -> None:
    rows = [_ex("a-held", f"h{i}", i) for i in range(10)]
    rows += [_ex("b-inner", f"v{i}", i) for i in range(10)]
    rows += [_ex("c-big", f"c{i}", i) for i in range(40)] + [_ex("c-big", f"h{i}", 100 + i) for i in range(3)]
    rows += [_ex("c-big", f"v{i}", 200 + i) for i in range(4)]  # copies of validation prompts
    train, tune, valid, test, inner = fold_rows(rows, "a-held", tune_n=30, valid_n=6, seed=1)
    assert inner == "b-inner" and len(valid) == 6 and {ex.source for ex in valid} == {"b-inner"}
    assert [ex.source for ex in test] == ["a-held"] * 10
    assert not {ex.key for ex in test} & {ex.key for ex in train}
    assert not {ex.key for ex in valid} & {ex.key for ex in tune}
    assert len(tune) == 30 and {ex.source for ex in tune} == {"c-big"}
    assert len(train) == 10 + 40 + 4  # every other row, validation copies included, ridge on them all
    assert fold_rows(rows, "a-held", 30, 6, seed=1)[1] == tune


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
def test_a_tiny_loso_run_reports_every_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "loso.json"
    loso_main(["--held-out", "routerbench", "--max-per-source", "24", "--tune-per-source", "8",
               "--valid-rows", "12", "--epochs", "2", "--batch-size", "4", "--json", str(out)])
    (fold,) = json.loads(out.read_text())["folds"]
    assert fold["held_out"] == "routerbench" and fold["inner"] == "zeroeval"
    assert fold["tune_rows"] == 5 * 8 and fold["steps"] == 2 * 10  # 7 sources less held-out and inner
    assert len(fold["inner_apgr_by_epoch"]) == 2 and fold["best_epoch"] in (1, 2)
    for column in ("frozen", "tuned", "tuned_head"):
        assert 0.0 < fold[column]["auc"] < 1.0
    assert "mean APGR" in capsys.readouterr().out
