"""Local engines export their own spans where the gateway exports its traces: the standard OTEL_* variables read as
the SDK reads them, `--otlp-traces-endpoint` and OTLP/HTTP in each replica's argv and environment (a fake engine that
says what it was started with, run by the real supervisor), and every way the gateway makes supervisors passing it
on. The provider each pool's spans name (`gen_ai.provider.name`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from backends.clients.pool import Pool
from backends.engines.args import otlp_traces_endpoint, tracing_args
from backends.engines.supervisor import EngineSupervisor
from gateway.api.runtime import build_runtime
from gateway.control.engine_host import EngineHost
from gateway.settings import Settings
from policies.loader import parse_policy
from policies.pools import LocalPool, RemotePool
from policies.providers import provider_name
from policies.schema import EngineSpec
from tests.servers import ROOT, free_port

COLLECTOR = "http://collector.example:4318"
SAYS_HOW = r"""
import http.server, json, os, sys
print("started", json.dumps({"argv": sys.argv[1:], "protocol": os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
                             "service": os.environ.get("OTEL_SERVICE_NAME")}), flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_the_traces_endpoint_is_read_as_the_sdk_reads_the_standard_variables() -> None:
    assert otlp_traces_endpoint({}) is None
    assert otlp_traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR + "/"}) == COLLECTOR + "/v1/traces"
    assert otlp_traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR,  # the traces one wins, taken as it is
                                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/x"}) == "http://t:4318/x"
    assert otlp_traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR, "OTEL_SDK_DISABLED": "TRUE"}) is None


def test_an_engine_whose_args_name_an_endpoint_keeps_it() -> None:
    spec = EngineSpec(model="m", served_name="micro", extra_args=("--otlp-traces-endpoint=http://own:4318/v1/traces",))
    assert tracing_args(spec, COLLECTOR + "/v1/traces") == []
    assert tracing_args(spec.model_copy(update={"extra_args": ()}), None) == []


async def _started_with(tmp_path: Path, traces_to: str | None) -> dict[str, object]:
    spec = EngineSpec(model="m", served_name="micro", base_port=free_port(), startup_timeout_s=60)

    def command(spec: EngineSpec, port: int, models_dir: Path) -> list[str]:
        return [sys.executable, "-c", SAYS_HOW, str(port)]

    sup = EngineSupervisor("micro", spec, home=tmp_path, command=command, traces_to=traces_to, stop_grace_s=5)
    await sup.start()
    await sup.aclose()
    line = next(line for line in sup.replicas[0].log_path.read_text().splitlines() if line.startswith("started "))
    said: dict[str, object] = json.loads(line.removeprefix("started "))
    return said


async def test_a_traced_gateways_engines_export_their_spans_over_otlp_http_to_its_endpoint(tmp_path: Path) -> None:
    traced = await _started_with(tmp_path / "traced", COLLECTOR + "/v1/traces")
    assert traced["argv"][-2:] == ["--otlp-traces-endpoint", COLLECTOR + "/v1/traces"]  # type: ignore[index]
    assert traced["protocol"] == "http/protobuf"  # vLLM's default is gRPC: the gateway's endpoint speaks HTTP
    assert traced["service"] == "vllm-micro"  # not the gateway's service name, which the engine inherits
    untraced = await _started_with(tmp_path / "untraced", None)
    assert "--otlp-traces-endpoint" not in untraced["argv"] and untraced["protocol"] is None  # type: ignore[operator]


LOCAL = """version: 1
pools:
  micro:
    type: local
    price: {input_per_mtok: "0.20", output_per_mtok: "0.20"}
    engine: {model: demo:micro, served_name: micro, base_port: 8101}
  flagship:
    type: remote
    urls: ["http://127.0.0.1:9/v1"]
    model: flagship-model
    price: {input_per_mtok: "3.00", output_per_mtok: "15.00"}
routing: {micro_pool: micro, flagship_pool: flagship, threshold: 0.5}
"""


async def test_every_supervisor_the_gateway_makes_is_told_its_endpoint(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens; nothing is sent
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    policy = tmp_path / "policy.yaml"
    policy.write_text(LOCAL)
    spec = parse_policy(LOCAL).policy.pools["micro"]
    assert isinstance(spec, LocalPool)
    settings = Settings(policy_path=policy, home=tmp_path, scorer="none", start_engines=False, ledger="memory",
                        access_log=None)
    runtime = await build_runtime(settings)
    host = EngineHost(settings, tmp_path / "registry", tmp_path, lambda spec, port, models: ["true"])
    try:
        for pool_set in (runtime.pool_set, host.pool_set):  # one process, and the parent of --workers N
            sup = pool_set.supervisor_for("micro", spec, Pool("micro", [], runtime.engines))
            assert sup.traces_to == "http://127.0.0.1:9/v1/traces"
            await sup.aclose()
    finally:
        await host.aclose()
        await runtime.aclose()


def test_each_pool_names_its_provider() -> None:
    policy = parse_policy((ROOT / "policies" / "default.yaml").read_text()).policy
    assert provider_name(policy.pools["micro"]) == "vllm"

    def remote(url: str, **fields: str) -> RemotePool:
        return RemotePool.model_validate({"type": "remote", "urls": [url], "model": "m", **fields,
                                          "price": {"input_per_mtok": "1", "output_per_mtok": "1"}})

    assert provider_name(remote("https://api.openai.com/v1")) == "openai"
    assert provider_name(remote("https://acme.openai.azure.com/openai")) == "azure.ai.openai"
    assert provider_name(remote("https://bedrock-runtime.us-east-1.amazonaws.com")) == "aws.bedrock"
    assert provider_name(remote("http://10.0.0.7:8000/v1")) == "openai"  # what the gateway speaks to it
    assert provider_name(remote("http://10.0.0.7:8000/v1", provider="vllm")) == "vllm"  # ops know better
    with pytest.raises(ValueError, match="provider"):
        remote("http://10.0.0.7:8000/v1", provider="Not A Name")
