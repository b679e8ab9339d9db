"""A pool's tool calling: the vLLM tool-call parser that turns the model's text into `tool_calls`.

With a `tool_calling` block the engine starts with `--enable-auto-tool-choice --tool-call-parser PARSER` (and
`--chat-template` when one is named), so `tool_choice: "auto"` works; without it the engine answers 400 to an auto
tool choice. A named function or `"required"` is served either way: vLLM constrains the output to the function's
JSON schema. The parser must match the format the model was trained to write calls in (`hermes` for Qwen and
Hermes models, `llama3_json` for Llama 3.1+, `mistral`, `pythonic` for models that write `[f(x=1)]`, ...: vLLM's
`--tool-call-parser` list); the demo models are random and write no format, so the shipped policies use `pythonic`,
the parser that needs no special tokens in the vocabulary (vLLM's `hermes` refuses to start without them).
"""

from __future__ import annotations

from pydantic import Field

from policies.frozen import Frozen

__all__ = ["ToolCalling"]


class ToolCalling(Frozen):
    """`engine.tool_calling` of a local pool."""

    parser: str = Field(pattern=r"^[a-z0-9_]+$", description="vLLM --tool-call-parser: hermes, llama3_json, "
                        "mistral, pythonic, ... (the format the model writes tool calls in)")
    chat_template: str | None = Field(default=None, min_length=1, description="vLLM --chat-template: a Jinja "
                                      "template file that renders `tools` into the prompt, where the model's own "
                                      "template does not")
