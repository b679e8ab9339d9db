"""A gateway process runs BLAS on one thread unless the operator chose a count (router_models.serving.blas_threads).
In a child process: the limit is process-wide and lasts, so it must not touch the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from router_models.serving.blas_threads import THREAD_VARIABLES
from tests.servers import ROOT

CHILD = """
import json
from threadpoolctl import threadpool_info
from router_models.serving.blas_threads import one_blas_thread
changed = one_blas_thread()
print(json.dumps({"changed": changed, "threads": [p["num_threads"] for p in threadpool_info()
                                                  if p["user_api"] == "blas"]}))
"""


def _child(**env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    out = subprocess.run([sys.executable, "-c", CHILD], env={**base, **env}, cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_blas_runs_on_one_thread_in_a_gateway_process() -> None:
    got = _child()
    threads = got["threads"]
    assert got["changed"] is True and isinstance(threads, list) and threads and set(threads) == {1}


@pytest.mark.parametrize("variable", THREAD_VARIABLES)
def test_a_count_the_operator_set_is_left_alone(variable: str) -> None:
    assert _child(**{variable: "2"})["changed"] is False
