"""vLLM parallelism in the engine spec: validated in the policy, rendered as the exact engine argv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from backends.engines.args import engine_command, engine_env
from gateway.cli.main import main
from policies.loader import PolicyError, load_policy
from policies.parallelism import OnDemand
from policies.pools import EngineSpec, LocalPool

ROOT = Path(__file__).resolve().parents[2]


def _spec(**fields: Any) -> EngineSpec:
    return EngineSpec(model="org/moe", served_name="moe", **fields)


def test_tp_pp_dp_ep_and_ray_become_engine_flags_and_env() -> None:
    spec = _spec(moe=True, tensor_parallel_size=8, pipeline_parallel_size=2, data_parallel_size=1,
                 enable_expert_parallel=True, gpus_per_node=8, nodes=2, distributed_executor_backend="ray",
                 ray={"address": "ray://head:10001", "namespace": "cascade"})
    cmd = engine_command(spec, 9000)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "8"
    assert cmd[cmd.index("--pipeline-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "ray"
    assert "--enable-expert-parallel" in cmd and "--data-parallel-size" not in cmd
    assert engine_env(spec)["RAY_ADDRESS"] == "ray://head:10001"
    assert engine_env(spec)["RAY_NAMESPACE"] == "cascade"


def test_defaults_add_no_parallel_flags() -> None:
    cmd = engine_command(_spec(), 9000)
    assert not [c for c in cmd if "parallel" in c or "executor" in c]
    assert "RAY_ADDRESS" not in engine_env(_spec())


@pytest.mark.parametrize(("fields", "message"), [
    ({"tensor_parallel_size": 2}, "declare gpus_per_node"),
    ({"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "gpus_per_node": 4},
     "= 8 devices do not fit gpus_per_node 4 x nodes 1 = 4 GPUs"),
    ({"data_parallel_size": 2, "tensor_parallel_size": 2, "gpus_per_node": 2}, "do not fit"),
    ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "gpus_per_node": 8, "nodes": 2},
     "needs distributed_executor_backend: ray"),
    ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "gpus_per_node": 8, "nodes": 2,
      "distributed_executor_backend": "ray"}, "needs `ray: {address"),
    ({"ray": {"address": "auto"}}, "distributed_executor_backend is not ray"),
    ({"enable_expert_parallel": True, "tensor_parallel_size": 2, "gpus_per_node": 2}, "mixture-of-experts"),
    ({"enable_expert_parallel": True, "moe": True}, "tensor_parallel_size x data_parallel_size > 1"),
])
def test_inconsistent_parallelism_is_rejected_with_the_fix(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("{", r"\{")):
        _spec(**fields)


def test_demo_flagship_counts_as_moe() -> None:
    spec = EngineSpec(model="demo:flagship", served_name="f", enable_expert_parallel=True,
                      tensor_parallel_size=2, gpus_per_node=2)
    assert "--enable-expert-parallel" in engine_command(spec, 9000, Path("/m"))


def test_on_demand_settings() -> None:
    assert OnDemand(idle_stop_after_s=5, cold_start_timeout_s=60).fallback_pool is None
    assert OnDemand(idle_stop_after_s=5, cold_start_timeout_s=60, on_cold="fallback:micro").fallback_pool == "micro"
    with pytest.raises(ValidationError, match="'wait' or 'fallback:<pool>'"):
        OnDemand(idle_stop_after_s=5, cold_start_timeout_s=60, on_cold="fallback:")


def test_on_demand_fallback_must_be_another_defined_pool(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("""
version: 1
pools:
  micro:
    type: local
    price: {gpu_hour_usd: "1.00", tokens_per_second: 100}
    engine: {model: demo:micro, served_name: micro}
    on_demand: {idle_stop_after_s: 60, cold_start_timeout_s: 60, on_cold: "fallback:nowhere"}
routing: {micro_pool: micro, flagship_pool: micro, threshold: 0.5}
""")
    with pytest.raises(PolicyError, match=r"pools.micro.on_demand.on_cold: unknown pool 'nowhere'"):
        load_policy(path)


def test_gpu_policy_flagship_is_valid_and_explain_prints_its_exact_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    loaded = load_policy(ROOT / "policies" / "gpu.yaml")
    xl = loaded.policy.pools["flagship-xl"]
    assert isinstance(xl, LocalPool) and xl.on_demand is not None
    expected = engine_command(xl.engine, xl.engine.base_port)
    # in process (a CLI process of its own cost about 0.8 s of CPU to import); the CLI exports its home: the test's
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    assert main(["policy", "explain", str(ROOT / "policies" / "gpu.yaml"), "--prompt", "hi", "--model",
                 "qwen3-235b"]) == 0
    out = capsys.readouterr().out
    assert "RAY_ADDRESS=ray://ray-head:10001" in out
    assert " ".join(expected) in out  # the same argv the supervisor runs (no argument needs quoting here)
    assert "on demand: starts on the first request" in out
