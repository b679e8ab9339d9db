"""Exit codes of `cascade router train`, the contract its callers read (`gateway.learning.train_process`).

- 0: the candidate was written, and promoted unless `--out` or `--no-promote` said not to;
- 1: the training failed (a crash: Python's own exit code for an uncaught exception);
- 2: refused before training (argparse's usage errors; a bad label row, a missing file or artifact);
- `NOT_BETTER` (3): trained and compared, but the candidate is not better than the current artifact, so it
  was not promoted (kept for inspection).

This module imports nothing, so the gateway can read the contract without loading the training code.
"""

from __future__ import annotations

__all__ = ["NOT_BETTER"]

NOT_BETTER = 3  # not 1 (a crash) nor 2 (argparse and the CLI's refusals)
