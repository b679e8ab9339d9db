#!/usr/bin/env bash
# Quick start, step 1: set everything up, then run the demo end to end (demo models, Redis found or
# started, both vLLM engines + the gateway, sample traffic, cost report), printing each phase's duration.
#
#   ./scripts/quickstart.sh                    # policies/default.yaml: the micro and flagship pools
#   ./scripts/quickstart.sh --with-fallback    # also build the flagship's calibrated int8 fallback
#                                              # (cascade quantize --demo, ~6 min the first time) and run
#                                              # policies/demo-ladder.yaml, whose ladder uses it
# Other arguments go to `cascade demo` (e.g. --port 8090, --policy FILE).
# The demo's gateway keeps its records under the Redis key prefix cascade-demo: (`cascade demo --prefix`), apart
# from a real gateway's cascade: and the tests' cascade-test:; `cascade costs report --prefix cascade-demo:` reads them.
#
# Interrupted (Ctrl-C, a failed download, a full disk)? Run it again: every step keeps only finished work
# (the venv's setup stamp and the models' manifests are written last; models are built in a temporary
# directory and renamed into place), so it redoes what was cut short and skips the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
STARTED=$(date +%s.%N)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

WITH_FALLBACK=0
DEMO_ARGS=()
for arg in "$@"; do
  if [ "$arg" = --with-fallback ]; then WITH_FALLBACK=1; else DEMO_ARGS+=("$arg"); fi
done

t=$(now); bash scripts/setup.sh; SETUP_S=$(since "$t")
export HF_HUB_OFFLINE=1
# the engines and the gateway write the bytecode of what they import (setup warms only the main modules), also
# where PYTHONDONTWRITEBYTECODE is set: every later engine start, the tests' included, reads it instead of compiling
unset PYTHONDONTWRITEBYTECODE
# the micro pool answers with a real instruct model (SmolLM2-135M-Instruct, from its PyPI wheel); the tests
# (step 2) use the tiny random models whatever this says
export CASCADE_DEMO_MICRO="${CASCADE_DEMO_MICRO:-smollm2}"
t=$(now); .venv/bin/cascade models build; MODELS_S=$(since "$t")
PHASES=(--phase "setup=$SETUP_S" --phase "models=$MODELS_S")
if [ "$WITH_FALLBACK" = 1 ]; then
  # the flagship's calibrated int8 fallback pool (policies/demo-ladder.yaml): quantized and measured once
  t=$(now); .venv/bin/cascade quantize --demo; PHASES+=(--phase "int8 fallback=$(since "$t")")
  DEMO_ARGS=(--policy policies/demo-ladder.yaml "${DEMO_ARGS[@]}")
fi
# The demo's output goes through a filter that notes when the engines are up, when the first routed answer
# came back and when the report is done; the filter ignores Ctrl-C so the demo's shutdown is still shown.
set +e
.venv/bin/cascade demo "${DEMO_ARGS[@]}" 2>&1 | .venv/bin/python -u scripts/quickstart_phases.py \
  --started "$STARTED" "${PHASES[@]}"
codes=("${PIPESTATUS[@]}")
set -e
exit "${codes[0]}"
