"""`cascade router {train,eval,score}`: offline tooling around the complexity router.

`register(subparsers)` adds the `router` command to the gateway's `cascade` CLI; every subcommand sets
`func(args) -> int` (the exit code). Heavy imports happen inside the handlers, not at import time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from router_models.artifact import DEFAULT_ARTIFACT, ArtifactError
from router_models.data import DEFAULT_ROUTING_DIR, PACKAGE_DATA
from router_models.embedder import DEFAULT_EMBEDDER

__all__ = ["register"]

DEFAULT_EVAL_DIR = Path(".cascade/router-eval")


def _train(args: argparse.Namespace) -> int:
    from router_models.artifact import save_artifact
    from router_models.embedder import make_embedder
    from router_models.report import heldout_report, mixed_report
    from router_models.train import TrainConfig, train

    cfg = TrainConfig(routing_dir=args.routing_dir, labelled=args.labelled, seed=args.seed, folds=args.folds)
    embedder = make_embedder(args.embedder)
    art = train(cfg, embedder)
    art.metadata["metrics"] = {
        "heldout": heldout_report(art, embedder, cfg),
        "mixed": mixed_report(art, embedder),
    }
    path = save_artifact(art, args.out)
    _print_summary(art.metadata["metrics"])
    print(f"wrote {path} (+ {path.with_suffix('.npz').name})")
    return 0


def _print_summary(m: dict[str, Any]) -> None:
    for source, row in m["heldout"].items():
        print(f"held-out {source:>9}: n={row['n']:5} AUC={row['auc']:.3f} APGR={row['apgr']:.3f} "
              f"CPT50={row['cpt50']:.3f} CPT80={row['cpt80']:.3f}  (random: 0.5/0.5/0.8)")
    for kind, row in m["mixed"]["by_kind"].items():
        print(f"mixed {kind:>12}: n={row['n']:4} AUC={row['auc']:.3f} APGR={row['apgr']:.3f} "
              f"CPT50={row['cpt50']:.3f} CPT80={row['cpt80']:.3f}")
    print(f"mixed math Spearman(score, difficulty) = {m['mixed']['math_spearman']:.3f}; mean score by level "
          f"{m['mixed']['math_mean_score_by_difficulty']}")


def _eval(args: argparse.Namespace) -> int:
    from router_models.artifact import load_artifact
    from router_models.embedder import make_embedder
    from router_models.report import cross_source_report, heldout_report, mixed_report
    from router_models.train import TrainConfig

    try:
        art = load_artifact(args.artifact)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    embedder = make_embedder(art.embedder)
    cfg = TrainConfig(routing_dir=args.routing_dir, labelled=args.labelled, seed=int(art.metadata["split"]["seed"]),
                      holdout=float(art.metadata["split"]["holdout"]))
    out: Path = args.out_dir
    report: dict[str, Any] = {
        "heldout": heldout_report(art, embedder, cfg, plot=out / "curve_heldout.png"),
        "mixed": mixed_report(art, embedder, plot=out / "curve_mixed.png"),
    }
    _print_summary(report)
    if not args.no_cross:
        report["cross_source_apgr"] = cross_source_report(embedder, cfg, float(art.metadata["model"]["C"]))
        for src, row in report["cross_source_apgr"].items():
            print(f"trained on {src:>8} only -> " + " ".join(f"{k}={v:.3f}" for k, v in row.items()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out / 'eval.json'}, {out / 'curve_heldout.png'}, {out / 'curve_mixed.png'}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from router_models.score_file import score_file

    try:
        return score_file(args.input, args.output, args.artifact, args.threshold,
                          (args.micro_pool, args.flagship_pool), args.batch_size)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _add_train(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("train", help="train the complexity classifier and write the artifact",
                       description="Embed MMLU/GSM8K + our labelled prompts, cross-validate, fit, evaluate "
                       "on the held-out split and mixed set, and write the versioned artifact.")
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR, help="RouteLLM data folder")
    p.add_argument("--labelled", type=Path, default=PACKAGE_DATA / "labelled_prompts.jsonl",
                   help="our labelled prompts (JSONL: prompt|messages, label, kind)")
    p.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT, help="artifact metadata path (.json)")
    p.add_argument("--embedder", default=DEFAULT_EMBEDDER,
                   help="embedder name, all-MiniLM-L6-v2:<int8|fp32>:t<tokens>[:l<layers>] (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and CV folds")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    p.set_defaults(func=_train)


def _add_eval(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="evaluate an artifact: AUC, APGR, CPT(50/80%%) vs random; PNG curves",
                       description="Held-out split per source, the mixed-traffic set with its math-difficulty "
                       "Spearman, and cross-source generalisation (fit on one source, test on the others).")
    p.add_argument("--artifact", type=Path, default=None, help="artifact .json (default: the shipped one)")
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR, help="RouteLLM data folder")
    p.add_argument("--labelled", type=Path, default=PACKAGE_DATA / "labelled_prompts.jsonl",
                   help="our labelled prompts (must be the training file, to rebuild the same split)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_EVAL_DIR, help="where eval.json and PNGs go")
    p.add_argument("--no-cross", action="store_true", help="skip the cross-source runs (they refit 3 models)")
    p.set_defaults(func=_eval)


def _add_score(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("score", help="score a JSONL file of prompts",
                       description='Input lines {"id", "prompt"} or {"id", "messages"}; output lines '
                       '{"id", "score", "pool"} in input order. Bad lines are reported (with line number) '
                       "on stderr and skipped; the exit code is 1 if any line was bad.")
    p.add_argument("--in", dest="input", type=Path, required=True, help="input JSONL ('-' for stdin)")
    p.add_argument("--out", dest="output", type=Path, required=True, help="output JSONL ('-' for stdout)")
    p.add_argument("--artifact", type=Path, default=None, help="artifact .json (default: the shipped one)")
    p.add_argument("--threshold", type=float, default=0.5, help="score >= threshold goes to the flagship pool")
    p.add_argument("--micro-pool", default="micro", help="pool name for scores below the threshold")
    p.add_argument("--flagship-pool", default="flagship", help="pool name at or above the threshold")
    p.add_argument("--batch-size", type=int, default=64, help="texts per model call")
    p.set_defaults(func=_score)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `router` with subcommands train/eval/score; each sets `func(args) -> int`."""
    router = subparsers.add_parser("router", help="train, evaluate and run the complexity router",
                                   description="The complexity router: P(micro pool's answer falls short).")
    sub = router.add_subparsers(dest="router_cmd", required=True)
    _add_train(sub)
    _add_eval(sub)
    _add_score(sub)
