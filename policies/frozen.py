"""The base of every policy model: frozen (hashable, safe to share across requests), unknown keys rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    """Immutable config model; a key the model does not declare is a validation error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
