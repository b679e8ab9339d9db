"""The vLLM plugin's idle-spin cap and its detokenize switch, on stand-in classes (fast). That a real CPU engine's
worker stops spinning between requests, and that its API server skips detokenizing a request that asks, is
`tests/backends/engines/test_supervisor.py::test_real_engines_serve_side_by_side`'s."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from backends.engines.vllm_plugin import (
    CPU_IDLE_SPIN_S,
    NO_DETOKENIZE_XARG,
    cap_idle_spin,
    idle_spin_s,
    skip_detokenize_on_request,
)


class _SpinCondition:
    """vLLM 0.32's signature: `SpinCondition(is_reader, context, notify_address, busy_loop_s=1)`."""

    def __init__(self, is_reader: bool, context: object, notify_address: str, busy_loop_s: float = 1) -> None:
        self.busy_loop_s = busy_loop_s


def test_the_setting_reads_seconds_or_vllm_and_defaults_by_platform() -> None:
    assert idle_spin_s(None, on_cpu=True) == CPU_IDLE_SPIN_S and idle_spin_s(None, on_cpu=False) is None
    assert idle_spin_s("vllm", on_cpu=True) is None and idle_spin_s(" VLLM ", on_cpu=False) is None
    assert idle_spin_s("0.1", on_cpu=False) == 0.1 and idle_spin_s("0", on_cpu=True) == 0.0
    for bad in ("-1", "soon", "nan", ""):
        with pytest.raises(ValueError):
            idle_spin_s(bad, on_cpu=True)


def test_the_cap_lowers_the_default_and_keeps_a_shorter_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_SpinCondition, "__init__", _SpinCondition.__init__)  # restored after the test
    assert cap_idle_spin(_SpinCondition, 0.02)
    assert _SpinCondition(True, None, "ipc://x").busy_loop_s == 0.02
    assert _SpinCondition(True, None, "ipc://x", busy_loop_s=5).busy_loop_s == 0.02
    assert _SpinCondition(True, None, "ipc://x", 0.001).busy_loop_s == 0.001  # positional, below the cap
    assert cap_idle_spin(_SpinCondition, 0.5)  # loaded again in the same process: the first cap stays
    assert math.isclose(_SpinCondition(False, None, "ipc://x").busy_loop_s, 0.02)


def test_a_class_without_the_parameter_is_left_alone() -> None:
    class Other:
        def __init__(self, is_reader: bool) -> None:
            self.is_reader = is_reader

    init = Other.__init__
    assert not cap_idle_spin(Other, 0.02) and Other.__init__ is init
    assert not cap_idle_spin(None, 0.02)


class _CompletionRequest:
    """vLLM 0.32's `CompletionRequest.to_sampling_params(max_tokens, default_sampling_params=None)`, reduced to what
    the switch reads: `vllm_xargs` become `extra_args`."""

    def __init__(self, xargs: dict[str, Any] | None, stop: list[str] | None = None) -> None:
        self.xargs, self.stop = xargs, stop

    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict[str, Any] | None = None) -> Any:
        return SimpleNamespace(max_tokens=max_tokens, extra_args=self.xargs, stop=self.stop or [], detokenize=True)


def test_a_request_that_asks_is_not_detokenized_and_every_other_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_CompletionRequest, "to_sampling_params", _CompletionRequest.to_sampling_params)
    assert skip_detokenize_on_request(_CompletionRequest)
    assert skip_detokenize_on_request(_CompletionRequest)  # loaded again: wrapped once
    asked = _CompletionRequest({NO_DETOKENIZE_XARG: 0, "other": 1}).to_sampling_params(1)
    assert asked.detokenize is False and asked.max_tokens == 1
    for request in (_CompletionRequest(None), _CompletionRequest({NO_DETOKENIZE_XARG: 1}),
                    _CompletionRequest({"other": 0}), _CompletionRequest({NO_DETOKENIZE_XARG: 0}, stop=["\n"])):
        assert request.to_sampling_params(4, default_sampling_params={}).detokenize is True  # stop strings need text
    inner = getattr(_CompletionRequest.to_sampling_params, "__wrapped__", None)
    assert inner is not None and not hasattr(inner, "__wrapped__")


def test_a_request_class_without_the_method_is_left_alone() -> None:
    assert not skip_detokenize_on_request(None) and not skip_detokenize_on_request(object)
