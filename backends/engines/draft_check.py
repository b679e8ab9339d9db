"""Whether a pool's draft model can serve as its draft on this machine, checked before any engine starts.

vLLM compares the draft's token ids with the model's, so the two must share a vocabulary; with different ones
it fails at start-up or accepts nothing. Where both models are directories here (a demo model, a local
checkpoint) their `config.json` vocabulary sizes are compared. A hub id cannot be read offline and is left to
the engine. `demo:draft` shares the tiny micro model's tokenizer, not SmolLM2's (`CASCADE_DEMO_MICRO=smollm2`).
"""

from __future__ import annotations

import json
from pathlib import Path

from backends.engines.args import resolve_model, speculative_config
from policies.schema import EngineSpec
from policies.speculative import DraftSpeculation

__all__ = ["draft_problems"]


def _vocab_size(model: str) -> int | None:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return size if isinstance(size, int) else None


def draft_problems(spec: EngineSpec, models_dir: Path | None = None) -> list[str]:
    """What stops `spec`'s draft model from drafting for its model here (empty: nothing found). Reads the two
    config.json files at most; a demo model not built yet is not judged (it is built before the engine starts)."""
    draft = spec.speculative
    if not isinstance(draft, DraftSpeculation):
        return []
    try:
        draft_dir = str(speculative_config(draft, models_dir)["model"])
        target_dir = resolve_model(spec, models_dir)
    except ValueError as exc:  # an unknown demo:NAME
        return [str(exc)]
    ours, theirs = _vocab_size(target_dir), _vocab_size(draft_dir)
    if ours is not None and theirs is not None and ours != theirs:
        return [f"draft model {draft.model!r} has a vocabulary of {theirs} tokens, the model {spec.model!r} "
                f"{ours}: a draft must share the model's tokenizer (demo:draft drafts for the tiny demo:micro)"]
    return []
