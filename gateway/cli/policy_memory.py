"""The label memory `cascade policy explain` applies, as the gateway does: which memory (`memory_name`: the policy's
`learning.label_memory.scope` for the request's tenant, or `--memory NAME`), where it lives (`memory_folder`), and the
request's score moved by it (`scored`: the shipped classifier's score, then `LabelMemories.adjust`, the gateway's own
move), for a two-pool policy's threshold as for a tiers policy's rules. A `--memory` that names no memory is refused
with the memories there are; a memory the scope names and the store lacks moves nothing, as in the gateway."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from policies.context import RouteContext
from policies.decide import thresholds_in_use
from policies.ladder import LadderState
from policies.loader import LoadedPolicy

__all__ = ["memory_folder", "memory_name", "scored"]


def memory_name(loaded: LoadedPolicy, tenant: str, given: str | None) -> str | None:
    """The label memory the gateway applies to `tenant`'s requests under `loaded` (`learning.label_memory.scope`),
    or the one `given`; None for none."""
    from router_models.serving.memory_file import SHARED

    if given is not None:
        return given
    scope = loaded.policy.learning.label_memory.scope
    return None if scope == "none" else tenant if scope == "tenant" else SHARED


def memory_folder(store: Path | None, name: str, given: bool) -> Path | None:
    """`<store>/memory`; ValueError for a `given` name that is malformed or names no memory there (a tenant whose
    name is no memory name gets none, as in the gateway: None)."""
    from router_models.serving.artifact import default_store_dir
    from router_models.serving.memory_apply import memory_names
    from router_models.serving.memory_file import memory_path

    root = store or default_store_dir()
    try:
        path = memory_path(root, name)
    except ValueError as exc:
        if given:
            raise ValueError(f"--memory: {exc}") from exc
        return None
    if given and not path.is_file():
        there = memory_names(root)
        raise ValueError(f"--memory {name!r}: no label memory {path} (memories in {path.parent}: "
                         f"{', '.join(there) if there else 'none'})")
    return path.parent


def scored(loaded: LoadedPolicy, ctx: RouteContext, messages: Any, args: argparse.Namespace,
           threshold: float | None = None) -> tuple[float, str]:
    """(score, where it came from): the shipped classifier's score of `messages` (the gateway's scoring text and
    shape), refined near `threshold` (None: the policy's own) as the gateway's router refines it, moved by the label
    memory the gateway would apply (module docstring), as its router moves it before the threshold and the rules read
    it. Raises ValueError for a `--memory` that names no memory."""
    from gateway.serving.routing.label_memories import LabelMemories
    from router_models.serving.classifier_scorer import load_scorer
    from router_models.serving.scorer import ScorerViews, read_conversation

    given = getattr(args, "memory", None)
    name = memory_name(loaded, ctx.tenant, given)
    folder = None if name is None else memory_folder(getattr(args, "store", None), name, given is not None)

    async def run() -> tuple[float, str]:
        scorer = load_scorer()
        scorer.refine_near(*thresholds_in_use(loaded.policy, threshold, LadderState()))
        try:
            text, shape = read_conversation(messages)
            score, _ = await scorer.score_one(text, shape)
            if folder is None or name is None:
                return score, "classifier"
            memories = LabelMemories(folder, lambda: scorer)
            await memories.refresh()
            moved = memories.adjust(name, ScorerViews.of(scorer), text, score, shape)
            if moved is None:
                return score, "classifier"
            return moved.score, (f"classifier {score:.4f}, moved by label memory {moved.name}@{moved.labels} "
                                 f"{moved.score - score:+.4f}")
        finally:
            await scorer.aclose()

    return asyncio.run(run())
