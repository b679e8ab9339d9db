"""CPU per label-memory move, one request at a time as the gateway moves it inline (`label_memories._inline`:
`memory_apply.request_rows`, `MemoryRouter.adjust`, then the gap move), at several memory sizes, for one or more
source trees side by side.

The labels are real (`router_models.training.outcomes.load_outcomes`: prompts of `../shared/data/routing`, evenly
spread), embedded once by the fast artifact's scorer of this checkout; the requests are other real prompts. Each tree
runs in a process of its own (its `router_models` first on the path), rounds interleaved. Two figures per size, the
median thread CPU per move: warm (moves back to back: the memory's matrix stays in the CPU's cache) and cold (24 MB
read between moves, as the scorer's embedder, in-domain matrix and other processes do between two requests; what a
request pays under load). CPU time, not wall time; BLAS on one thread, as `cascade serve` runs it.

    python -m loadtest.bench.memory_move --trees /tmp/old-tree,. --labels 100,1000,5000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

_ARTIFACT = "router_models/artifacts/complexity-router-static.json"
_REQUESTS = 200


def _build(path: Path, labels: int) -> None:
    """`labels` label rows and `_REQUESTS` request rows (feature rows as the scorer keeps them), to `path`."""
    import numpy as np

    from loadtest.bench.scorer_prompts import DEFAULT_DATA_DIR
    from router_models.serving.classifier_scorer import load_scorer
    from router_models.serving.label_memory import gap_target
    from router_models.training.outcomes import load_outcomes

    model: Any = load_scorer(_ARTIFACT, overflow="none")._model  # the protocol hides the feature call
    examples = load_outcomes(Path(os.environ.get("CASCADE_ROUTING_DATA", DEFAULT_DATA_DIR)))
    picked = [examples[int(i)] for i in np.linspace(0, len(examples) - 1, labels + _REQUESTS).round()]
    rows, scores, dims = [], [], 0
    for ex in picked:
        score, vector, structure = model.score_and_features([ex.text], [ex.shape] if ex.shape else None)
        rows.append(np.hstack([vector, structure]))
        scores.append(float(np.ravel(score)[0]))
        dims = vector.shape[1]
    x = np.vstack(rows).astype(np.float32)
    targets = [gap_target(ex.weak, ex.strong) for ex in picked]
    np.savez(path, labels=x[::2][:labels], targets=np.asarray(targets[::2][:labels]),
             requests=x[1::2][:_REQUESTS], scores=np.asarray(scores[1::2][:_REQUESTS]), dims=dims)


def _measure(tree: str, rows: Path, sizes: list[int], moves: int) -> dict[str, Any]:
    """In a worker: {size: (warm us, cold us)} for this tree's code."""
    sys.path.insert(0, str(Path(tree).resolve()))
    import numpy as np
    from threadpoolctl import threadpool_limits

    from router_models.serving import memory_apply
    from router_models.serving.artifact import load_artifact
    from router_models.serving.label_memory import LabelMemory, MemoryParams, MemoryRouter

    data = np.load(rows)
    dims, requests, scores = int(data["dims"]), data["requests"], data["scores"]
    router = load_artifact(Path(tree) / _ARTIFACT).router
    gap_move = getattr(memory_apply, "gap_move", None)

    def one(attached: Any, i: int) -> None:
        row = memory_apply.request_rows(attached, requests[i:i + 1, :dims], requests[i:i + 1])
        score = float(scores[i])
        moved = float(attached.adjust(row, np.asarray([score]))[0])
        if gap_move is not None:
            gap_move(attached, score, moved)
        else:  # a tree from before the one-request gap move
            memory_apply.gap_moves(attached, np.asarray([score]), np.asarray([moved]))

    sweep = np.ones(6_000_000, np.float32)
    out: dict[str, Any] = {}
    with threadpool_limits(1, "blas"):  # as `cascade serve` runs BLAS
        for n in sizes:
            memory = LabelMemory.empty(data["labels"].shape[1], dims, MemoryParams()).extended(
                data["labels"][:n], data["targets"][:n])
            attached = MemoryRouter.attach(router, memory)
            figures = []
            for cold in (False, True):
                took = []
                for k in range(moves if not cold else moves // 4):
                    if cold:
                        float(sweep.sum())
                    start = time.thread_time_ns()
                    one(attached, k % len(requests))
                    took.append((time.thread_time_ns() - start) / 1000)
                figures.append(float(np.median(took)))
            out[str(n)] = figures
    return {"tree": tree, "moves": out, "load": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default=".", help="comma-separated source trees, side by side")
    p.add_argument("--labels", default="100,1000,5000", help="memory sizes (labels)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--moves", type=int, default=2000, help="moves timed per size and round (warm; a quarter cold)")
    p.add_argument("--worker", nargs=2, metavar=("TREE", "ROWS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [int(s) for s in args.labels.split(",")]
    if args.worker:
        print(json.dumps(_measure(args.worker[0], Path(args.worker[1]), sizes, args.moves)))
        return
    trees = args.trees.split(",")
    repo = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.npz"
        _build(rows, max(sizes))
        env = {**os.environ, "PYTHONPATH": str(repo), "OPENBLAS_NUM_THREADS": "1"}
        for r in range(args.rounds):
            for tree in trees:
                done = subprocess.run([sys.executable, "-m", "loadtest.bench.memory_move", "--labels", args.labels,
                                       "--moves", str(args.moves), "--worker", tree, str(rows)], cwd=repo, env=env,
                                      capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                cells = "  ".join(f"{n}: {w:6.1f} warm {c:6.1f} cold" for n, (w, c) in result["moves"].items())
                print(f"[{r}] {tree:28s} us CPU per move, by labels: {cells}  (load {result['load']:.1f})",
                      flush=True)


if __name__ == "__main__":
    main()
