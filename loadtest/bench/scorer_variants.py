"""Code variants of the scorer side by side: one worker process per source tree, driven round by round.

`scorer_bench --trees OLD,NEW` starts one worker per tree (e.g. a `git worktree` of an older commit and `.`).
A worker puts the tree first on `sys.path`, so `router_models` (the scorer under test) comes from that tree,
while the load generator (`offered_load.offer_load`, imported before the tree goes on the path) is this
repository's, identical for all. Each worker builds the tree's `load_scorer()` with that tree's own defaults
(batching, threads), as the gateway would, and reads the same prompt file, so every variant sees the same
prompts and the same Poisson arrivals in the same order.

The parent sends one JSON line per load cell on the worker's stdin and reads one JSON line back on stdout;
only one worker runs load at a time (the others sit idle), so the variants never compete for the CPU and
rounds interleave them. Process CPU is each worker's own.

    python -m loadtest.bench.scorer_variants --tree /tmp/scorer-old --prompts FILE   # a worker (started by the bench)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, cast

from loadtest.bench.offered_load import ScoreOne, offer_load, run_on_time

if TYPE_CHECKING:  # typing only: at run time router_models must come from the tree under test
    from router_models.serving.classifier_scorer import ClassifierScorer

__all__ = ["TreeWorker", "take_stats", "tree_label"]


def tree_label(tree: str) -> str:
    """`name@commit` for a git tree, with `+changes` when its working tree differs from the commit."""
    path = Path(tree).resolve()
    try:
        rev = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--", "router_models"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return path.name
    return f"{path.name}@{rev}{'+changes' if dirty else ''}"


class TreeWorker:
    """A worker process scoring with `tree`'s `router_models`. `run(...)` offers one load cell there.

    The caller owns the process: `close()` ends it (idempotent). Raises RuntimeError when the worker dies.
    """

    def __init__(self, tree: str, prompts_file: Path, artifact: str | None, labels: int = 0,
                 one_blas: bool = False, tiers: int = 0) -> None:
        self.label = tree_label(tree)
        cmd = [sys.executable, "-m", "loadtest.bench.scorer_variants", "--tree", tree, "--prompts", str(prompts_file),
               "--labels", str(labels), "--tiers", str(tiers)]
        if artifact:
            cmd += ["--artifact", artifact]
        if one_blas:
            cmd.append("--one-blas")
        repo = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen(cmd, cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.origin = str(self._read()["origin"])  # waits until the scorer is loaded and warm

    def _read(self) -> dict[str, object]:
        assert self._proc.stdout is not None
        while line := self._proc.stdout.readline():
            if line.startswith("{"):  # anything else is a library's chatter on stdout
                reply: dict[str, object] = json.loads(line)
                return reply
        raise RuntimeError(f"scorer worker for {self.label} exited with {self._proc.wait()}")

    def run(self, rate: float, duration: float, repeat_share: float, seed: int) -> dict[str, object]:
        """One cell at `rate` req/s for `duration` s: the `Result` fields plus `stats` (batch sizes)."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"rate": rate, "duration": duration, "repeat_share": repeat_share,
                                           "seed": seed}) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _prompts(path: Path) -> Iterator[str]:
    pool = json.loads(path.read_text())
    yield from pool
    i = 0
    while True:  # more arrivals than prompts: keep them unique
        yield f"{pool[i % len(pool)]} (again {i})"
        i += 1


