"""Input guards of a tenant (`tenants.<name>.guards`): what the gateway checks in a prompt before routing it.

Three guards, each off unless set:
- `pii`: personal data and secrets in the message text, redacted (each match replaced by `[REDACTED:<kind>]` in
  what the engine sees) or refused (400 `pii_detected`, naming the kinds found, never the text);
- `max_prompt_chars` / `max_prompt_tokens`: the prompt's size (all message text; tokens estimated as the rate
  limiter estimates them, `policies.context.estimate_tokens`), refused past the bound (400 `prompt_too_large`);
- `languages`: the languages the tenant's users may write in (ISO 639-1 codes as CLD2 names them), refused when
  the user turns are reliably detected as another one (400 `language_not_allowed`); a text too short or too mixed
  to tell is let through.
"""

from __future__ import annotations

from typing import Any, Literal

import pycld2
from pydantic import Field, field_validator, model_validator

from policies.frozen import Frozen

__all__ = ["PII_KINDS", "Guards", "LanguageGuard", "PiiGuard", "PiiKind"]

PiiKind = Literal["email", "phone", "card", "iban", "secret"]
PII_KINDS: tuple[PiiKind, ...] = ("email", "phone", "card", "iban", "secret")
_LANGUAGE_CODES = frozenset(code for _, code in pycld2.LANGUAGES if not code.startswith("xx-")) - {"un"}


class PiiGuard(Frozen):
    """What counts as personal data or a secret, and what to do with a prompt that holds some."""

    action: Literal["redact", "refuse"] = Field(
        default="redact", description="redact: replace each match with [REDACTED:<kind>] in the messages the "
        "engine sees; refuse: answer 400 pii_detected naming the kinds found")
    kinds: tuple[PiiKind, ...] = Field(
        default=PII_KINDS, min_length=1, description="email; phone (phonenumbers, valid numbers only); card "
        "(13-19 digits of a known card network passing the Luhn check); iban (country format and mod-97 check); "
        "secret (API keys and tokens: sk-, ghp_/github_pat_, AKIA..., xox?-, AIza..., Stripe keys, JWTs, private "
        "key blocks, long mixed-case random strings)")
    phone_regions: tuple[str, ...] = Field(
        default=("US",), description="regions (ISO 3166 alpha-2) whose national phone formats are recognised "
        "without a country code; numbers written with +<country code> are recognised for every region")

    @field_validator("phone_regions")
    @classmethod
    def _known_regions(cls, regions: tuple[str, ...]) -> tuple[str, ...]:
        import phonenumbers  # the policy package stays light to import; the region list is phonenumbers' own

        unknown = [r for r in regions if r not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ValueError(f"unknown phone region(s) {unknown}: use ISO 3166 alpha-2 codes such as US, GB, DE")
        return regions


class LanguageGuard(Frozen):
    """Languages the tenant serves. Judged on the user turns' text (first 2,000 characters) by CLD2."""

    allowed: tuple[str, ...] = Field(min_length=1, description="ISO 639-1 codes, e.g. [en, de]")
    min_chars: int = Field(default=20, ge=1, description="texts shorter than this are not judged (let through)")

    @model_validator(mode="before")
    @classmethod
    def _list_is_allowed(cls, data: Any) -> Any:
        return {"allowed": data} if isinstance(data, list | tuple) else data  # `languages: [en, de]`

    @field_validator("allowed")
    @classmethod
    def _known_codes(cls, codes: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in codes if c not in _LANGUAGE_CODES]
        if unknown:
            raise ValueError(f"unknown language code(s) {unknown}: use ISO 639-1 codes such as en, de, fr "
                             "(Hebrew is iw, as CLD2 names it)")
        return codes


class Guards(Frozen):
    """A tenant's input guards, applied in this order before routing: size, language, PII. None of them is on
    unless set."""

    pii: PiiGuard | None = None
    max_prompt_chars: int | None = Field(default=None, ge=1, description="characters of message text, all turns")
    max_prompt_tokens: int | None = Field(default=None, ge=1, description="estimated prompt tokens (chars / 4), "
                                          "as the rate limiter counts them")
    languages: LanguageGuard | None = None

    @property
    def any(self) -> bool:
        return (self.pii is not None or self.max_prompt_chars is not None or self.max_prompt_tokens is not None
                or self.languages is not None)
