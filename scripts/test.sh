#!/usr/bin/env bash
# Quick start, step 2: the tests. Sets up what is missing, makes sure Redis answers, then runs pytest:
# unit tests, integration tests against the real Redis, and end-to-end tests with real vLLM engines.
# Arguments go to pytest; while editing, `./scripts/test.sh -m "not engines"` is the fast tier (no engine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
# Bytecode is written (and read back) even where PYTHONDONTWRITEBYTECODE is set, as it is on these machines: without
# it every pytest worker rewrote the asserts of ~540 test and plugin modules again (collection 9.5 s of CPU instead
# of 3.3) and every gateway, CLI and engine process the tests start compiled the modules setup.sh does not warm
unset PYTHONDONTWRITEBYTECODE
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
# In parallel by default (pytest-xdist): the tests with real engines run on one worker, in the order
# tests/conftest.py gives them (shared engines first), but for the chaos run and the int8 demo (groups of their own,
# their engines on the last core), the others spread over the rest. CASCADE_TEST_WORKERS=N sets the workers (0:
# everything in this process); an -n/--numprocesses or -p no:xdist of your own wins.
# The fast tier (`-m "not engines"`) takes 6 workers: its tests wait on sockets and child processes as much as they
# compute (on 2 cores, with bytecode cached: 2 min 52 s with 6, 2 min 59 s with 8, 3 min 22 s with 4; BENCHMARKS.md
# "Test suite"). With engines, 4: the engine tests' worker and three for the rest, which wait on sockets, processes
# and timers as much as they compute (three left the cores a quarter idle in the last minutes: 501-555 s in fresh
# clones of 2026-12-07). The tests that time this host's processes (`timing`) run on the engines' worker after its
# engine tests, since four workers beside the engine starts starved them (BENCHMARKS.md "Test suite").
WORKERS=4
OWN_WORKERS=no
previous=""
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist) OWN_WORKERS=yes ;; esac
  if [ "$previous" = "-m" ] && [ "$arg" = "not engines" ]; then WORKERS=6; fi
  previous=$arg
done
# The workers share two cores: a worker's torch and BLAS thread pools only wait for each other there (the fast tier
# on six workers: 2 min 53-56 s and 332-339 core-seconds with one thread each, 3 min 7 s and 364 with the default
# pools, quiet, 2026-12-05; its CPU-heavy tests on three workers beside the engines: 103 against 116 core-seconds,
# 2026-12-06, BENCHMARKS.md "Test suite"). The engines are as before: vLLM sets a CPU worker's threads to the cores
# it binds it to, and the engine core's torch threads to 1, whatever this says.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} \
  OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
WORKERS=${CASCADE_TEST_WORKERS:-$WORKERS}
PARALLEL=(-n "$WORKERS" --dist loadgroup)
if [ "$WORKERS" = 0 ] || [ "$OWN_WORKERS" = yes ]; then PARALLEL=(); fi
exec .venv/bin/python -m pytest "${PARALLEL[@]}" "$@"
