"""The vLLM plugin's idle-spin cap, on a stand-in class (fast). That a real CPU engine's worker stops spinning
between requests is `tests/backends/engines/test_supervisor.py::test_real_engines_serve_side_by_side`'s."""

from __future__ import annotations

import math

import pytest

from backends.engines.vllm_plugin import CPU_IDLE_SPIN_S, cap_idle_spin, idle_spin_s


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
