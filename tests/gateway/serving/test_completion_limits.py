"""A completion limit the pool's context cannot hold is a 400 that names the field the client sent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.serving.endpoints import COMPLETIONS, RESPONSES, NativeBody
from gateway.serving.schema import ChatRequest
from gateway.serving.service import _check_limits
from policies.decide import RouteDecision
from policies.schema import Policy

POLICY = Policy.model_validate({
    "pools": {"micro": {"type": "local", "price": {"input_per_mtok": "1", "output_per_mtok": "1"},
                        "engine": {"model": "demo:micro", "served_name": "micro", "max_model_len": 1024,
                                   "base_port": 8101}}},
    "routing": {"micro_pool": "micro", "flagship_pool": "micro"}})
DECISION = RouteDecision("micro", "micro", None, "pinned", "", "1")


@pytest.mark.parametrize(("limit", "native", "field"), [
    ({"max_tokens": 2000}, None, "max_tokens"),
    ({"max_completion_tokens": 2000}, None, "max_completion_tokens"),
    ({"max_tokens": 2000}, NativeBody(RESPONSES, {}), "max_output_tokens"),
    ({"max_tokens": 2000}, NativeBody(COMPLETIONS, {}), "max_tokens"),
])
def test_the_error_names_the_clients_field(limit: dict[str, Any], native: NativeBody | None, field: str) -> None:
    request = ChatRequest.model_validate({"model": "micro", "messages": [{"role": "user", "content": "hi"}], **limit})
    with pytest.raises(BadRequest) as caught:
        _check_limits(SimpleNamespace(policy=POLICY), DECISION, request, native)  # type: ignore[arg-type]
    assert caught.value.param == field and field in caught.value.message
    fits = ChatRequest.model_validate({"model": "micro", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 100})
    _check_limits(SimpleNamespace(policy=POLICY), DECISION, fits, native)  # type: ignore[arg-type]
