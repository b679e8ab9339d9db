"""`cascade deploy render --values deploy/k8s/values.yaml [--policy FILE] [--image-registry REGISTRY]
[--allow-local-images] [--out FILE]`: the Kubernetes manifests.

Exit codes: 0 rendered, 1 a bad values file or policy (every problem on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.cli.output import write_output

__all__ = ["register"]


def _render(args: argparse.Namespace) -> int:
    from gateway.deploy.k8s_render import render_file, to_yaml
    from gateway.deploy.k8s_values import ValuesError

    try:
        policy = Path(args.policy) if args.policy else None
        text = to_yaml(render_file(Path(args.values), policy=policy, registry=args.image_registry,
                                   allow_local=args.allow_local_images,
                                   warn=lambda line: print(f"warning: {line}", file=sys.stderr)))
    except ValuesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_output(text, args.out)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("deploy", help="Kubernetes manifests from one values file",
                       description="Deployment artefacts. See deploy/k8s/README.md.")
    leaves = p.add_subparsers(dest="deploy_cmd", required=True, metavar="ACTION")
    render = leaves.add_parser(
        "render", help="print the manifests (kubectl apply -f -)",
        description="Render the gateway Deployment, Service, HPA and PDB, the policy ConfigMap, Redis, and one "
        "vLLM StatefulSet per local pool of the policy the values file names. Nothing is applied.",
    )
    render.add_argument("--values", default="deploy/k8s/values.yaml", help="values YAML (default: %(default)s)")
    render.add_argument("--policy", metavar="FILE", help="the policy to render (default: the one the values file "
                        "names)")
    render.add_argument("--image-registry", metavar="REGISTRY", help="where the project's images were pushed "
                        "(scripts/build_image.sh, then push): replaces images.registry of the values file")
    render.add_argument("--allow-local-images", action="store_true",
                        help="a dev cluster given the images itself (kind load, minikube image load): local tags "
                        "(localhost/, no registry) pass with a warning, and without a registry the images are "
                        "scripts/build_image.sh's localhost/ tags; sets images.allow_local")
    render.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    render.set_defaults(func=_render)
