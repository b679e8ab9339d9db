"""Any process that loads the scorer runs BLAS on one thread (router_models.serving.blas_threads): the scorer's
products are small, and OpenBLAS's threads woken and spinning for each cost three times the CPU of the scoring
itself at 100 req/s. In a child process: the limit is process-wide and lasts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from router_models.serving.blas_threads import THREAD_VARIABLES
from tests.servers import ROOT

CHILD = """
import json
from threadpoolctl import threadpool_info
from router_models.serving.classifier_scorer import load_scorer
before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
load_scorer(None)
print(json.dumps({"before": before, "after": [p["num_threads"] for p in threadpool_info()
                                              if p["user_api"] == "blas"]}))
"""


def test_loading_the_scorer_limits_blas_to_one_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] and set(got["after"]) == {1}, got
