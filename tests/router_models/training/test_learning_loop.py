"""The learning loop end to end: a real gateway (uvicorn) keeps scored prompts in the real Redis, clients post
feedback, `cascade router train --from-ledger` trains on those labels plus the public outcomes, compares the
candidate with the current artifact and promotes it only when better; `cascade router rollback` walks back
to the shipped artifact. Bad label files and corrupt artifacts are refused with a clear message.

The traffic is synthetic (loadtest/data/synthetic_prompts.jsonl) and so are its thumbs: they only show that
the loop runs; no quality is judged from them. Every training run is kept small (`--max-per-source 100`);
the embedding cache is the session's, the artifact store each test's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.api.app import create_app
from gateway.api.auth import hash_key
from gateway.cli.main import main
from gateway.settings import Settings
from router_models.embedders.onnx_minilm import default_cache_dir
from router_models.serving.artifact import DEFAULT_ARTIFACT, ArtifactError, load_artifact
from router_models.serving.artifact_store import ArtifactStore
from router_models.training.exit_codes import NOT_BETTER
from router_models.training.labels import examples_from_rows, split_held_back
from router_models.training.ledger_labels import read_ledger_labels
from router_models.training.outcomes import DEFAULT_ROUTING_DIR
from tests.conftest import Upstreams, delete_prefix, policy_yaml
from tests.servers import ROOT, free_port, serve

# A Redis database no other test uses, and a key prefix of this run's own (`ledger`, passed to `cascade router train
# --redis-prefix`): two suites on one machine (two clones, a session's runs beside a suite) never read each other's
# labels, which a fixed prefix let them do.
LEDGER_URL = "redis://127.0.0.1:6379/11"
MAX_PER_SOURCE = "100"
REQUESTS = 30
KEY = "key-loop"
LEARNING = f"""tenants:
  loop: {{api_key_sha256: ["{hash_key(KEY)}"]}}
learning:
  keep_prompts: {{sample: 1.0, ttl_days: 1}}
