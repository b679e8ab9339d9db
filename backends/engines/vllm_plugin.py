"""A vLLM general plugin (entry point `vllm.general_plugins` in pyproject.toml): every vLLM process of this
environment (API server, engine core, model worker) runs `register()` when it starts.

What it changes: how long a CPU engine's model worker busy-polls after its last message. The worker reads the
engine core's scheduler output from a shared-memory queue and, for `busy_loop_s` after each read (1 s in vLLM
0.32, not configurable), spins on `sched_yield` instead of waiting on its socket. During decoding the steps come
back to back, so the spin saves a wake-up per step; between requests it burns a whole core: measured on the
2-core development machine (`loadtest.bench.idle_spin`), a demo engine answering one short request every 0.5 s
used 1.00 of a core in its worker (0.03 in its engine core), every 2 s 0.50. On a CPU host those cores are the
ones the API server, the gateway and the other engines need. The engine core reads the worker's replies the same
way and is capped with it: during a step longer than the cap it waits on its socket and is woken when the reply is
written (tens of microseconds against steps of milliseconds; busy throughput was not lower in the benchmark).

`CASCADE_VLLM_IDLE_SPIN_S` sets the spin (seconds, at most vLLM's own); unset, a CPU engine spins
`CPU_IDLE_SPIN_S` (long enough to span the gap between two decoding steps) and a GPU engine keeps vLLM's
default; `vllm` keeps vLLM's default everywhere. Where this vLLM has no such parameter the plugin says so in the
engine's log and changes nothing.

It also starts a CPU engine's engine core and model worker by forking instead of spawning
(`backends.engines.vllm_start`, `CASCADE_VLLM_START_METHOD`), and lets a completions request skip turning its tokens
back into text (`NO_DETOKENIZE_XARG`), which the quantization evaluation's scoring requests spend most of their time on.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from backends.engines.vllm_start import START_METHOD_ENV, start_method, use_start_method

__all__ = ["CPU_IDLE_SPIN_S", "IDLE_SPIN_ENV", "NO_DETOKENIZE_XARG", "cap_idle_spin", "idle_spin_s", "register",
           "skip_detokenize_on_request"]

IDLE_SPIN_ENV = "CASCADE_VLLM_IDLE_SPIN_S"
CPU_IDLE_SPIN_S = 0.02
NO_DETOKENIZE_XARG = "cascade_detokenize"
"""`"vllm_xargs": {"cascade_detokenize": 0}` on a `/v1/completions` request: vLLM does not detokenize it (its text is
empty and each logprob's `decoded_token` null; token ids and logprobs are as ever). With `prompt_logprobs: 1024` the
API server otherwise decodes 1,024 tokens a position one at a time: 80% of its CPU in a py-spy profile, 1.5 s a
request on the demo flagship. A vLLM without this plugin ignores the argument. Not taken with `stop` strings, which
need the text."""
_COMPLETIONS_PROTOCOL = "vllm.entrypoints.openai.completion.protocol"
T = TypeVar("T")
_log = logging.getLogger("vllm.cascade")
"""Under vLLM's logger, whose handler writes to the engine's log in vLLM's format (a logger of this module's own name
has no handler in a vLLM process: only its warnings reached the log, through logging's last resort)."""


def idle_spin_s(value: str | None, on_cpu: bool) -> float | None:
    """The spin to set from the variable's value, or None to keep vLLM's. Raises ValueError for a bad value."""
    if value is None:
        return CPU_IDLE_SPIN_S if on_cpu else None
    if value.strip().lower() == "vllm":
        return None
    spin = float(value)
    if not spin >= 0:  # also NaN
        raise ValueError(f"{IDLE_SPIN_ENV} must be a number of seconds >= 0 or 'vllm', not {value!r}")
    return spin


def _capped(init: Callable[..., None], spin: float) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        bound.arguments["busy_loop_s"] = min(float(bound.arguments["busy_loop_s"]), spin)
        init(*bound.args, **bound.kwargs)

    patched.cascade_idle_spin_s = spin  # type: ignore[attr-defined]
    return patched


def cap_idle_spin(spin_condition: Any, spin: float) -> bool:
    """Cap `spin_condition`'s `busy_loop_s` at `spin` for every instance made from now on (once: a second call keeps
    the first cap). False, changing nothing, where its `__init__` takes no `busy_loop_s`."""
    init = getattr(spin_condition, "__init__", None)
    if init is None or "busy_loop_s" not in inspect.signature(init).parameters:
        return False
    if getattr(init, "cascade_idle_spin_s", None) is None:
        spin_condition.__init__ = _capped(init, spin)
    return True


def skip_detokenize_on_request(request_class: Any) -> bool:
    """Make `request_class.to_sampling_params` (vLLM's `CompletionRequest`) give `detokenize=False` to a request
    whose `vllm_xargs` hold `NO_DETOKENIZE_XARG: 0` and no `stop` strings (once: a second call keeps the first).
    False, changing nothing, where the class has no such method."""
    method = getattr(request_class, "to_sampling_params", None)
    if method is None:
        return False
    if getattr(method, "cascade_detokenize", False):
        return True

    @functools.wraps(method)
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = method(self, *args, **kwargs)
        if (params.extra_args or {}).get(NO_DETOKENIZE_XARG) == 0 and not params.stop:
            params.detokenize = False
        return params

    patched.cascade_detokenize = True  # type: ignore[attr-defined]
    request_class.to_sampling_params = patched
    return True


def register() -> None:
    """vLLM calls this in each of its processes (more than once is harmless): the idle spin's cap, the start method
    of the processes it starts (`backends.engines.vllm_start`) and, in the API server, `NO_DETOKENIZE_XARG`."""
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    _cap_spin(on_cpu)
    _choose_start_method(on_cpu)
    # only where the API server has imported it (its forked children hold it too): a spawned engine core or worker
    # serves no HTTP, and importing the OpenAI layer there would cost it seconds of start
    protocol = sys.modules.get(_COMPLETIONS_PROTOCOL)
    if protocol is not None and not skip_detokenize_on_request(getattr(protocol, "CompletionRequest", None)):
        _log.warning("cascade: this vLLM's CompletionRequest has no to_sampling_params: %s is ignored",
                     NO_DETOKENIZE_XARG)


def _setting(env: str, parse: Callable[[str | None, bool], T | None], on_cpu: bool, what: str) -> T | None:
    """`parse` of the variable `env` (None: keep vLLM's own); a bad value is logged and vLLM's own kept."""
    try:
        return parse(os.environ.get(env), on_cpu)
    except ValueError as exc:
        _log.warning("cascade: %s; vLLM's own %s kept", exc, what)
        return None


def _cap_spin(on_cpu: bool) -> None:
    spin = _setting(IDLE_SPIN_ENV, idle_spin_s, on_cpu, "idle spin")
    if spin is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    if not cap_idle_spin(getattr(shm_broadcast, "SpinCondition", None), spin):
        _log.warning("cascade: this vLLM has no SpinCondition(busy_loop_s): its idle spin is left as it is")


def _choose_start_method(on_cpu: bool) -> None:
    method = _setting(START_METHOD_ENV, start_method, on_cpu, "start method")
    if method is None:
        return
    from vllm.utils import system_utils

    def say() -> None:
        _log.info("cascade: this engine's processes start by %s (%s)", method, START_METHOD_ENV)

    if not use_start_method(system_utils, method, say):
        _log.warning("cascade: this vLLM has no get_mp_context: its processes start as it chooses")
