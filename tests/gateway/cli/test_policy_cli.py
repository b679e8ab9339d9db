"""`cascade policy` commands: validate, schema, explain (rule trail, engine command), replay (matrix, cost)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import policy as cli
from gateway.cli import policy_memory
from policies.replay import LogError, parse_log
from tests.conftest import policy_yaml, with_fixed_threshold

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ROOT / "policies" / "default.yaml"
TENANTS = ROOT / "policies" / "multi-tenant.yaml"


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["policy", *argv])
    code: int = args.func(args)
    return code


def test_validate_ok_and_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("validate", str(DEFAULT)) == 0
    assert "valid (version" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFAULT.read_text().replace("micro_pool: micro", "micro_pool: a").replace("0.5", "0.6") +
                   "aliases: {auto: nowhere}\n")
    assert run("validate", str(bad)) == 1
    err = capsys.readouterr().err
    assert "routing.micro_pool: unknown pool 'a'" in err and "aliases.auto: unknown pool 'nowhere'" in err
    assert f"{bad}:" in err and "alias shadows" in err


def test_schema_is_json_with_the_new_sections(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("schema") == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"pools", "routing", "tenants", "degradation"} <= set(schema["properties"])
    assert "RaiseThreshold" in schema["$defs"] and "regex" in schema["$defs"]["RuleMatch"]["properties"]


def test_explain_shows_rules_decision_and_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code = run("explain", str(TENANTS), "--prompt", "review this contract", "--tenant", "globex",
               "--header", "X-Plan: free", "--score", "0.4")
    out = capsys.readouterr().out
    assert code == 0
    assert "score:    0.4000 (given)" in out
    assert "1. acme-ci -> pool 'micro': no: tenant 'globex' not in ['acme']" in out
    assert "2. globex-premium -> threshold 0.25: no: header 'x-plan' value 'free' does not match" in out
    assert "3. contracts -> threshold 0.26: MATCH" in out
    assert "decision: pool 'flagship' (model 'flagship'), rule 'contracts'" in out
    assert "route:\n  1. score -> 'flagship': score 0.400 >= 0.26 (contracts)\n" in out
    assert "--served-model-name flagship" in out and "--port 8201" in out and "VLLM_CPU_KVCACHE_SPACE=1" in out


def test_explain_prints_the_context_step_for_a_request_micro_cannot_hold(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1").replace(
        "model: micro-model\n", "model: micro-model\n    context_tokens: 1024\n"))
    body = tmp_path / "body.json"  # ~1,250 estimated tokens and 200 to write: over micro's context of 1,024
    body.write_text(json.dumps({"model": "auto", "max_tokens": 200,
                                "messages": [{"role": "user", "content": "word " * 1000}]}))
    assert run("explain", str(policy), "--request", str(body), "--score", "0.1") == 0
    out = capsys.readouterr().out
    assert "route:\n  1. score -> 'micro': score 0.100 < 0.5 (threshold)\n  2. context-fit -> 'flagship': " in out
    assert "and 200 completion do not fit 'micro' (1024 tokens)" in out
    assert "decision: pool 'flagship' (model 'flagship-model'), rule 'context-fit'" in out


def test_explain_runs_the_classifier_only_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Any] = []

    def fake_score(loaded: Any, ctx: Any, messages: Any, args: Any, threshold: float | None = None
                   ) -> tuple[float, str]:
        calls.append((messages, threshold))  # the threshold the scorer refines near: None, the policy's own
        return 0.9, "classifier"

    monkeypatch.setattr(policy_memory, "scored", fake_score)
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}],
                                "metadata": {"source": "ci"}}))
    assert run("explain", str(TENANTS), "--request", str(body), "--tenant", "acme") == 0
    assert calls == [] and "not needed" in capsys.readouterr().out
    assert run("explain", str(DEFAULT), "--request", str(body)) == 0
    out = capsys.readouterr().out
    assert calls and "0.9000 (classifier)" in out and "pool 'flagship'" in out


def test_explain_refusals_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("explain", str(TENANTS), "--prompt", "x", "--tenant", "free", "--model", "flagship") == 1
    assert "403: tenant 'free' may not use pool 'flagship'" in capsys.readouterr().out
    assert run("explain", str(DEFAULT), "--prompt", "x", "--model", "gpt-5") == 1
    assert "404: model 'gpt-5'" in capsys.readouterr().out


RULE_MODELS = """  rules:
    - {name: vip-gpt4o, match: {models: [gpt-4o], tenants: [vip]}, pool: flagship}
    - {name: cheap-mini, match: {models: [gpt-4o-mini]}, pool: micro}
