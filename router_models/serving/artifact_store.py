"""Versioned router artifacts: which one the gateway serves, the ones promoted before it, and rollback.

Layout under `<home>/router/` (home: `$CASCADE_HOME`, else `./.cascade`):

    versions/<version>/complexity-router.json + .npz    one folder per promoted artifact, never rewritten
    history.json                                        {"promoted": [<version>, ...]}: the last is current

`current_artifact()` is what the gateway loads when no artifact is named: the last promoted version, or the
artifact shipped in the package when nothing was promoted (or everything was rolled back). `promote` copies
a verified artifact in and appends it; `rollback` drops the last entry (the files stay, for the record).
`history.json` is replaced atomically (write, fsync, rename), so a crash leaves the old or the new history.
A running gateway serves a new current artifact within seconds: it watches `history.json` and swaps its
scorer (`gateway.serving.routing.router_swap`), or at once on `POST /admin/router/reload`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from router_models.serving.artifact import (
    DEFAULT_ARTIFACT,
    ArtifactError,
    default_store_dir,
    load_artifact,
    promoted_artifacts,
    replace_atomically,
    save_artifact,
    servable_artifact,
)

__all__ = ["ArtifactStore", "StoreEntry", "default_store_dir"]


@dataclass(frozen=True)
class StoreEntry:
    """One promoted artifact: its version id and metadata path."""

    version: str
    path: Path


class ArtifactStore:
    """The promoted artifacts under `root` (see the module docstring). Single writer at a time."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_store_dir()

    @property
    def _history_path(self) -> Path:
        return self.root / "history.json"

    def history(self) -> list[StoreEntry]:
        """Promoted versions, oldest first. Raises ArtifactError when history.json is unreadable."""
        return [StoreEntry(version, path) for version, path in promoted_artifacts(self.root)]

    def current_artifact(self) -> Path:
        """The artifact to serve: the last promoted one this code can serve (`artifact.current_artifact_path`:
        one built for other features is passed over), else the package's shipped artifact."""
        return servable_artifact(self.root)

    def promote(self, artifact: Path) -> StoreEntry:
        """Verify `artifact` (metadata .json), write it in as a new version and make it current."""
        art = load_artifact(artifact)
        digest = str(art.metadata.get("payload_sha256", ""))[:12]
        created = str(art.metadata.get("created", "unknown")).replace(":", "").replace("-", "").replace("+", "p")
        version = f"{created}-{digest}"
        target = self.root / "versions" / version
        save_artifact(art, target / DEFAULT_ARTIFACT.name)  # payload first, metadata last
        load_artifact(target / DEFAULT_ARTIFACT.name)  # the copy verifies too, before it becomes current
        versions = [e.version for e in self.history() if e.version != version] + [version]
        self._write_history(versions)
        return StoreEntry(version, target / DEFAULT_ARTIFACT.name)

    def rollback(self) -> Path:
        """Drop the current version; returns the artifact now current. Raises ArtifactError if none was
        promoted (the shipped artifact is already current)."""
        versions = [e.version for e in self.history()]
        if not versions:
            raise ArtifactError(f"nothing to roll back: no artifact was promoted in {self.root}; "
                                f"the shipped artifact {DEFAULT_ARTIFACT} is current")
        self._write_history(versions[:-1])
        return self.current_artifact()

    def _write_history(self, versions: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        replace_atomically(self._history_path, (json.dumps({"promoted": versions}, indent=2) + "\n").encode())
