"""`cascade router {train,eval,score,versions,rollback,memory,domain,place}`: offline tooling around the router.

`register(subparsers)` adds the `router` command to the gateway's `cascade` CLI; every subcommand sets
`func(args) -> int` (the exit code). Heavy imports happen inside the handlers, not at import time.
(`cascade router calibrate` needs policy prices, so the gateway's CLI adds it to the same sub-command.)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from router_models.place_cli import add_place
from router_models.serving.artifact import ArtifactError
from router_models.training.exit_codes import NOT_BETTER
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, DEFAULT_SOURCES, SOURCES
from router_models.training.targets import TARGETS

__all__ = ["register"]

DEFAULT_EVAL_DIR = Path(".cascade/router-eval")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _train(args: argparse.Namespace) -> int:
    from redis import RedisError

    from router_models.training.labels import LabelError
    from router_models.training.pipeline import TrainRequest, run_training

    request = TrainRequest(routing_dir=args.routing_dir, target=args.target, feature_set=args.feature_set,
                           embedder=args.embedder, labels=tuple(args.labels), from_ledger=args.from_ledger,
                           redis_url=args.redis_url, redis_prefix=args.redis_prefix, out=args.out,
                           promote=not args.no_promote, held_back=args.held_back,
                           max_per_source=args.max_per_source, sources=args.sources, check_ids=args.check_ids)
    try:
        return run_training(request)
    except (ArtifactError, LabelError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
    except RedisError as exc:
        return _fail(f"the ledger's Redis at {args.redis_url} could not be read ({exc})")


def _eval(args: argparse.Namespace) -> int:
    from router_models.training.pipeline import EvalRequest, run_eval

    try:
        return run_eval(EvalRequest(artifact=args.artifact, routing_dir=args.routing_dir, target=args.target,
                                    feature_set=args.feature_set, embedder=args.embedder, out_dir=args.out_dir,
                                    compare=args.compare, max_per_source=args.max_per_source,
                                    sources=args.sources))
    except (ArtifactError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))


def _score(args: argparse.Namespace) -> int:
    from router_models.serving.artifact import default_store_dir
    from router_models.serving.score_file import score_file

    memory = None if args.memory is None else (args.store or default_store_dir(), args.memory)
    try:
        return score_file(args.input, args.output, args.artifact, args.threshold,
                          (args.micro_pool, args.flagship_pool), args.batch_size, memory=memory)
    except ArtifactError as exc:
        return _fail(str(exc))


def _versions(args: argparse.Namespace) -> int:
    from router_models.serving.artifact_store import ArtifactStore

    store = ArtifactStore(args.store)
    try:
        entries = store.history()
        current = store.current_artifact()
    except ArtifactError as exc:
        return _fail(str(exc))
    print(f"store: {store.root}")
    for entry in entries:
        print(f"  {entry.version}{'  (current)' if entry.path == current else ''}")
    print(f"serving: {current}{'  (shipped with the package)' if not entries else ''}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from router_models.serving.artifact_store import ArtifactStore

    try:
        current = ArtifactStore(args.store).rollback()
    except ArtifactError as exc:
        return _fail(str(exc))
    print(f"rolled back; current artifact: {current} (running gateways swap to it within seconds)")
    return 0


def _memory_add(args: argparse.Namespace) -> int:
    from redis import RedisError

    from router_models.serving.artifact import default_store_dir
    from router_models.training.label_checks import check_ids_in_ledger, find_contradictions
    from router_models.training.labels import LabelError, read_label_rows
    from router_models.training.memory_build import (
        SHARED,
        add_label_rows,
        ledger_label_rows,
        memory_path,
        taken_from_ledger,
    )

    if not args.labels and not args.from_ledger:
        return _fail("give --labels FILE, --from-ledger, or both")
    try:
        path = memory_path(args.store or default_store_dir(), args.tenant or SHARED)
        rows = [row for label_file in args.labels for row in read_label_rows(label_file, tenant=args.tenant)]
        if args.check_ids:
            check_ids_in_ledger(rows, args.redis_url, args.redis_prefix, args.tenant)
        ledger = ledger_label_rows(args.redis_url, args.redis_prefix, args.tenant) if args.from_ledger else []
        if args.from_ledger:
            fresh = len({r.request_id for r in ledger} - taken_from_ledger(path))
            print(f"{len(ledger)} labelled requests in the ledger at {args.redis_url}, {fresh} not yet in this memory")
        if not rows and not ledger:
            return _fail("no label rows to add (the ledger holds no labelled request"
                         f"{' of tenant ' + repr(args.tenant) if args.tenant else ''})")
        update = add_label_rows(rows, path, args.artifact, ledger)
    except (ArtifactError, LabelError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
    except RedisError as exc:
        return _fail(f"the ledger's Redis at {args.redis_url} could not be read ({exc})")
    print(f"label memory {update.path}: {update.before} -> {update.after} labels, "
          f"{update.conflicting_prompts} prompts with conflicting labels (running gateways read it within seconds)")
    print(f"these label files: {find_contradictions(rows).line()}")
    return 0


def _domain_build(args: argparse.Namespace) -> int:
    from router_models.training.domain_build import run_domain_build

    try:
        return run_domain_build(str(args.artifact) if args.artifact else None, args.routing_dir, args.out,
                                args.per_source, args.neighbours, args.probes, args.max_per_source)
    except (ArtifactError, FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))


def _add_domain(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    domain = sub.add_parser("domain", help="the in-domain reference: how close traffic is to the training data",
                            description="Each scored request gets an in-domain figure in [0, 1] from the router's "
                            "own embedding (router_models/serving/domain.py).")
    dsub: argparse._SubParsersAction = domain.add_subparsers(dest="domain_cmd", required=True)  # type: ignore[type-arg]
    p = dsub.add_parser("build", help="build the reference beside an artifact, calibrated leave one source out",
                        description="Sample the artifact's public training prompts, embed them with its embedder and "
                        "fit the in-domain calibration leave one source out (held-out sources low, in-sample high); "
                        "writes <artifact stem>-domain.json (+ .npz) beside the artifact and prints the figures.")
    p.add_argument("--artifact", type=Path, default=None, help="artifact .json (default: the current one)")
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR,
                   help="folder of real model outcomes (../shared/data/routing; env CASCADE_ROUTING_DATA)")
    p.add_argument("--out", type=Path, default=None, help="write the reference here instead of beside the artifact")
    p.add_argument("--per-source", type=int, default=300, help="reference prompts per source (default 300)")
    p.add_argument("--neighbours", type=int, default=10, help="nearest reference prompts averaged (default 10)")
    p.add_argument("--probes", type=int, default=2000, help="prompts per fold scored for the calibration")
    p.add_argument("--max-per-source", type=int, default=None,
                   help="use at most N evenly spaced prompts per source (quick runs; the figures then differ)")
    p.set_defaults(func=_domain_build)


def _add_memory(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    memory = sub.add_parser("memory", help="your labels as a label memory that moves scores at once",
                            description="A label memory moves the router's score of a request by the labels of "
                            "the prompts nearest to it (router_models/serving/label_memory.py); no training.")
    msub: argparse._SubParsersAction = memory.add_subparsers(dest="memory_cmd", required=True)  # type: ignore[type-arg]
    p = msub.add_parser("add", help="append label files to a tenant's (or the shared) label memory",
                        description="Embed each label row as the gateway scores it and append it to "
                        "$CASCADE_HOME/router/memory/<tenant | shared>.json. A bad row (a score that is not a "
                        "number in [0, 1], with --tenant a row of another tenant, with --check-ids a request id "
                        "the ledger did not keep) is refused with its file, line and field, and nothing is "
                        "written. Labels of one prompt that contradict each other are counted and one pair is "
                        "shown. Label file format: router_models/training/labels.py.")
    p.add_argument("--labels", type=Path, action="append", default=[], help="JSONL label file (repeatable)")
    p.add_argument("--from-ledger", action="store_true",
                   help="also add the gateway ledger's labels (--redis-url, --redis-prefix): the client's feedback on "
                   "an answer as the quality of the pool that served it (any pool), and the gap labels; with "
                   "--tenant, that tenant's requests only. A request the memory already took is not taken again")
    p.add_argument("--tenant", default=None, help="the tenant whose requests the labels move (default: shared, "
                   "every tenant's)")
    p.add_argument("--artifact", type=Path, default=None, help="artifact whose embedder to use (default: current)")
    p.add_argument("--store", type=Path, default=None, help="artifact store folder (default $CASCADE_HOME/router)")
    _add_check_ids(p, "and, with --tenant, a request of that tenant")
    p.set_defaults(func=_memory_add)


def _add_check_ids(p: argparse.ArgumentParser, tenant_note: str) -> None:
    p.add_argument("--check-ids", action="store_true",
                   help="every label row's \"id\" must be a request whose prompt the gateway kept in the ledger"
                   f"{' ' + tenant_note if tenant_note else ''}; the first that is not refuses the files")
    p.add_argument("--redis-url", default=os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis of the ledger (default $CASCADE_REDIS_URL, else the local one)")
    p.add_argument("--redis-prefix", default="cascade:", help="key prefix of the ledger in Redis (as for serve)")


def _source_list(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in {s.name for s in SOURCES}]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown source {', '.join(unknown) or '(none given)'}; known: "
                                         f"{', '.join(s.name for s in SOURCES)}")
    return names


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--routing-dir", type=Path, default=DEFAULT_ROUTING_DIR,
                   help="folder of real model outcomes (../shared/data/routing; env CASCADE_ROUTING_DATA)")
    p.add_argument("--target", choices=TARGETS, default=None,
                   help="what the router learns (default: the artifact's, else irt-fail); "
                   "see router_models/training/targets.py")
    p.add_argument("--feature-set", choices=("embedding+structure", "embedding", "structure"), default=None,
                   help="inputs of the classifier (default: the artifact's, else embedding+structure)")
    p.add_argument("--embedder", default=None, help="embedder name (default: the artifact's, else "
                   "all-MiniLM-L6-v2:onnx-int8:t64:l3); e.g. all-MiniLM-L6-v2:static:t64 (the fast one); '+' joins "
                   "two side by side")
    p.add_argument("--max-per-source", type=int, default=None,
                   help="use at most N evenly spaced prompts per source (quick runs; the figures then differ)")
    p.add_argument("--sources", type=_source_list, default=None, metavar="NAME,NAME",
                   help=f"outcome sources to use (default: the artifact's, else {','.join(DEFAULT_SOURCES)}; "
                   f"all: {','.join(s.name for s in SOURCES)})")


def _add_train(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train", help="train on real outcomes (+ your labels), evaluate, promote only if better",
        description="Fit the router on the seven public outcome sources (and, with --labels / --from-ledger, "
        "your own labels), evaluate it leave-one-source-out, compare it with the current artifact on "
        "held-back traffic, and promote it only if it is better. Label file format: router_models/training/labels.py. "
        "Exit codes: 0 written (and promoted, unless --out or --no-promote), 1 failed, 2 refused (usage, a bad "
        f"label row, a missing file), {NOT_BETTER} not promoted because not better than the current artifact.")
    _add_common(p)
    p.add_argument("--labels", type=Path, action="append", default=[],
                   help="JSONL label file of your own traffic (repeatable)")
    p.add_argument("--from-ledger", action="store_true",
                   help="also train on the gateway's own labels in Redis (feedback, shadow, escalations)")
    _add_check_ids(p, "")
    p.add_argument("--held-back", type=float, default=0.3, help="share of your labels kept for the comparison")
    p.add_argument("--out", type=Path, default=None,
                   help="write the artifact here instead of the versioned store (e.g. the package's own)")
    p.add_argument("--no-promote", action="store_true", help="write the candidate, never make it current")
    p.set_defaults(func=_train)


def _add_eval(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "eval", help="leave-one-source-out table (APGR, CPT50/80, AUC, Brier, ECE) and the cost-quality PNG",
        description="For each source: fit on the others, score it, measure it; the mean row is the headline. "
        "--compare tries every target and feature set (the evidence for the shipped choice).")
    _add_common(p)
    p.add_argument("--artifact", type=Path, default=None, help="artifact whose configuration to evaluate "
                   "(default: the current one)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_EVAL_DIR, help="where eval.json and the PNG go")
    p.add_argument("--compare", action="store_true", help="also compare every target x feature set")
    p.set_defaults(func=_eval)


def _add_score(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("score", help="score a JSONL file of prompts",
                       description='Input lines {"id", "prompt"} or {"id", "messages"}; output lines '
                       '{"id", "score", "pool"} in input order. Bad lines are reported (with line number) '
                       "on stderr and skipped; the exit code is 1 if any line was bad.")
    p.add_argument("--in", dest="input", type=Path, required=True, help="input JSONL ('-' for stdin)")
    p.add_argument("--out", dest="output", type=Path, required=True, help="output JSONL ('-' for stdout)")
    p.add_argument("--artifact", type=Path, default=None, help="artifact .json (default: the current one)")
    p.add_argument("--threshold", type=float, default=0.5, help="score >= threshold goes to the flagship pool")
    p.add_argument("--micro-pool", default="micro", help="pool name for scores below the threshold")
    p.add_argument("--flagship-pool", default="flagship", help="pool name at or above the threshold")
    p.add_argument("--batch-size", type=int, default=64, help="texts per model call")
    add_memory_flags(p)
    p.set_defaults(func=_score)


def add_memory_flags(p: argparse.ArgumentParser) -> None:
    """`--memory NAME` and `--store` (score and route)."""
    p.add_argument("--memory", metavar="NAME", default=None,
                   help='move scores by this label memory exactly as the gateway does ("shared" or a tenant\'s name)')
    p.add_argument("--store", type=Path, default=None,
                   help="store the memory lives in (<store>/memory/NAME.json; default $CASCADE_HOME/router)")


def _add_store(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, func, text in (("versions", _versions, "list promoted artifacts and the one served"),
                             ("rollback", _rollback, "make the previously promoted artifact current again")):
        p = sub.add_parser(name, help=text, description=text + " (store: $CASCADE_HOME/router).")
        p.add_argument("--store", type=Path, default=None, help="artifact store folder (default $CASCADE_HOME/router)")
        p.set_defaults(func=func)


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """Add `router` with its subcommands; each sets `func(args) -> int`. Returns the router's subparsers."""
    router = subparsers.add_parser("router", help="train, evaluate, version and run the complexity router",
                                   description="The complexity router: P(micro pool's answer falls short).")
    sub: argparse._SubParsersAction = router.add_subparsers(dest="router_cmd", required=True)  # type: ignore[type-arg]
    _add_train(sub)
    _add_eval(sub)
    _add_score(sub)
    _add_store(sub)
    _add_memory(sub)
    _add_domain(sub)
    add_place(sub)
    return sub
