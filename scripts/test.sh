#!/usr/bin/env bash
# Quick start, step 2: the tests. Sets up what is missing, makes sure Redis answers, then runs pytest:
# unit tests, integration tests against the real Redis, and end-to-end tests with real vLLM engines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
# the tests assert the tiny demo models' behaviour; the quick start's real micro model is for people
unset CASCADE_DEMO_MICRO
# The cost report page is checked in real headless Chromium (Debian's package) when it can be installed.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[test] installing chromium for the report-page test (apt)"
  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "[test] chromium not installed: that test will skip"
fi
.venv/bin/python - <<'PY'
from gateway.cli.demo import ensure_redis
import os
print("[test]", ensure_redis(os.environ.get("CASCADE_REDIS_URL", "redis://127.0.0.1:6379/0")))
PY
exec .venv/bin/python -m pytest "$@"
