"""The start method of a vLLM engine's processes (`backends.engines.vllm_start`), on stand-in modules (fast). That a
real CPU engine forks its engine core and worker, and what that saves, is
`tests/backends/engines/test_supervisor.py::test_real_engines_serve_side_by_side`'s (the plugin's line in each
engine's log) and BENCHMARKS.md "Engine start"."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from types import ModuleType

import pytest

from backends.engines.vllm_start import start_method, use_start_method


def test_the_setting_reads_a_method_or_vllm_and_defaults_by_platform() -> None:
    assert start_method(None, on_cpu=True) == "fork" and start_method(None, on_cpu=False) is None
    assert start_method("vllm", on_cpu=True) is None and start_method(" VLLM ", on_cpu=False) is None
    assert start_method("spawn", on_cpu=True) == "spawn" and start_method(" Fork ", on_cpu=False) == "fork"
    for bad in ("forkserver", "threads", ""):
        with pytest.raises(ValueError, match="CASCADE_VLLM_START_METHOD"):
            start_method(bad, on_cpu=True)


def _vllms_choice() -> BaseContext:
    return multiprocessing.get_context("spawn")  # as vLLM's CPU platform forces


@pytest.fixture
def vllm_modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    """A stand-in of `vllm.utils.system_utils` and of a module that imported its `get_mp_context` by name (as
    `vllm.v1.engine.utils` does), both in `sys.modules` for the test."""
    system_utils, user = ModuleType("stand_in_system_utils"), ModuleType("stand_in_engine_utils")
    system_utils.get_mp_context = user.get_mp_context = _vllms_choice  # type: ignore[attr-defined]
    sys.modules[system_utils.__name__], sys.modules[user.__name__] = system_utils, user
    try:
        yield system_utils, user
    finally:
        del sys.modules[system_utils.__name__], sys.modules[user.__name__]


def test_every_holder_of_the_function_gets_the_chosen_method(vllm_modules: tuple[ModuleType, ModuleType]) -> None:
    system_utils, user = vllm_modules
    used: list[int] = []
    assert use_start_method(system_utils, "fork", lambda: used.append(1))
    assert user.get_mp_context().get_start_method() == "fork"  # imported before: replaced where it is held
    assert system_utils.get_mp_context().get_start_method() == "fork"  # imported after: the module's new one
    assert use_start_method(system_utils, "spawn")  # applied again in the same process: the first choice stays
    assert user.get_mp_context().get_start_method() == "fork"
    assert used == [1]  # said once in this process, however often the context is asked for


def test_a_vllm_without_the_function_is_left_alone() -> None:
    other = ModuleType("stand_in_other_vllm")
    assert not use_start_method(other, "fork") and not hasattr(other, "get_mp_context")
