"""Speculative decoding of a local pool's engine: a cheap proposer guesses the next few tokens and the model
checks them all in one forward pass, so each accepted guess is a token that cost no decoding step of its own.

Two proposers, chosen by `method`:

- `ngram` (prompt lookup): the guess is what followed the last `prompt_lookup_min`..`prompt_lookup_max` tokens
  the last time they appeared in the prompt or the answer so far. Free (no second model, no memory); it wins on
  work that copies its input (extraction, rewriting, code edits) and costs a little on open text, where a
  guess seldom matches.
- `draft`: a small model sharing the target's tokenizer proposes. It wins on any text the small model predicts
  well, at the price of its weights and KV cache on every replica.

`backends.engines.args` renders either to vLLM's `--speculative-config` JSON; what can only be checked where
the engine runs (the draft's directory and vocabulary) is checked by `backends.machine_checks`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from policies.frozen import Frozen

__all__ = ["DraftSpeculation", "NgramSpeculation", "Speculation"]

_TOKENS = Field(ge=1, le=16, description="tokens proposed per step; each one the model rejects is work lost")


class NgramSpeculation(Frozen):
    """Prompt lookup: no draft model. vLLM's own default window is 5..5; 2..4 matches short repeated spans."""

    method: Literal["ngram"]
    num_speculative_tokens: int = _TOKENS
    prompt_lookup_min: int = Field(default=2, ge=1, le=16, description="shortest n-gram looked up")
    prompt_lookup_max: int = Field(default=4, ge=1, le=16, description="longest n-gram looked up (tried first)")

    @model_validator(mode="after")
    def _window(self) -> NgramSpeculation:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min {self.prompt_lookup_min} > prompt_lookup_max "
                             f"{self.prompt_lookup_max}: no n-gram length fits; swap them")
        return self


class DraftSpeculation(Frozen):
    """A draft model proposes. It must share the target's tokenizer (vLLM compares token ids)."""

    method: Literal["draft"]
    num_speculative_tokens: int = _TOKENS
    model: str = Field(min_length=1, description="the draft's directory or hub id; 'demo:draft' for the demo "
                       "micro model's draft")


Speculation = Annotated[NgramSpeculation | DraftSpeculation, Field(discriminator="method")]
"""One pool's speculative decoding, by `method`."""
