# Source me, then `cascade_podman_env IMAGE`: exports CONTAINERS_CONF with the podman settings this machine
# needs, kept in .cascade/containers.conf. Some sandboxes refuse the rlimits podman sets by default (crun:
# "setrlimit RLIMIT_NPROC: Operation not permitted"); there runc with the machine's own limits (nproc at most
# 32768) runs. Nothing is written where podman's defaults already run IMAGE.
cascade_podman_env() {
  local conf nproc nofile
  conf="$(pwd)/.cascade/containers.conf"
  if [ -n "${CONTAINERS_CONF:-}" ]; then return 0; fi
  if [ -f "$conf" ]; then export CONTAINERS_CONF="$conf"; return 0; fi
  if podman run --rm --quiet --network none "$1" true >/dev/null 2>&1; then return 0; fi
  echo "podman's defaults cannot run $1 here; writing $conf (runc, this machine's limits)" >&2
  nproc=$(ulimit -Hu); if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  nofile=$(ulimit -Hn); if [ "$nofile" = unlimited ]; then nofile=1048576; fi
  mkdir -p "$(dirname "$conf")"
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" > "$conf"
  export CONTAINERS_CONF="$conf"
  podman run --rm --quiet --network none "$1" true >/dev/null && return 0
  # A machine restored from a snapshot keeps podman's storage but not its runtime state under /run (a CI run once
  # failed here, its error unprinted): `podman system migrate` rebuilds that state, then one more try.
  echo "podman could not run $1 with $conf; trying again after 'podman system migrate'" >&2
  podman system migrate >&2 || true
  podman run --rm --quiet --network none "$1" true >/dev/null || {
    echo "podman cannot run a container here, even with $conf (its error above)" >&2; return 1; }
}
