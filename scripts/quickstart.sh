#!/usr/bin/env bash
# Quick start, step 1: set everything up, then run the demo end to end
# (demo models and the flagship's calibrated int8 fallback, Redis found or started, both vLLM engines
# + the gateway, sample traffic, cost report).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/cascade models build
# the flagship's calibrated int8 fallback pool (policies/demo-ladder.yaml): quantized and measured once
.venv/bin/cascade quantize --demo
exec .venv/bin/cascade demo "$@"
