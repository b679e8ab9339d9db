"""How a vLLM engine starts its processes: on CPU, forked from the API server instead of spawned.

A vLLM engine is three processes: the API server, the engine core it starts, and the model worker the engine core
starts. vLLM makes them with Python's `multiprocessing` and, on the CPU platform, always with `spawn`
(`CpuPlatform.check_and_update_config` sets `VLLM_WORKER_MULTIPROC_METHOD=spawn`, whatever the environment says):
each child is a fresh interpreter that imports torch and vLLM again, which is most of an engine's start. Measured on
the 2-core development machine (the demo micro engine from its command to `/health`, every process of its tree
counted; BENCHMARKS.md "Engine start"): 50.5 s of wall time and 50.4 core-seconds spawned, 20.2 s and 20.3
core-seconds forked. An engine start is a cold start of a pool scaled to zero, a canary, a pool change, a restart
after a crash.

Forking is what vLLM itself does on a GPU host until CUDA is initialised (its default method); the CPU platform
has no such state: the API server forks the engine core before any model is loaded, and the engine core forks the
worker before the worker loads the model and binds its OpenMP threads to its cores (`init_cpu_threads_env`).

`CASCADE_VLLM_START_METHOD` (set in a pool's `engine.env`, or in the gateway's environment) chooses: `fork`,
`spawn`, or `vllm` for vLLM's own choice; unset, a CPU engine forks and a GPU engine keeps vLLM's choice. The
project's vLLM plugin (`backends/engines/vllm_plugin.py`) applies it in every vLLM process when it starts; where this
vLLM has no `get_mp_context` the plugin says so in the engine's log and changes nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from multiprocessing.context import BaseContext
from types import ModuleType

__all__ = ["START_METHODS", "START_METHOD_ENV", "start_method", "use_start_method"]

START_METHOD_ENV = "CASCADE_VLLM_START_METHOD"
START_METHODS = ("fork", "spawn")


def start_method(value: str | None, on_cpu: bool) -> str | None:
    """The start method to set from the variable's value, or None to keep vLLM's. Raises ValueError for a bad one."""
    if value is None:
        return "fork" if on_cpu else None
    chosen = value.strip().lower()
    if chosen == "vllm":
        return None
    if chosen not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV} must be one of {', '.join(START_METHODS)} or 'vllm', not {value!r}")
    return chosen


def _context_of(method: str, on_use: Callable[[], None] | None) -> Callable[[], BaseContext]:
    used_in: set[int] = set()

    def get_mp_context() -> BaseContext:
        if on_use is not None and os.getpid() not in used_in:  # once per process (a forked child is another)
            used_in.add(os.getpid())
            on_use()
        return multiprocessing.get_context(method)

    get_mp_context.cascade_start_method = method  # type: ignore[attr-defined]
    return get_mp_context


def use_start_method(system_utils: ModuleType, method: str, on_use: Callable[[], None] | None = None) -> bool:
    """Make `system_utils.get_mp_context` (vLLM's one place that picks the method) return `method`'s context, in that
    module and in every loaded module that imported the function by name; modules imported later take the new one.
    `on_use` is called the first time each process asks for the context (vLLM's logging is set up by then, where at
    the plugin's start it may not be). False, changing nothing, where the module has no such function. A second call
    keeps the first method."""
    original = getattr(system_utils, "get_mp_context", None)
    if not callable(original):
        return False
    if getattr(original, "cascade_start_method", None) is not None:
        return True
    replacement = _context_of(method, on_use)
    for module in list(sys.modules.values()):
        # vars(), not getattr(): a module's own __getattr__ may import or raise
        if module is not None and vars(module).get("get_mp_context") is original:
            module.get_mp_context = replacement  # type: ignore[attr-defined]
    system_utils.get_mp_context = replacement  # type: ignore[attr-defined]
    return True
