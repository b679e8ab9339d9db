"""The in-domain figure: similarity to the reference rises with closeness, the calibration is monotone and clamped,
the file is verified (hash, format, embedder) and an artifact without one has no figure; the shipped reference
loads beside the shipped artifact, and the real scorer keeps each primary score's figure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from router_models.serving.artifact import DEFAULT_ARTIFACT, FAST_ARTIFACT, ArtifactError
from router_models.serving.classifier_scorer import BatchingConfig, load_scorer
from router_models.serving.domain import DomainReference
from router_models.serving.domain_file import domain_path, load_domain, reference_for, save_domain
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, load_outcomes


def _reference() -> DomainReference:
    rows = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0]], np.float16)
    return DomainReference(rows, 1, (0.0, 0.5, 1.0), (0.0, 0.2, 1.0), ("a",))


def test_figure_rises_with_similarity_and_is_clamped() -> None:
    ref = _reference()
    e = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32)
    assert ref.similarity(e) == pytest.approx([1.0, 0.0, 1.0, 0.6], abs=1e-3)  # unit length is not assumed
    assert ref.in_domain(e) == pytest.approx([1.0, 0.0, 1.0, 0.36], abs=2e-3)  # 0.2 + (0.6 - 0.5) / 0.5 * 0.8
    assert ref.in_domain(np.array([-1.0, 0.0, 0.0])) == pytest.approx([0.0])  # below the first knot: 0
    with pytest.raises(ValueError, match="expected"):
        ref.similarity(np.ones((1, 4)))


def test_a_text_gets_its_lone_figure_in_a_small_batch() -> None:
    """A batch of up to `_ROW_BY_ROW` texts is compared row by row, as a lone text is: each row's similarity equals
    its own, to the bit; a larger batch (one matrix product) within float32 rounding; an empty one is empty."""
    from router_models.serving.domain import _ROW_BY_ROW

    rng = np.random.default_rng(3)
    ref = DomainReference(rng.standard_normal((300, 48)).astype(np.float16), 5, (-1.0, 1.0), (0.0, 1.0))
    e = rng.standard_normal((_ROW_BY_ROW + 3, 48)).astype(np.float32)
    alone = np.concatenate([ref.similarity(e[i : i + 1]) for i in range(len(e))])
    assert np.array_equal(ref.similarity(e[:_ROW_BY_ROW]), alone[:_ROW_BY_ROW])
    assert ref.similarity(e) == pytest.approx(alone, abs=1e-6)
    assert ref.similarity(np.zeros((0, 48), np.float32)).shape == (0,)


@pytest.mark.parametrize(("knots", "levels"), [((0.5, 0.5), (0.0, 1.0)), ((0.0, 1.0), (0.6, 0.2)),
                                               ((0.0,), (0.0,)), ((0.0, 1.0), (0.0, 1.5))])
def test_a_calibration_that_does_not_rise_is_refused(knots: tuple[float, ...], levels: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="calibration"):
        DomainReference(np.ones((2, 3), np.float16), 1, knots, levels)


def test_the_file_round_trips_and_is_verified(tmp_path: Path) -> None:
    path = save_domain(_reference(), tmp_path / "r-domain.json", "emb", {"per_source": 1})
    loaded, meta = load_domain(path, "emb")
    assert np.array_equal(loaded.rows, _reference().rows) and loaded.knots == (0.0, 0.5, 1.0)
    assert meta["per_source"] == 1 and meta["rows"] == 2
    with pytest.raises(ArtifactError, match="holds vectors of 'emb'"):
        load_domain(path, "other")
    npz = path.with_suffix(".npz")
    npz.write_bytes(npz.read_bytes()[:-3] + b"xyz")
    with pytest.raises(ArtifactError, match="sha256"):
        load_domain(path)


def test_an_artifact_without_a_reference_has_no_figure(tmp_path: Path) -> None:
    artifact = tmp_path / "versions" / "7" / "complexity-router.json"
    assert domain_path(artifact) == artifact.with_name("complexity-router-domain.json")
    assert reference_for(artifact, "an-embedder-the-shipped-one-is-not") is None
    shipped = json.loads(domain_path(DEFAULT_ARTIFACT).read_text())
    found = reference_for(artifact, shipped["embedder"])  # a retrained version on the shipped embedder
    assert found is not None and found[1]["payload_sha256"] == shipped["payload_sha256"]
    fast = json.loads(domain_path(FAST_ARTIFACT).read_text())  # one retrained on the fast artifact's embedder
    found = reference_for(artifact, fast["embedder"])
    assert found is not None and found[1]["payload_sha256"] == fast["payload_sha256"] != shipped["payload_sha256"]
    save_domain(_reference(), domain_path(artifact), "emb")
    with pytest.raises(ArtifactError, match="holds vectors of 'emb'"):  # its own, on another embedder: refused
        reference_for(artifact, shipped["embedder"])


def test_the_shipped_reference_is_calibrated_leave_one_source_out() -> None:
    reference, meta = load_domain(domain_path(DEFAULT_ARTIFACT), json.loads(DEFAULT_ARTIFACT.read_text())["embedder"])
    calibration = meta["calibration"]
    assert len(reference.sources) == 7 and reference.rows.shape == (7 * meta["per_source"], 384)
    assert reference.levels[0] == 0.0 and reference.levels[-1] == 1.0
    held = calibration["held_out"]
    # measured when built (MODEL_CARD.md, "In-domain figure"): every held-out source's mean below the in-sample one
    assert all(row["mean"] < calibration["in_sample"]["mean"] for row in held.values()), held
    assert held["rmb-helpfulness"]["mean"] == min(row["mean"] for row in held.values())


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                    reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)")
async def test_the_real_scorer_keeps_the_figure_of_each_primary_score() -> None:
    """Real prompts of the public sources (the training data's own kinds), through the shipped scorer: each gets a
    figure, the one its kept embedding gives, and as training prompts they sit high on average."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = [ex.text for ex in load_outcomes(max_per_source=8)]
    scorer = load_scorer(str(DEFAULT_ARTIFACT), config=BatchingConfig(), torch_threads=1)
    try:
        assert scorer.domain is not None
        await scorer.score(texts)
        figures = [scorer.in_domain(t) for t in texts]
        vectors = np.stack([v for t in texts if (v := scorer.embedding(t)) is not None])
    finally:
        await scorer.aclose()
    assert all(f is not None and 0.0 <= f <= 1.0 for f in figures)
    assert figures == pytest.approx(list(scorer.domain.in_domain(vectors)), abs=5e-5)  # kept to 4 decimals
    assert float(np.mean([f for f in figures if f is not None])) > 0.5