"""
VERDICT = re.compile(r"candidate APGR (\d\.\d{4}) vs current (\d\.\d{4}) \(([+-]\d\.\d{4})\) on (.+)")

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(),
                       reason=f"shared routing data not found at {DEFAULT_ROUTING_DIR} (set CASCADE_ROUTING_DATA)"),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$CASCADE_HOME of this test (so its own artifact store), for this process and the CLI runs; the embedder's
    caches (its ONNX export, the vectors of prompts already embedded) are the session's, shared with the other
    tests that embed: a cache changes how long a run takes, never what it computes."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "router-cache").symlink_to(default_cache_dir(), target_is_directory=True)
    monkeypatch.setenv("CASCADE_HOME", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CASCADE_ROUTER_ARTIFACT", raising=False)
    return path


def _cascade(home: Path, *argv: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CASCADE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("CASCADE_ROUTER_ARTIFACT", None)
    return subprocess.run([sys.executable, "-m", "gateway", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


def _in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`cascade ARGV` in this process (the `home` fixture's $CASCADE_HOME): exit code, stdout, stderr. For the
    commands that only read or move the artifact store: a CLI process of its own cost about 0.8 s of CPU to import."""
    capsys.readouterr()
    code = main(list(argv))
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def _train(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return _cascade(home, "router", "train", "--max-per-source", MAX_PER_SOURCE, *argv)


def _seed_current(home: Path, recorded_apgr: float) -> str:
    """Promote a copy of the shipped artifact whose recorded leave-one-source-out APGR is `recorded_apgr`, so
    the comparison with a candidate (scored on the public outcomes, without held-back labels) is known."""
    seed = home.parent / "seed" / DEFAULT_ARTIFACT.name
    seed.parent.mkdir()
    shutil.copyfile(DEFAULT_ARTIFACT.with_suffix(".npz"), seed.with_suffix(".npz"))
    meta = json.loads(DEFAULT_ARTIFACT.read_text())
    meta["evaluation"]["mean"]["apgr"] = recorded_apgr
    for row in meta["evaluation"]["per_source"].values():
        row["apgr"] = recorded_apgr
    seed.write_text(json.dumps(meta))
    return ArtifactStore(home / "router").promote(seed).version


def _find(pattern: str, out: str) -> str:
    match = re.search(pattern, out)
    assert match, f"{pattern!r} not in:\n{out}"
    return match[1]


def _verdict(out: str) -> tuple[float, float, float, str]:
    match = VERDICT.search(out)
    assert match, out
    return float(match[1]), float(match[2]), float(match[3]), match[4]


def _kept_path(out: str) -> Path:
    return Path(_find(r"candidate kept at (\S+)", out))


@pytest.fixture
def ledger() -> Iterator[str]:
    """This test's own ledger prefix in `LEDGER_URL` (its keys deleted afterwards)."""
    prefix = f"test-loop:{uuid.uuid4().hex}:"
    yield prefix
    delete_prefix(prefix, LEDGER_URL)


@pytest.fixture
def gateway(upstreams: Upstreams, home: Path, ledger: str) -> Iterator[str]:
    """The gateway with the trained classifier (the store is empty: the shipped artifact), every scored request
    kept; threshold 1.0 sends every scored request to the micro pool, whose answers feedback labels."""
    _, micro_url, _, flagship_url = upstreams
    policy = home / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url, LEARNING).replace("threshold: 0.5", "threshold: 1.0"))
    settings = Settings(policy_path=policy, redis_url=LEDGER_URL, redis_prefix=ledger, scorer="classifier",
                        start_engines=False, ledger="redis", home=home, policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        yield url


def _prompts(n: int) -> list[str]:
    lines = (ROOT / "loadtest" / "data" / "synthetic_prompts.jsonl").read_text().splitlines()
    return [str(json.loads(line)["prompt"]) for line in lines[::7][:n]]


def _feedback(url: str, request_id: str, thumbs: str) -> None:
    deadline = time.monotonic() + 5
    while True:  # the kept prompt lands just after the answer
        r = httpx.post(url + "/v1/feedback", json={"request_id": request_id, "thumbs": thumbs},
                       headers={"authorization": f"Bearer {KEY}"}, timeout=10)
        if r.status_code != 404 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.status_code == 200, r.text


def _traffic_with_feedback(url: str) -> dict[str, float]:
    """REQUESTS auto requests through the openai SDK, each with a thumb; returns {request id: needs_flagship}."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    labels: dict[str, float] = {}
    for i, prompt in enumerate(_prompts(REQUESTS)):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-cascade-pool"] == "micro" and raw.headers["x-cascade-score"] != "none"
        thumbs = "down" if i % 3 == 0 else "up"
        _feedback(url, raw.headers["x-request-id"], thumbs)
        labels[raw.headers["x-request-id"]] = 1.0 if thumbs == "down" else 0.0
    return labels


@pytest.mark.slow
def test_feedback_trains_a_candidate_that_is_promoted_only_when_better_and_rolled_back(
        gateway: str, home: Path, ledger: str, capsys: pytest.CaptureFixture[str]) -> None:
    labels = _traffic_with_feedback(gateway)
    assert len(labels) == REQUESTS
    rows = read_ledger_labels(LEDGER_URL, key_prefix=ledger)
    assert {r["id"]: r["needs_flagship"] for r in rows if r["id"] in labels} == labels
    train_rows, held = split_held_back(examples_from_rows(rows, default_source="ledger"), 0.3)
    assert train_rows and held  # both sides of the comparison are exercised

    # 1. --no-promote: the candidate is compared on the held-back labels and kept aside; nothing becomes current
    run = _train(home, "--from-ledger", "--redis-url", LEDGER_URL, "--redis-prefix", ledger, "--no-promote")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert f"[train] {len(rows)} labelled requests from the ledger at {LEDGER_URL}" in out
    public = int(_find(r"\[train\] (\d+) prompts with real outcomes", out))
    assert f"final fit on {public + len(train_rows)} prompts" in out
    cand, cur, delta, basis = _verdict(out)
    assert basis == f"{len(held)} held-back labels of your traffic"
    assert delta == pytest.approx(cand - cur, abs=2e-4)
    assert "not promoted (" in out and "promoted as version" not in out
    kept = load_artifact(_kept_path(out))
    assert kept.metadata["sources"]["labels:feedback"] == len(train_rows)
    assert ArtifactStore(home / "router").history() == []
    code, versions, _ = _in_process(capsys, "router", "versions")
    assert code == 0 and f"serving: {DEFAULT_ARTIFACT}  (shipped with the package)" in versions

    # 2. against a current artifact whose recorded figure any candidate beats: promoted, and served from the store
    seed = _seed_current(home, recorded_apgr=0.0)
    run = _train(home, "--from-ledger", "--redis-url", LEDGER_URL, "--redis-prefix", ledger, "--held-back", "0")
    assert run.returncode == 0, run.stdout + run.stderr
    cand, cur, delta, basis = _verdict(run.stdout)
    assert (cur, basis) == (0.0, "mean leave-one-source-out APGR on the 7 public sources both were evaluated on")
    assert cand > 0.3
    version = _find(r"promoted as version (\S+)", run.stdout)
    code, versions, _ = _in_process(capsys, "router", "versions")
    assert code == 0 and f"  {seed}\n" in versions and f"  {version}  (current)" in versions
    served = load_artifact(None)
    assert served.metadata["sources"]["labels:feedback"] == len(rows)
    assert served.metadata["payload_sha256"] != kept.metadata["payload_sha256"]  # held-back rows now trained on

    # 3. rollback: back to the seed, then to the shipped artifact; one more has nothing to roll back
    assert _in_process(capsys, "router", "rollback")[0] == 0
    assert load_artifact(None).metadata["evaluation"]["mean"]["apgr"] == 0.0
    code, out, _ = _in_process(capsys, "router", "rollback")
    assert code == 0 and f"current artifact: {DEFAULT_ARTIFACT}" in out
    assert "(shipped with the package)" in _in_process(capsys, "router", "versions")[1]
    code, _, err = _in_process(capsys, "router", "rollback")
    assert code == 2
    assert "nothing to roll back" in err and str(DEFAULT_ARTIFACT) in err


def test_a_candidate_not_better_than_current_is_not_promoted_and_the_report_says_by_how_much(home: Path) -> None:
    seed = _seed_current(home, recorded_apgr=1.0)  # no candidate can beat a perfect recorded figure
    run = _train(home)
    assert run.returncode == NOT_BETTER, run.stdout + run.stderr
    cand, cur, delta, _ = _verdict(run.stdout)
    assert cur == 1.0 and delta < 0 and delta == pytest.approx(cand - 1.0, abs=2e-4)
    assert "not promoted (not better than the current artifact)" in run.stdout
    assert [e.version for e in ArtifactStore(home / "router").history()] == [seed]
    load_artifact(_kept_path(run.stdout))  # kept for inspection, complete


def test_a_label_file_with_a_bad_row_is_refused_naming_line_and_field(home: Path) -> None:
    labels = home / "labels.jsonl"
    labels.write_text('{"prompt": "rename the column", "needs_flagship": 0}\n'
                      '{"prompt": "prove the bound", "needs_flagship": "yes"}\n')
    run = _train(home, "--labels", str(labels))
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"error: {labels}:2: field 'needs_flagship' must be a number in [0, 1]" in run.stderr
    assert "final fit" not in run.stdout
    assert not (home / "router").exists()  # nothing trained, nothing written


def test_a_corrupt_current_artifact_is_refused_and_the_gateway_does_not_start(home: Path) -> None:
    _seed_current(home, recorded_apgr=0.5)
    current = ArtifactStore(home / "router").current_artifact()
    payload = current.with_suffix(".npz")
    payload.write_bytes(payload.read_bytes()[:100])
    with pytest.raises(ArtifactError, match=rf"{re.escape(str(payload))} fails its sha256 check"):
        load_artifact(None)
    policy = home / "policy.yaml"
    policy.write_text(policy_yaml("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    port = free_port()
    run = _cascade(home, "serve", "--policy", str(policy), "--port", str(port), "--scorer", "classifier",
                   "--no-engines", "--ledger", "memory", timeout_s=60)
    assert run.returncode == 1, run.stderr
    assert f"{payload} fails its sha256 check" in run.stderr and "--scorer length|none" in run.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
