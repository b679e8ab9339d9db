"""The policy's `output_checks:` blocks: which checks judge what a pool answered, and what a failure does.

A block may sit at the top level of the policy, on a pool (`pools.<name>.output_checks`) and on a tenant
(`tenants.<name>.output_checks`). For each check the most specific block that sets it wins: the tenant's, then
the answering pool's, then the top level's; a check no block sets does not run. The checks themselves are the
gateway's (`gateway.checking.checks`):

- `json`: a request with `response_format` `json_object` answered with text that is not a JSON object, or
  `json_schema` answered with JSON that does not validate against the request's schema;
- `tool_calls`: a tool call that names no tool of the request, or whose arguments do not parse or do not validate
  against the tool's `parameters` schema;
- `empty`: an answer with no text and no tool call;
- `repetition`: an answer cut by its token limit (`finish_reason: length`) inside a repetition loop: one n-gram of
  `repetition.ngram` words repeated at least `repetition.max_repeats` times in its last 200 words.

Actions: `escalate` (answer again on the next pool up, through the same tenant decision as cascade escalations:
`policies.escalation`), `retry` (answer again on the same pool, once), `flag` (keep the answer; header
`x-cascade-output-check` and the metric say it failed), `off` (do not run; a tenant can turn off what the pool
asks for). Only JSON answers can be replaced: a streamed answer has left before it can be judged, so streams flag.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from policies.frozen import Frozen

__all__ = ["CHECKS", "CheckAction", "OutputChecks", "Repetition", "resolve"]

CheckAction = Literal["escalate", "retry", "flag", "off"]
CHECKS = ("json", "tool_calls", "empty", "repetition")


class Repetition(Frozen):
    """What counts as a repetition loop in an answer cut by its token limit."""

    ngram: int = Field(default=4, ge=1, le=32, description="words per repeated n-gram")
    max_repeats: int = Field(default=8, ge=2, le=1000, description="times one n-gram may occur in the last 200 "
                             "words before the answer counts as a loop")


class OutputChecks(Frozen):
    """Per check, its action; unset (null) inherits from the less specific block (see the module docstring)."""

    json_: CheckAction | None = Field(default=None, alias="json", description="response_format json_object / "
                                      "json_schema answered with text that does not parse or validate")
    tool_calls: CheckAction | None = Field(default=None, description="tool calls whose arguments do not parse or "
                                           "validate against the tool's parameters")
    empty: CheckAction | None = Field(default=None, description="an answer with no text and no tool call")
    repetition: CheckAction | None = Field(default=None, description="an answer cut by max_tokens in a loop")
    loop: Repetition | None = Field(default=None, description="the repetition check's bounds (default: 4-grams, "
                                    "8 repeats)")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("json_", "tool_calls", "empty", "repetition", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        """YAML reads a bare `off` as false: that is what ops meant."""
        return "off" if value is False else value

    def action(self, check: str) -> CheckAction | None:
        return getattr(self, "json_" if check == "json" else check)  # type: ignore[no-any-return]


def resolve(blocks: tuple[OutputChecks | None, ...]) -> tuple[dict[str, CheckAction], Repetition]:
    """The checks that run and their actions, from blocks ordered most specific first; `off` ones left out."""
    actions: dict[str, CheckAction] = {}
    loop: Repetition | None = None
    for check in CHECKS:
        for block in blocks:
            action = block.action(check) if block is not None else None
            if action is not None:
                if action != "off":
                    actions[check] = action
                break
    for block in blocks:
        if block is not None and block.loop is not None:
            loop = block.loop
            break
    return actions, loop or Repetition()
