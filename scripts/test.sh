#!/usr/bin/env bash
# Quick start, step 2: the tests. Sets up what is missing, makes sure Redis answers, then runs pytest:
# unit tests, integration tests against the real Redis, and end-to-end tests with real vLLM engines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/python - <<'PY'
from gateway.demo import ensure_redis
import os
print("[test]", ensure_redis(os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0")))
PY
exec .venv/bin/python -m pytest "$@"
