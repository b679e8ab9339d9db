"""A pool's `tool_calling` block as vLLM's tool flags, the same for the supervisor's command and the Kubernetes
manifests; the shipped demo policies enable it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from backends.engines.args import engine_command
from policies.loader import load_policy
from policies.pools import LocalPool
from policies.schema import EngineSpec
from policies.tool_calling import ToolCalling

ROOT = Path(__file__).resolve().parents[3]


def test_a_parser_renders_auto_tool_choice_and_its_template() -> None:
    spec = EngineSpec(model="/m", served_name="m", tool_calling=ToolCalling(parser="hermes", chat_template="/t.jinja"))
    cmd = engine_command(spec, 8000)
    i = cmd.index("--tool-call-parser")
    assert cmd[i + 1] == "hermes" and "--enable-auto-tool-choice" in cmd
    assert cmd[cmd.index("--chat-template") + 1] == "/t.jinja"
    plain = engine_command(EngineSpec(model="/m", served_name="m"), 8000)
    assert "--enable-auto-tool-choice" not in plain and "--tool-call-parser" not in plain


def test_a_parser_name_is_checked() -> None:
    with pytest.raises(ValidationError):
        ToolCalling(parser="hermes --evil")


@pytest.mark.parametrize("name", ["default.yaml", "demo-ladder.yaml", "multi-tenant.yaml", "gpu.yaml"])
def test_the_shipped_policies_enable_tool_calling_on_their_answering_pools(name: str) -> None:
    pools = load_policy(ROOT / "policies" / name).policy.pools
    local = {n: p for n, p in pools.items() if isinstance(p, LocalPool)}
    enabled = {n for n, p in local.items() if p.engine.tool_calling is not None}
    assert {"micro", "flagship"} <= enabled, enabled
    for n in enabled:
        assert "--tool-call-parser" in engine_command(local[n].engine, 8000)