def take_stats(scorer: ClassifierScorer) -> str:
    """The scorer's batch sizes (and overflow share, where the tree's scorer has an overflow model attached)
    since the last call, as one line; counting restarts. Also for a tree whose scorer predates the overflow."""
    sizes = list(scorer.batch_sizes) or [0]
    line = f"batches={len(sizes)} mean_batch={sum(sizes) / len(sizes):.1f} max_batch={max(sizes)}"
    scorer.batch_sizes.clear()
    by_model = getattr(scorer, "scored_by", None)
    refined = getattr(scorer, "refined", None)  # a two-stage primary's texts its refiner re-scored
    if by_model and refined is not None:
        line += f" refined={refined / (by_model['primary'] or 1):.1%}"
        scorer.refined = 0
    if by_model and getattr(scorer, "overflow", None) is not None:
        line += f" overflow={by_model['overflow'] / (sum(by_model.values()) or 1):.1%}"
    if by_model:
        by_model.update(primary=0, overflow=0)
    return line


async def _serve(scorer: ClassifierScorer, origin: str, prompts: Iterator[str], labels: int, tiers: int) -> None:
    async def plain(text: str) -> float:
        return (await scorer.score([text]))[0]

    score_one: ScoreOne = plain
    if labels > 0 or tiers > 0:  # as the gateway: a label memory moves every score, a pool map rates the tiers
        from loadtest.bench.scorer_memory import attach_memory, with_memory

        score_one = with_memory(scorer, attach_memory(scorer, labels), tiers)

    await offer_load(score_one, iter([f"warm-up {i}" for i in range(40)]), 20, 1.0, 0.0, 0)
    print(json.dumps({"origin": origin}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            cell = json.loads(line)
            take_stats(scorer)  # this cell's figures only
            res = await offer_load(score_one, prompts, cell["rate"], cell["duration"], cell["repeat_share"],
                                   cell["seed"])
            print(json.dumps({**asdict(res), "stats": take_stats(scorer)}), flush=True)
    finally:
        await scorer.aclose()


def main() -> None:
    """Worker entry point (started by `scorer_bench --trees`); see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", required=True, help="source tree whose router_models is scored")
    p.add_argument("--prompts", required=True, help="JSON list of prompts, consumed in order")
    p.add_argument("--artifact", default=None, help="artifact .json (default: the tree's shipped one)")
    p.add_argument("--labels", type=int, default=0, help="a label memory of this many real labels moves each score")
    p.add_argument("--tiers", type=int, default=0, help="each request's quality on this many pools (the pool map)")
    p.add_argument("--one-blas", action="store_true", help="BLAS on one thread, as `cascade serve` sets it")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.one_blas:
        import numpy  # noqa: F401  # loads its BLAS, which threadpoolctl limits
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    sys.path.insert(0, str(Path(args.tree).resolve()))  # before anything imports router_models
    import router_models

    load_scorer = _load_scorer_of_tree()
    origin = str(Path(router_models.__file__).resolve().parent)
    run_on_time(_serve(_gateway_scorer(load_scorer, args.artifact), origin, _prompts(Path(args.prompts)),
                       args.labels, args.tiers))


def _load_scorer_of_tree() -> Callable[..., ClassifierScorer]:
    """The tree's `load_scorer`: in `router_models.serving.classifier_scorer`, or in `router_models.serving` in a
    tree from before router_models/ had sub-packages (so a bench can still set the new code beside the old)."""
    try:
        module = importlib.import_module("router_models.serving.classifier_scorer")
    except ModuleNotFoundError:
        module = importlib.import_module("router_models.serving")
    return cast("Callable[..., ClassifierScorer]", module.load_scorer)


def _gateway_scorer(load_scorer: Callable[..., ClassifierScorer], artifact: str | None) -> ClassifierScorer:
    """The tree's scorer as its gateway serves it: with the overflow model where the tree has one (the gateway's
    default, `$CASCADE_ROUTER_OVERFLOW` else auto), attached before the load starts."""
    if "overflow" not in inspect.signature(load_scorer).parameters:
        return load_scorer(artifact)
    scorer = load_scorer(artifact, overflow=os.environ.get("CASCADE_ROUTER_OVERFLOW") or "auto")
    if scorer.overflow_loader is not None:
        scorer.overflow_loader.join(300)
    return scorer


if __name__ == "__main__":
    main()
