"""The degradation ladder: hysteresis, hold time (fake clock), each action's combined effect, reloads."""

from __future__ import annotations

from typing import Any

import pytest

from policies.ladder import Ladder, LadderState
from policies.schema import LadderStep

KV = ("kv_cache_usage", "flagship")


def _step(name: str, action: dict[str, Any], signal: str = "kv_cache_usage", pool: str = "flagship",
          enter: float = 0.85, exit_: float = 0.7, hold: float = 30) -> LadderStep:
    return LadderStep.model_validate({"name": name, "signal": signal, "pool": pool, "enter_above": enter,
                                      "exit_below": exit_, "hold_s": hold, "action": action})


RAISE = _step("kv-high", {"type": "raise_threshold", "threshold": 0.8})


def test_enters_above_and_leaves_below_with_hysteresis() -> None:
    ladder = Ladder([RAISE])
    assert ladder.update({KV: 0.85}, now=0).names == ()  # must be strictly above
    assert ladder.update({KV: 0.9}, now=1).names == ("kv-high",)
    assert ladder.update({KV: 0.75}, now=100).names == ("kv-high",)  # between exit and enter: stays
    assert ladder.update({KV: 0.69}, now=101).names == ()
    assert ladder.update({KV: 0.8}, now=102).names == ()  # between: stays out


def test_hold_time_keeps_a_step_active() -> None:
    ladder = Ladder([RAISE])
    ladder.update({KV: 0.9}, now=10)
    assert ladder.update({KV: 0.1}, now=39.9).names == ("kv-high",)  # held for 30 s
    state = ladder.update({KV: 0.1}, now=40)
    assert state.names == () and state.threshold is None


def test_missing_or_nan_signal_leaves_the_step_as_it_is() -> None:
    ladder = Ladder([RAISE])
    ladder.update({KV: 0.9}, now=0)
    assert ladder.update({}, now=100).names == ("kv-high",)
    assert ladder.update({KV: float("nan")}, now=100).names == ("kv-high",)
    assert ladder.update({("kv_cache_usage", "micro"): 0.0}, now=100).names == ("kv-high",)
    assert ladder.state.active[0].since == 0


ACTIONS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"type": "raise_threshold", "threshold": 0.8}, {"threshold": 0.8, "threshold_step": "s"}),
    ({"type": "truncate_context", "max_tokens": 512}, {"truncate_tokens": 512}),
    ({"type": "fallback_pool", "to_pool": "fp8"}, {"remap": {"flagship": ("fp8", "s")}}),
    ({"type": "overflow", "to_pool": "cloud", "from_pool": "micro"}, {"remap": {"micro": ("cloud", "s")}}),
    ({"type": "force_stream"}, {"force_stream": True}),
    ({"type": "shed", "below_priority": 5, "retry_after_s": 12}, {"shed_below_priority": 5, "retry_after_s": 12}),
]


@pytest.mark.parametrize(("action", "effect"), ACTIONS, ids=lambda a: str(a)[:28])
def test_each_action_with_hysteresis_and_hold(action: dict[str, Any], effect: dict[str, Any]) -> None:
    ladder = Ladder([_step("s", action, signal="queue_depth", enter=20, exit_=5, hold=10)])
    key = ("queue_depth", "flagship")
    assert ladder.update({key: 20}, now=0) == LadderState()
    active = ladder.update({key: 21}, now=1)
    for name, value in effect.items():
        assert getattr(active, name) == value
    assert ladder.update({key: 4}, now=10.5).names == ("s",)  # hold: 10 s from entry at t=1
    assert ladder.update({key: 5}, now=12).names == ("s",)  # not below exit
    assert ladder.update({key: 4}, now=12) == LadderState()


def test_steps_combine() -> None:
    steps = [
        _step("a", {"type": "raise_threshold", "threshold": 0.7}),
        _step("b", {"type": "raise_threshold", "threshold": 0.9}),
        _step("c", {"type": "truncate_context", "max_tokens": 900}),
        _step("d", {"type": "truncate_context", "max_tokens": 300}),
        _step("e", {"type": "fallback_pool", "to_pool": "fp8"}),
        _step("f", {"type": "overflow", "to_pool": "cloud"}),  # same source: the earlier step wins
        _step("g", {"type": "overflow", "to_pool": "cloud", "from_pool": "fp8"}),
        _step("h", {"type": "shed", "below_priority": 1, "retry_after_s": 60}),
        _step("i", {"type": "shed", "below_priority": 3, "retry_after_s": 10}),
    ]
    state = Ladder(steps).update({KV: 0.99}, now=0)
    assert state.names == tuple("abcdefghi")
    assert (state.threshold, state.threshold_step, state.truncate_tokens) == (0.9, "b", 300)
    assert state.route("flagship") == ("cloud", ("e", "g"))
    assert state.route("micro") == ("micro", ())
    assert (state.shed_below_priority, state.retry_after_s) == (3, 60)
    assert state.shed_retry_after(2) == 60 and state.shed_retry_after(3) is None


def test_reload_carries_active_steps_by_name() -> None:
    old = Ladder([RAISE])
    old.update({KV: 0.9}, now=5)
    renamed = _step("other", {"type": "force_stream"})
    new = Ladder([RAISE, renamed], carry_from=old)
    assert new.state.names == ("kv-high",) and new.state.active[0].since == 5
    assert Ladder([renamed], carry_from=old).state == LadderState()


def test_scope_pool_shapes_only_requests_routed_to_the_watched_pool() -> None:
    steps = [_step("trunc", {"type": "truncate_context", "max_tokens": 100}, signal="queue_depth", enter=5, exit_=1),
             _step("shed", {"type": "shed", "below_priority": 3, "retry_after_s": 9}, signal="queue_depth", enter=5,
                   exit_=1),
             _step("stream", {"type": "force_stream"}, signal="queue_depth", enter=5, exit_=1),
             _step("fp8", {"type": "fallback_pool", "to_pool": "fp8"}, signal="queue_depth", enter=5, exit_=1)]
    state = Ladder(steps).update({("queue_depth", "flagship"): 10}, now=0)
    assert state.names == ("trunc", "shed", "stream", "fp8")
    flagship, micro, unrouted = state.applying_to("flagship"), state.applying_to("micro"), state.applying_to(None)
    assert (flagship.truncate_tokens, flagship.force_stream, flagship.shed_retry_after(0)) == (100, True, 9)
    for other in (micro, unrouted):
        assert (other.truncate_tokens, other.force_stream, other.shed_retry_after(0)) == (None, False, None)
        assert other.names == state.names and other.route("flagship") == ("fp8", ("fp8",))  # routing stays whole
    assert micro.applying_to("flagship") == flagship  # computed from `active`, not from an earlier view
    calm = Ladder(steps).update({("queue_depth", "flagship"): 0}, now=0)
    assert calm.names == () and all(calm.applying_to(p) is calm for p in ("flagship", "micro", None))  # no copy


def test_scope_all_shapes_every_request() -> None:
    step = LadderStep.model_validate({"name": "shed", "signal": "queue_depth", "pool": "flagship", "enter_above": 5,
                                      "exit_below": 1, "scope": "all",
                                      "action": {"type": "shed", "below_priority": 3}})
    state = Ladder([step]).update({("queue_depth", "flagship"): 10}, now=0)
    assert all(state.applying_to(p).shed_retry_after(0) == 30 for p in ("flagship", "micro", None))
    with pytest.raises(ValueError, match="scope"):
        LadderStep.model_validate({**step.model_dump(), "scope": "tenant"})
