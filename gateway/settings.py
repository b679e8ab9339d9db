"""Process settings: where the policy is, what to start, which stores to use. Parsed once, frozen."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from backends.transports import DEFAULT_TRANSPORT, Transport

__all__ = ["Settings", "default_home"]


def default_home() -> Path:
    """State folder for models, logs and the ledger outbox: $CASCADE_HOME or ./.cascade."""
    return Path(os.environ.get("CASCADE_HOME", ".cascade")).resolve()


@dataclass(frozen=True, slots=True)
class Settings:
    policy_path: Path
    redis_url: str = field(default_factory=lambda: os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    redis_prefix: str = "cascade:"
    scorer: Literal["classifier", "length", "none"] = "classifier"
    start_engines: bool = True
    ledger: Literal["redis", "memory"] = "redis"
    ledger_retention_days: int = 35  # per-request records and idempotency keys; rollups are kept
    transport: Transport = DEFAULT_TRANSPORT
    max_body_bytes: int = 1 << 20
    max_messages: int = 1024
    max_tokens_cap: int | None = None  # clamp on max_tokens / max_completion_tokens (None: pool context)
    deadline_s: float = 300.0  # until the whole answer (non-streaming) or the first chunk (streaming)
    admin_key: str | None = field(default_factory=lambda: os.environ.get("CASCADE_ADMIN_KEY"))
    home: Path = field(default_factory=default_home)
    probe_interval_s: float = 1.0
    policy_watch_interval_s: float = 2.0  # 0 disables reloading on file change
    request_log: Path | None = None  # JSONL replay log (holds prompts: off unless set)

    @property
    def outbox_dir(self) -> Path:
        return self.home / "outbox"