"""


def _rule_models(tmp_path: Path) -> Path:
    path = tmp_path / "rule-models.yaml"
    path.write_text(with_fixed_threshold(DEFAULT.read_text(), "0.5\n" + RULE_MODELS.rstrip("\n")))
    return path


def test_explain_a_model_only_rules_know(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = str(_rule_models(tmp_path))
    assert run("explain", policy, "--prompt", "x", "--model", "gpt-4o-mini", "--score", "0.9") == 0
    out = capsys.readouterr().out
    assert "1. cheap-mini -> pool 'micro': MATCH" in out
    assert "decision: pool 'micro' (model 'micro'), rule 'cheap-mini'" in out
    assert run("explain", policy, "--prompt", "x", "--model", "gpt-4o", "--tenant", "std", "--score", "0.9") == 1
    out = capsys.readouterr().out
    assert "1. vip-gpt4o -> pool 'flagship': no: tenant 'std' not in ['vip']" in out
    assert "refused:  404: model 'gpt-4o' is routed only by rules ['vip-gpt4o']" in out


def test_explain_bad_header_and_bad_request_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("explain", str(DEFAULT), "--prompt", "x", "--score", "0.1", "--header", "x-plan") == 1
    assert "--header 'x-plan': write it as NAME:VALUE" in capsys.readouterr().err
    body = tmp_path / "body.json"
    body.write_text("{\n  oops\n}")
    assert run("explain", str(DEFAULT), "--request", str(body), "--score", "0.1") == 1
    assert f"{body}:2: not valid JSON" in capsys.readouterr().err


def _line(model: str, score: float | None, pool: str, prompt: int, completion: int) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    return json.dumps({"request": body, "tenant": "default", "score": score, "pool": pool,
                       "prompt_tokens": prompt, "completion_tokens": completion})


LOG = [
    _line("auto", 0.2, "micro", 1000, 1000),  # 400 micro-USD on micro
    _line("auto", 0.8, "flagship", 1000, 1000),  # 18_000 on the flagship
    _line("auto", 0.6, "flagship", 1000, 0),  # 3_000 on the flagship, 200 on micro
    _line("micro", None, "micro", 1000, 10),  # 202, pinned
]


def _files(tmp_path: Path, lines: list[str]) -> tuple[Path, Path]:
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(lines) + "\n\n")
    strict = tmp_path / "strict.yaml"
    strict.write_text(with_fixed_threshold(DEFAULT.read_text(), "0.7"))
    return log, strict


def test_replay_against_recorded_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, strict = _files(tmp_path, LOG)
    assert run("replay", str(strict), "--log", str(log)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"4 requests; 1 move pools (rows: recorded, columns: {strict})"
    assert out[1].split() == ["flagship", "micro"]
    assert out[2].split() == ["flagship", "1", "1"] and out[3].split() == ["micro", "0", "2"]
    assert out[4] == f"cost recorded: 0.021602 USD; {strict}: 0.018802 USD; difference: -0.002800 USD"


def test_replay_policy_against_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, strict = _files(tmp_path, [*LOG, _line("auto", None, "micro", 10, 10)])
    assert run("replay", str(DEFAULT), "--log", str(log), "--against", str(strict)) == 0
    out = capsys.readouterr().out
    assert "5 requests; 1 move pools" in out and "difference: -0.002800 USD" in out
    assert "1 requests needed a score the log does not have" in out


def test_bad_log_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(LogError, match=r"^x:2: `prompt_tokens` must be"):
        parse_log([LOG[0], '{"request": {}, "prompt_tokens": -1}'], "x")
    log, _ = _files(tmp_path, [LOG[0], "not json"])
    assert run("replay", str(DEFAULT), "--log", str(log)) == 1
    assert f"{log}:2:" in capsys.readouterr().err


def test_replay_routes_models_only_rules_know(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, _ = _files(tmp_path, [_line("gpt-4o-mini", None, "micro", 10, 10), _line("gpt-4o", None, "micro", 10, 10)])
    assert run("replay", str(_rule_models(tmp_path)), "--log", str(log)) == 0
    out = capsys.readouterr().out
    assert "2 requests; 1 move pools" in out  # gpt-4o from tenant 'default' matches no rule: refused
    assert "1 requests would be refused" in out


REMOTE_POOL = """  cloud:
    type: remote
    price: {{input_per_mtok: "1.00", output_per_mtok: "4.00"}}
    urls: ["https://cloud.example:8443"]
    model: big
    connection: {{ca_bundle: "{ca}"}}

