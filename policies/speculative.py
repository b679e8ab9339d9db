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

__all__ = ["DraftSpeculation", "NgramSpeculation", "Speculation", "describe", "tokens_per_step"]

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


def tokens_per_step(num_speculative_tokens: int, acceptance: float) -> float:
    """Tokens one verification step yields on average when each drafted token is accepted with probability
    `acceptance` independently of the others (the expected-length formula of speculative sampling): the
    accepted prefix plus the one token the model adds itself. 1 at acceptance 0, k+1 at acceptance 1."""
    if acceptance >= 1:
        return float(num_speculative_tokens + 1)
    return (1 - acceptance ** (num_speculative_tokens + 1)) / (1 - acceptance)


def describe(speculation: Speculation) -> list[str]:
    """What a pool's `speculative` block does, for `cascade policy explain` (offline: no engine asked)."""
    k = speculation.num_speculative_tokens
    if isinstance(speculation, NgramSpeculation):
        how = (f"ngram (prompt lookup): the last {speculation.prompt_lookup_max}..{speculation.prompt_lookup_min} "
               f"tokens are looked up earlier in the prompt and answer, and the {k} tokens that followed them "
               "there are proposed; no draft model")
        fits = "wins where answers copy their input (extraction, rewriting, code edits); little on open chat"
    else:
        how = (f"draft model {speculation.model} proposes {k} tokens per step (it must share the model's "
               "tokenizer; its weights and KV cache are on every replica)")
        fits = "wins where the draft predicts the model well; costs the draft's own decoding on every step"
    yields = ", ".join(f"{tokens_per_step(k, a):.2f} at {a:g}" for a in (0.3, 0.6, 0.9))
    return [f"speculative: {how}",
            f"  one verification step yields 1..{k + 1} tokens; by acceptance rate: {yields}",
            f"  {fits}; the measured rate is cascade_pool_spec_decode_acceptance"]
