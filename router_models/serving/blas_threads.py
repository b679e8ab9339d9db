"""One BLAS thread in a process that scores (the gateway's, and any other that loads the scorer).

The gateway's BLAS work is small and per request: the in-domain figure's (2,100 x 384) matrix-vector product, the
label memory's neighbours, the classifier's dot products, each well under a millisecond on one core. OpenBLAS's
default (a thread per core) wakes its threads for each of them; on a busy machine they wait for cores the event
loop and the embedder need: measured 4.3 ms per in-domain figure with two threads under load against 0.09 ms with
one (BENCHMARKS.md, "In-domain figure"); at a low request rate the threads' wake-ups (and their spinning while they
wait for the next product) cost more CPU than the whole embedding: 12 ms of process CPU per scored request at 100
req/s against 3.9 ms with one thread (BENCHMARKS.md, "Scorer CPU per distinct prompt"). `cascade serve`, each of its
workers and `classifier_scorer.load_scorer` therefore run BLAS on one thread (set once the app or the scorer is
built, so that every BLAS library loaded by then is limited), unless the operator chose a count
(`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS`). The ONNX embedder has its own thread pool and is not
affected; engines are other processes and keep their own settings.

The same holds for the `tokenizers` library's batch encoding: by default it splits each batch over a thread per core
(rayon), which on two cores cost 24-34% more CPU a text for the scorer's batches of 6-16 (60 against 76-80 us a
text, BENCHMARKS.md "Tokenizing on the scoring thread") and runs beside the two scorer threads that already use both
cores. Since the embedders read ASCII prompts' word pieces themselves (`router_models.embedders.word_pieces`), the
library encodes only the other texts, one a call, and training's; `serial_tokenizers` keeps those on the calling
thread, unless the operator set `TOKENIZERS_PARALLELISM`. `cascade serve`, its workers and `load_scorer` call both
through `scoring_threads`.
"""

from __future__ import annotations

import logging
import os

__all__ = ["THREAD_VARIABLES", "TOKENIZERS_VARIABLE", "one_blas_thread", "scoring_threads", "serial_tokenizers"]

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
TOKENIZERS_VARIABLE = "TOKENIZERS_PARALLELISM"  # read by `tokenizers` at each batch encode
_log = logging.getLogger(__name__)


def one_blas_thread() -> bool:
    """Limit BLAS to one thread in this process for its lifetime; False (nothing changed) where the operator set a
    thread count in the environment."""
    chosen = [name for name in THREAD_VARIABLES if os.environ.get(name)]
    if chosen:
        _log.info("BLAS threads left as %s sets them", chosen[0])
        return False
    import numpy  # noqa: F401  # loads its BLAS: threadpoolctl limits the libraries loaded, not those to come
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    return True


def serial_tokenizers() -> bool:
    """Have `tokenizers` encode batches on the calling thread in this process from now on (module docstring); False
    (nothing changed) where the operator set `TOKENIZERS_PARALLELISM`."""
    if os.environ.get(TOKENIZERS_VARIABLE):
        _log.info("tokenizer threads left as %s=%s sets them", TOKENIZERS_VARIABLE, os.environ[TOKENIZERS_VARIABLE])
        return False
    os.environ[TOKENIZERS_VARIABLE] = "false"
    return True


def scoring_threads() -> None:
    """What a process that scores runs with: `one_blas_thread` and `serial_tokenizers` (each leaves an operator's
    setting alone)."""
    one_blas_thread()
    serial_tokenizers()