routing:"""


def test_machine_checks_are_made_where_the_policy_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A remote pool naming a CA bundle that is not on this machine: the policy parses (parsing is pure, the
    file is not read), but `validate`, like the pool set before it starts pools, refuses it with file:line."""
    from backends.machine_checks import checked_here
    from gateway.control.fleet.pool_set import PoolSet
    from policies.loader import PolicyError, load_policy

    policy = tmp_path / "remote.yaml"
    policy.write_text(DEFAULT.read_text().replace("routing:", REMOTE_POOL.format(ca=tmp_path / "no-ca.pem"), 1))
    loaded = load_policy(policy)  # pure: does not look for the CA bundle
    assert run("validate", str(policy)) == 1
    err = capsys.readouterr().err
    line = next(i for i, text in enumerate(policy.read_text().splitlines(), 1) if "connection:" in text)
    assert f"{policy}:{line}: pools.cloud.connection: ca_bundle {tmp_path / 'no-ca.pem'}" in err, err
    with pytest.raises(PolicyError, match=r"pools\.cloud\.connection"):
        PoolSet.check(loaded)
    (tmp_path / "no-ca.pem").write_text("not a certificate\n")
    with pytest.raises(PolicyError, match="ca_bundle"):
        checked_here(loaded)


def test_explain_shows_what_a_pools_speculative_decoding_means(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("explain", str(ROOT / "policies" / "gpu.yaml"), "--prompt", "rewrite this", "--score", "0.99") == 0
    out = capsys.readouterr().out
    assert "--speculative-config" in out
    assert "speculative: ngram (prompt lookup): the last 4..2 tokens" in out
    assert "cascade_pool_spec_decode_acceptance" in out


def test_explain_names_a_remote_pools_key_or_says_it_has_none(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """It printed `key from $-` for a remote pool without api_key_env."""
    policy = tmp_path / "remote.yaml"
    price = '{input_per_mtok: "1", output_per_mtok: "1"}'
    policy.write_text(f"""version: 1
pools:
  micro: {{type: remote, urls: ["http://m:8000"], model: m, price: {price}}}
  flagship: {{type: remote, urls: ["http://f:8000"], model: f, api_key_env: F_KEY, price: {price}}}
routing: {{micro_pool: micro, flagship_pool: flagship, threshold: 0.5}}
""")
    assert run("explain", str(policy), "--prompt", "hi", "--score", "0.1") == 0
    out = capsys.readouterr().out
    assert "remote:   http://m:8000 (model 'm', no API key)" in out and "$-" not in out
    assert run("explain", str(policy), "--prompt", "hi", "--score", "0.9") == 0
    assert "remote:   http://f:8000 (model 'f', key from $F_KEY)" in capsys.readouterr().out
