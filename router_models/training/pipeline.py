"""What `cascade router train` and `cascade router eval` do, step by step, with progress on stdout.

Train: load the public outcomes (+ the user's labels, split into train and held back by prompt key), fit,
evaluate leave-one-source-out on the public sources, write the candidate, then compare it with the current
artifact and promote it only when it is better:
- with user labels: APGR on the held-back labels (ties broken by Brier), both models scoring the same rows;
- without: the mean leave-one-source-out APGR, the candidate's against the figure stored in the current
  artifact, over the public sources both were evaluated on (a six-source artifact against a seven-source
  candidate: the six); when the current one has no per-source figures, its stored mean; when it has no figure
  at all (e.g. an older format), the candidate wins.
The report says by how much either way. `--out` writes a file and skips the store (for the shipped artifact).
Exit codes (`router_models.training.exit_codes`): 0 written (and promoted unless `--out` / `--no-promote`),
`NOT_BETTER` (3) not promoted because not better; failures exit 1 (a crash) or 2 (refused input, in the CLI).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from router_models.embedders.factory import make_embedder
from router_models.embedders.protocol import Embedder
from router_models.serving.artifact import RouterArtifact, load_artifact, save_artifact
from router_models.serving.artifact_store import ArtifactStore
from router_models.training.exit_codes import NOT_BETTER
from router_models.training.loso import LosoResult, leave_one_source_out, plot_loso, print_table
from router_models.training.outcomes import SOURCES, Example, load_outcomes
from router_models.training.trainer import (
    FEATURE_SETS,
    TrainConfig,
    features,
    fit_router,
    mask_features,
    source_routers,
    training_metadata,
)

if TYPE_CHECKING:
    from router_models.training.labels import LabelRow

__all__ = ["DEFAULT_TARGET", "EvalRequest", "TrainRequest", "run_eval", "run_training"]

DEFAULT_TARGET = "irt-fail"
DEFAULT_TRAIN_EMBEDDER = "all-MiniLM-L6-v2:onnx-int8:t64:l3"  # quality first; the fast option: MODEL_CARD.md
DEFAULT_FEATURES = "embedding+structure"


@dataclass(frozen=True)
class TrainRequest:
    """Arguments of `cascade router train` (None = the default)."""

    routing_dir: Path
    target: str | None = None
    feature_set: str | None = None
    embedder: str | None = None
    labels: tuple[Path, ...] = ()
    from_ledger: bool = False
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "cascade:"
    out: Path | None = None
    promote: bool = True
    held_back: float = 0.3
    max_per_source: int | None = None
    sources: tuple[str, ...] | None = None  # None: outcomes.DEFAULT_SOURCES
    check_ids: bool = False  # every label file row's "id" must be a request the ledger kept


@dataclass(frozen=True)
class EvalRequest:
    """Arguments of `cascade router eval`."""

    artifact: Path | None
    routing_dir: Path
    target: str | None = None
    feature_set: str | None = None
    embedder: str | None = None
    out_dir: Path = Path(".cascade/router-eval")
    compare: bool = False
    max_per_source: int | None = None
    sources: tuple[str, ...] | None = None  # None: the artifact's training sources, else DEFAULT_SOURCES


def _user_labels(req: TrainRequest) -> list[Example]:
    """The label files' rows and (`from_ledger`) the ledger's, checked: a bad row, or (`check_ids`) a file row
    naming a request the ledger did not keep, raises `LabelError` before anything is fitted; contradicting
    labels are counted and printed (`label_checks`)."""
    from router_models.training.label_checks import check_ids_in_ledger, find_contradictions
    from router_models.training.labels import label_rows, read_label_rows

    rows: list[LabelRow] = []
    for path in req.labels:
        rows += read_label_rows(path)
        print(f"[train] {len(rows)} label rows after {path}")
    if req.check_ids:
        check_ids_in_ledger(rows, req.redis_url, req.redis_prefix)
    if req.from_ledger:
        from router_models.training.ledger_labels import read_ledger_labels

        ledger = read_ledger_labels(req.redis_url, key_prefix=req.redis_prefix)
        rows += label_rows(ledger, default_source="ledger", origin="ledger row")
        print(f"[train] {len(ledger)} labelled requests from the ledger at {req.redis_url}")
    if rows:
        print(f"[train] {find_contradictions(rows).line()}")
    pool_only = sum(not row.has_gap for row in rows)
    if pool_only:
        print(f"[train] {pool_only} label rows name pools only (no micro and flagship quality): not trained on; "
              "`cascade router memory add` keeps them as labels per pool")
    return [row.example for row in rows if row.has_gap]


def _held_back_metrics(art: RouterArtifact, embedder: Embedder, rows: list[Example]) -> dict[str, float]:
    from router_models.training.evaluate import example_metrics

    x = features(embedder, rows, str(art.metadata.get("feature_set", DEFAULT_FEATURES)))
    m = example_metrics(art.router.predict_proba(x), rows)
    return {"apgr": m.apgr, "brier": m.brier, "auc": m.auc, "n": m.n}


def _better(cand: dict[str, float], cur: dict[str, float]) -> bool:
    if np.isnan(cur["apgr"]) or cand["apgr"] > cur["apgr"] + 1e-9:
        return True
    return bool(abs(cand["apgr"] - cur["apgr"]) <= 1e-9 and cand["brier"] < cur["brier"])


def _compare(candidate: RouterArtifact, embedder: Embedder, held: list[Example]) -> tuple[bool, str]:
    store_current = load_artifact(None)
    if held:
        cand = _held_back_metrics(candidate, embedder, held)
        same = store_current.embedder == embedder.name
        current_embedder = embedder if same else make_embedder(store_current.embedder)
        cur = _held_back_metrics(store_current, current_embedder, held)
        basis = f"{len(held)} held-back labels of your traffic"
    else:
        cand, cur, basis = _stored_figures(candidate, store_current)
    delta = cand["apgr"] - cur["apgr"]
    return _better(cand, cur), (f"candidate APGR {cand['apgr']:.4f} vs current {cur['apgr']:.4f} "
                                f"({delta:+.4f}) on {basis}")


def _stored_figures(candidate: RouterArtifact, current: RouterArtifact) -> tuple[dict[str, float],
                                                                             dict[str, float], str]:
    """The two artifacts' stored leave-one-source-out APGR, over the sources both were evaluated on."""
    cand_eval, cur_eval = candidate.metadata["evaluation"], current.metadata.get("evaluation", {})
    cand_rows, cur_rows = cand_eval.get("per_source", {}), cur_eval.get("per_source", {})
    common = [s for s in cand_rows if s in cur_rows]
    if not common:
        return ({"apgr": float(cand_eval["mean"]["apgr"]), "brier": 0.0},
                {"apgr": float(cur_eval.get("mean", {}).get("apgr", float("nan"))), "brier": 0.0},
                "mean leave-one-source-out APGR on the public outcomes")
    cand = float(np.nanmean([float(cand_rows[s]["apgr"]) for s in common]))
    cur = float(np.nanmean([float(cur_rows[s]["apgr"]) for s in common]))
    return ({"apgr": cand, "brier": 0.0}, {"apgr": cur, "brier": 0.0},
            f"mean leave-one-source-out APGR on the {len(common)} public sources both were evaluated on")


