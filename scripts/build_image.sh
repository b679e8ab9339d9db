#!/usr/bin/env bash
# Build the cascade gateway image (deploy/Dockerfile) with podman, on this machine, without pulling anything:
#
#   scripts/build_image.sh [--engine cpu|cuda|none] [--base IMAGE] [--tag NAME]
#
# - Installs podman, buildah, mmdebstrap, runc and podman-compose from Debian's packages when missing (as root).
# - Without --base, bootstraps a Debian base (python3 + venv) with mmdebstrap from this machine's Debian
#   sources and imports it as localhost/cascade-base:bookworm (once; about 3 minutes), and builds a Redis
#   image localhost/cascade-redis:bookworm on it (for deploy/compose.yaml, through CASCADE_REDIS_IMAGE).
# - Builds with this machine's pip settings (index, extra index, find-links, CA bundle): local folders they
#   name are mounted read-only into the build, never copied into the image.
# - Tags NAME (default localhost/cascade-gateway:VERSION-cpu|-cuda|-slim) and
#   localhost/cascade-gateway:src-HASH, HASH being the hash of the build context's files (scripts/image_hash.py),
#   so a test can reuse an image built from the same tree.
# Prints the image name on the last line. Podman settings this machine needs (runc, ulimits) are written to
# .cascade/containers.conf and exported as CONTAINERS_CONF (scripts/podman_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=cpu BASE="" TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    *) echo "usage: $0 [--engine cpu|cuda|none] [--base IMAGE] [--tag NAME]" >&2; exit 2 ;;
  esac
done
case "$ENGINE" in cpu|cuda) SUFFIX=$ENGINE ;; none) SUFFIX=slim ;; *) echo "--engine: cpu, cuda or none" >&2; exit 2 ;; esac
say() { printf '\033[1m[image]\033[0m %s\n' "$*" >&2; }
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  say "installing podman, buildah, mmdebstrap, runc, podman-compose (apt)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah mmdebstrap runc \
     podman-compose uidmap >/dev/null) >&2
fi
# shellcheck source=scripts/podman_env.sh
. scripts/podman_env.sh

VERSION=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
TAG=${TAG:-localhost/cascade-gateway:$VERSION-$SUFFIX}
HASH=$(python3 scripts/image_hash.py "$ENGINE")

bootstrap() {  # bootstrap NAME PACKAGES...: a Debian image from this machine's Debian sources
  local name=$1; shift
  local tar; tar=$(mktemp --suffix=.tar)
  local sources=(); [ -f /etc/apt/sources.list.d/debian.sources ] && sources=(/etc/apt/sources.list.d/debian.sources)
  say "bootstrapping $name with mmdebstrap (Debian bookworm: $*)"
  mmdebstrap --quiet --variant=apt --mode=root --include="$(IFS=,; echo "$*")" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' bookworm "$tar" "${sources[@]}" >&2
  podman import --quiet --change 'CMD ["/bin/bash"]' "$tar" "$name" >/dev/null
  rm -f "$tar"
}

if [ -z "$BASE" ]; then
  BASE=localhost/cascade-base:bookworm
  podman image exists "$BASE" || bootstrap "$BASE" python3 python3-venv ca-certificates libnuma1 libgomp1
  cascade_podman_env "$BASE"
  if ! podman image exists localhost/cascade-redis:bookworm; then
    say "building localhost/cascade-redis:bookworm (Debian's redis-server on the base)"
    ctr=$(buildah from --quiet "$BASE")
    buildah run "$ctr" -- sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends redis-server >/dev/null && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
      && mkdir -p /data && chown redis:redis /data' >&2
    buildah config --user redis --workingdir /data --port 6379 --cmd '["redis-server", "--protected-mode", "no"]' "$ctr"
    buildah commit --quiet --rm "$ctr" localhost/cascade-redis:bookworm >/dev/null
  fi
fi
cascade_podman_env "$BASE"

# This machine's pip settings, as build arguments; local folders they name are mounted read-only.
pip_get() { python3 -m pip config get "global.$1" 2>/dev/null || true; }
INDEX=${PIP_INDEX_URL:-$(pip_get index-url)}
EXTRA=${PIP_EXTRA_INDEX_URL:-$(pip_get extra-index-url)}
LINKS=${PIP_FIND_LINKS:-$(pip_get find-links)}
CERT=${PIP_CERT:-$(pip_get cert)}
ARGS=(--build-arg "BASE=$BASE" --build-arg "ENGINE=$ENGINE")
[ -n "$INDEX" ] && ARGS+=(--build-arg "PIP_INDEX_URL=$INDEX")
[ -n "$EXTRA" ] && ARGS+=(--build-arg "PIP_EXTRA_INDEX_URL=$(echo "$EXTRA" | tr '\n' ' ')")
[ -n "$LINKS" ] && ARGS+=(--build-arg "PIP_FIND_LINKS=$(echo "$LINKS" | tr '\n' ' ')")
for loc in $INDEX $EXTRA $LINKS; do
  dir=${loc#file://}; dir=${dir%/}; dir=${dir%/simple}  # a local index's pages link to files beside simple/
  case "$dir" in /*) [ -d "$dir" ] && ARGS+=(--volume "$dir:$dir:ro") ;; esac
done
if [ -n "$CERT" ] && [ -f "$CERT" ]; then
  ARGS+=(--volume "$CERT:/run/pip-cert.pem:ro" --build-arg PIP_CERT=/run/pip-cert.pem)
fi

say "building $TAG (engine $ENGINE, base $BASE, source $HASH)"
started=$(date +%s)
# --format docker keeps the HEALTHCHECK (the OCI image format has none)
podman build --format docker --layers -f deploy/Dockerfile "${ARGS[@]}" \
  --label "org.cascade.source-hash=$HASH" -t "$TAG" -t "localhost/cascade-gateway:src-$HASH" . >&2
# older source tags go (their images stay as build cache: `podman image prune` would empty that cache too)
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/cascade-gateway:src-' | \
  grep -v ":src-$HASH\$" | xargs -r -I{} podman untag {} {} >/dev/null 2>&1 || true
say "built $TAG in $(elapsed "$started"); size $(podman image inspect --format '{{.Size}}' "$TAG" | \
  awk '{printf "%.2f GB", $1/1e9}')"
echo "$TAG"
