"""One BLAS thread in a gateway process: `router_models.serving.blas_threads`, which the scorer's `load_scorer` also
calls (any process that scores needs it, the scorer benchmark and `cascade router score` as much as the gateway)."""

from __future__ import annotations

from router_models.serving.blas_threads import THREAD_VARIABLES, one_blas_thread

__all__ = ["THREAD_VARIABLES", "one_blas_thread"]
