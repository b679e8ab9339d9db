"""The learning-curve benchmark end to end on a few real rows of two sources (one exam-style, one chat): it runs,
covers both and every method, prints its tables and writes its JSON. The figures of so small a run mean nothing;
the full run is in BENCHMARKS.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.studies.learning_curve import main
from router_models.training.outcomes import DEFAULT_ROUTING_DIR

pytestmark = pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                                reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR}")


SOURCES = ("routellm-gsm8k", "rmb-helpfulness")


def test_a_small_curve_covers_every_source_and_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "curve.json"
    assert main(["--sources", ",".join(SOURCES), "--max-per-source", "160", "--sizes", "0,100", "--min-rest", "50",
                 "--draws", "1", "--ks", "1000", "--penalties", "1000", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    methods = {"equal", "share k=1000", "correction penalty=1000", "own-only"}
    assert set(doc["summary"]) == methods
    assert {p["source"] for p in doc["points"]} == set(SOURCES)
    assert {(p["method"], p["n"]) for p in doc["points"]} == {(m, n) for m in methods for n in (0, 100)}
    assert all(p["test"] == 60 for p in doc["points"])
    printed = capsys.readouterr().out
    assert "mean over sources" in printed and "rmb-helpfulness:" in printed


def test_memories_read_every_field_and_default_the_rest() -> None:
    from loadtest.studies.learning_curve import _memories
    from router_models.serving.label_memory import MemoryParams

    assert _memories("100:0.1:0.3") == (MemoryParams(100, 0.1, 0.3),)
    before, served = _memories("100:0.1:0.3:0.3:slope:1:0,50:0.2:1:0:level:0.5:0.3")
    assert (before.slope_scale, before.shrink, before.slope) == (1.0, 0.0, True)
    assert served == MemoryParams(50, 0.2, 1.0, 0.0, False, 0.5, 0.3)
    with pytest.raises(ValueError, match="slope_scale"):
        _memories("100:0.1:0.3:0.3:steep")
    (combined,) = _memories("100:0.1:0.3:0.3:slope:0.5:0.3:30:200/1.5/0.2")
    assert (combined.sources, combined.early_labels, combined.early_shrink, combined.early_bandwidth) == (
        30.0, 200, 1.5, 0.2)
    (plain,) = _memories("100:0.1:0.3:0.3:slope:0.5:0.3:0:0")
    assert (plain.sources, plain.early_labels) == (0.0, 0)
    with pytest.raises(ValueError, match="labels/shrink/bandwidth"):
        _memories("100:0.1:0.3:0.3:slope:0.5:0.3:30:200/1.5")