def _config(target: str | None, feature_set: str | None, routing_dir: Path) -> TrainConfig:
    return TrainConfig(routing_dir=routing_dir, target=target or DEFAULT_TARGET,
                       feature_set=feature_set or DEFAULT_FEATURES)


def _fit_and_evaluate(cfg: TrainConfig, embedder: Embedder, public: list[Example],
                      extra: list[Example]) -> tuple[RouterArtifact, LosoResult]:
    print(f"[train] embedding {len(public) + len(extra)} prompts with {embedder.name} (cached after the first run)")
    x_pub = features(embedder, public, cfg.feature_set)
    print("[train] leave-one-source-out evaluation on the public sources")
    loso = leave_one_source_out(x_pub, public, cfg)
    everything = public + extra
    x = np.vstack([x_pub, features(embedder, extra, cfg.feature_set)]) if extra else x_pub
    print(f"[train] final fit on {len(everything)} prompts")
    fitted = fit_router(x, everything, cfg)
    print("[train] one router per public source, for label memories to combine")
    fitted = replace(fitted, router=replace(fitted.router, sources=source_routers(x_pub, public, cfg)))
    if fitted.own:
        print(f"[train] {fitted.own['rows']} own label rows used the {fitted.own['mode']!r} way "
              f"(router_models/training/own_labels.py)")
    meta: dict[str, Any] = training_metadata(cfg, everything, fitted)
    evaluation = loso.as_dict()
    meta["evaluation"] = {k: v for k, v in evaluation.items() if k != "quality_curve"}
    meta["quality_curve"] = evaluation["quality_curve"]
    return RouterArtifact(router=fitted.router, embedder=embedder.name, metadata=meta), loso


