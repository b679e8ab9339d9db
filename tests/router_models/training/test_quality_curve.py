"""The artifact's quality curve: parsing, interpolation, a missing or malformed curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router_models.training.quality_curve import artifact_quality_curve, parse_quality_curve

SHARES = [i / 20 for i in range(21)]
CURVE = {"flagship_share": SHARES, "pgr": [min(1.0, 2 * s) for s in SHARES], "basis": "leave-one-source-out"}


def test_interpolates_between_points_and_clamps() -> None:
    curve = parse_quality_curve({"quality_curve": CURVE})
    assert curve is not None and curve.basis == "leave-one-source-out"
    assert curve.pgr_at(0.3) == pytest.approx(0.6)
    assert curve.pgr_at(0.325) == pytest.approx(0.65)
    assert curve.pgr_at(0.9) == pytest.approx(1.0)
    assert curve.pgr_at(-1) == pytest.approx(0.0)


def test_missing_curve_is_none() -> None:
    assert parse_quality_curve({"metrics": {}}) is None


@pytest.mark.parametrize("bad", [
    {"flagship_share": [0, 1], "pgr": [0]},
    {"flagship_share": [0.5, 0.2], "pgr": [0, 1]},
    {"flagship_share": [0, 1], "pgr": [0, "x"]},
    {"flagship_share": [0, 2], "pgr": [0, 1]},
    [1, 2],
])
def test_malformed_curve_is_an_error(bad: object) -> None:
    with pytest.raises(ValueError, match="quality_curve"):
        parse_quality_curve({"quality_curve": bad})


def test_reads_the_artifact_metadata_file(tmp_path: Path) -> None:
    meta = tmp_path / "router.json"
    meta.write_text(json.dumps({"embedder": "x", "quality_curve": CURVE}))
    curve = artifact_quality_curve(tmp_path / "router.npz")  # either file of the pair names the artifact
    assert curve is not None and curve.pgr_at(0.1) == pytest.approx(0.2)
    meta.write_text(json.dumps({"embedder": "x"}))
    assert artifact_quality_curve(meta) is None
