"""`cascade router eval` run for real on a small slice of the outcomes (30 prompts per source, a few seconds):
it prints the leave-one-source-out table, writes eval.json and the curve PNG, and the figures it writes are
the ones a leave-one-source-out fit on the same slice gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.cli.main import main
from router_models.embedders.factory import make_embedder
from router_models.serving.artifact import DEFAULT_ARTIFACT, load_artifact
from router_models.training.loso import leave_one_source_out
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes
from router_models.training.trainer import TrainConfig, features

pytestmark = pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(), reason=f"shared routing data not found at "
                                f"{DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")

FAST_ARTIFACT = DEFAULT_ARTIFACT.with_name("complexity-router-static.json")
PER_SOURCE = 30


@pytest.mark.slow
def test_router_eval_writes_the_table_json_and_curve_of_a_leave_one_source_out_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    code = main(["router", "eval", "--artifact", str(FAST_ARTIFACT), "--max-per-source", str(PER_SOURCE),
                 "--out-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    art = load_artifact(FAST_ARTIFACT)
    key = f"{art.metadata['target']}|{art.metadata['feature_set']}"
    report = json.loads((out / "eval.json").read_text())
    assert list(report) == [key]
    written = report[key]
    assert sorted(written["per_source"]) == sorted(art.metadata["sources"])

    examples = load_outcomes(DEFAULT_ROUTING_DIR, sources=tuple(art.metadata["sources"]), max_per_source=PER_SOURCE)
    cfg = TrainConfig(routing_dir=DEFAULT_ROUTING_DIR, target=art.metadata["target"],
                      feature_set=art.metadata["feature_set"])
    expected = leave_one_source_out(features(make_embedder(art.embedder), examples, cfg.feature_set), examples, cfg)
    # compared exactly: the command and this fit run the same code on the same inputs in one process, with the same
    # kernels, so they give the same bits on any CPU (only a comparison with figures made elsewhere needs a bound)
    assert written["per_source"] == expected.as_dict()["per_source"]
    assert written["mean"] == expected.mean()
    for key_, value in written["mean"].items():
        assert value == pytest.approx(np.nanmean([r[key_] for r in written["per_source"].values()]), abs=1e-4)
    assert written["quality_curve"]["pgr"][0] == 0.0 and written["quality_curve"]["pgr"][-1] == pytest.approx(1.0)
    exam = [row for source, row in written["per_source"].items() if source != "rmb-helpfulness"]
    exam_apgr, exam_auc = (float(np.nanmean([row[k] for row in exam])) for k in ("apgr", "auc"))
    # the mean of rows rounded to 4 decimals, against the rounded mean: 5e-5 of rounding on each side
    assert written["by_kind"]["exam"] == {"sources": 6, "apgr": pytest.approx(exam_apgr, abs=1e-4),
                                          "auc": pytest.approx(exam_auc, abs=1e-4)}
    assert written["by_kind"]["chat"]["apgr"] == written["per_source"]["rmb-helpfulness"]["apgr"]
    assert "(6 exam-style, 1 chat)" in written["quality_curve"]["basis"]

    for source, row in written["per_source"].items():  # the printed table is the written one
        assert row["n"] == PER_SOURCE
        assert f"{source:<20}{PER_SOURCE:>11}{row['apgr']:>11.3f}" in printed
    assert (out / "curve_loso.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_source_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["router", "eval", "--sources", "routellm-mmlu,chatbot-arena"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown source chatbot-arena; known: routellm-mmlu" in err and "rmb-helpfulness" in err