def run_training(req: TrainRequest) -> int:
    """`cascade router train`. Returns the exit code (`exit_codes`): 0 written, and promoted unless `--out` or
    `--no-promote`; `NOT_BETTER` (3) when the candidate lost the comparison and was not promoted."""
    from router_models.training.labels import split_held_back

    own = _user_labels(req)  # a bad label row is refused before anything is loaded
    cfg = _config(req.target, req.feature_set, req.routing_dir)
    public = load_outcomes(req.routing_dir, sources=req.sources, max_per_source=req.max_per_source)
    print(f"[train] {len(public)} prompts with real outcomes from {req.routing_dir} "
          f"({', '.join(dict.fromkeys(ex.source for ex in public))})")
    train_rows, held = split_held_back(own, req.held_back)
    embedder = make_embedder(req.embedder or DEFAULT_TRAIN_EMBEDDER)
    candidate, loso = _fit_and_evaluate(cfg, embedder, public, train_rows)
    print_table(loso, f"leave-one-source-out ({cfg.target}, {cfg.feature_set}, {embedder.name}):")
    if req.out is not None:
        path = save_artifact(candidate, req.out)
        print(f"[train] wrote {path}")
        return 0
    store = ArtifactStore()
    staging = Path(tempfile.mkdtemp(prefix="candidate-", dir=_ensure(store.root)))
    path = save_artifact(candidate, staging / "complexity-router.json")
    better, verdict = _compare(candidate, embedder, held)
    print(f"[train] {verdict}")
    if not req.promote or not better:
        print(f"[train] not promoted ({'--no-promote' if better else 'not better than the current artifact'}); "
              f"candidate kept at {path}")
        return NOT_BETTER if req.promote else 0  # promoting, so the candidate was not better
    entry = store.promote(path)
    print(f"[train] promoted as version {entry.version} (running gateways swap to it within seconds; "
          "`cascade router rollback` restores the previous one)")
    return 0


def _ensure(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return root


def run_eval(req: EvalRequest) -> int:
    """`cascade router eval`: the leave-one-source-out table for a configuration (+ --compare grid)."""
    import json

    art = load_artifact(req.artifact)
    cfg = _config(req.target or art.metadata.get("target"), req.feature_set or art.metadata.get("feature_set"),
                  req.routing_dir)
    public = load_outcomes(req.routing_dir, sources=req.sources or _artifact_sources(art),
                           max_per_source=req.max_per_source)
    embedder = make_embedder(req.embedder or art.embedder)
    x = features(embedder, public, "embedding+structure")
    report: dict[str, Any] = {}
    grid = [(t, f) for t in _targets() for f in FEATURE_SETS] if req.compare else [(cfg.target, cfg.feature_set)]
    for target, feature_set in grid:
        run_cfg = replace(cfg, target=target, feature_set=feature_set)
        loso = leave_one_source_out(mask_features(x, embedder.dim, feature_set), public, run_cfg)
        print_table(loso, f"\nleave-one-source-out ({target}, {feature_set}, {embedder.name}):")
        report[f"{target}|{feature_set}"] = loso.as_dict()
        if (target, feature_set) == (cfg.target, cfg.feature_set):
            png = plot_loso(loso, req.out_dir / "curve_loso.png")
            print(f"wrote {png}")
    req.out_dir.mkdir(parents=True, exist_ok=True)
    (req.out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {req.out_dir / 'eval.json'}")
    return 0


def _artifact_sources(art: RouterArtifact) -> tuple[str, ...] | None:
    """The public sources `art` was trained on (None: not recorded, use the default)."""
    known = {s.name for s in SOURCES}
    trained = tuple(s for s in art.metadata.get("sources", {}) if s in known)
    return trained or None


def _targets() -> tuple[str, ...]:
    from router_models.training.targets import TARGETS

    return TARGETS
