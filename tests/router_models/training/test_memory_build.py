"""`cascade router memory add`: label rows become a verified memory file that grows with each call, conflicting
labels of one prompt are counted, and a bad row is refused with its line number before anything is written.
The label rows are written here: they test the plumbing, never what labels buy (the learning curve does)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.typing import EncodableT

from gateway.cli.main import main
from router_models.cli import register
from router_models.serving.artifact import DEFAULT_ARTIFACT, load_artifact
from router_models.serving.memory_file import load_memory
from router_models.serving.refined_model import refine_choice, refine_front
from router_models.training.ledger_labels import LabelKeys
from tests.conftest import SHARED_URL, cascade_home


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["router", "memory", "add", *argv])
    return int(args.func(args))


def _labels(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_labels_are_appended_to_the_tenants_memory_and_conflicts_counted(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    first = _labels(tmp_path / "a.jsonl", [{"prompt": "Prove that the square root of two is irrational.",
                                            "needs_flagship": 1},
                                           {"prompt": "Say hello.", "micro": 1.0, "flagship": 0.5}])
    again = _labels(tmp_path / "b.jsonl", [{"prompt": "Say hello.", "needs_flagship": 1}])
    common = ("--tenant", "acme", "--store", str(store), "--artifact", str(DEFAULT_ARTIFACT))
    assert _run("--labels", str(first), *common) == 0
    assert _run("--labels", str(again), *common) == 0
    rows_from = refine_front(DEFAULT_ARTIFACT, refine_choice()) or DEFAULT_ARTIFACT  # the rows the scorer hands out
    memory, meta = load_memory(store / "memory" / "acme.json", embedder=load_artifact(rows_from).embedder)
    assert len(memory) == 3 and meta["conflicting_prompts"] == 1  # "Say hello.": targets 0.25, then 1.0
    assert memory.targets.tolist() == [1.0, 0.25, 1.0]
    assert "2 -> 3 labels, 1 prompts with conflicting labels" in capsys.readouterr().out


def test_labels_per_pool_are_kept_beside_each_labels_micro_and_flagship_quality(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rows = _labels(tmp_path / "a.jsonl", [{"prompt": "Write a Python function that reverses a list.",
                                           "pools": {"code": 0}},
                                          {"prompt": "Say hello.", "micro": 1.0, "flagship": 0.5,
                                           "pools": {"general": 1}}])
    assert _run("--labels", str(rows), "--store", str(store), "--artifact", str(DEFAULT_ARTIFACT)) == 0
    memory, meta = load_memory(store / "memory" / "shared.json")
    assert meta["memory_format"] == 2 and memory.pools == ("code", "@micro", "@flagship", "general")
    assert memory.qualities is not None
    assert np.isnan(memory.targets[0]) and memory.targets[1] == 0.25
    assert np.nan_to_num(memory.qualities, nan=-1).tolist() == [[0, -1, -1, -1], [-1, 1.0, 0.5, 1.0]]


def test_a_bad_row_is_refused_with_its_line_and_nothing_is_written(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = _labels(tmp_path / "bad.jsonl", [{"prompt": "Say hello.", "needs_flagship": 0},
                                           {"prompt": "Say goodbye.", "needs_flagship": 7}])
    assert _run("--labels", str(bad), "--store", str(tmp_path / "store")) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert not (tmp_path / "store" / "memory").exists()
    assert _run("--labels", str(bad), "--tenant", "a:b", "--store", str(tmp_path / "store")) == 2


def _cli(monkeypatch: pytest.MonkeyPatch, home: Path, *argv: str) -> int:
    """`cascade router memory add ...` through the gateway's own entry point, in process, with `home` as
    $CASCADE_HOME but the session's embedder caches (the fast artifact's table, the ONNX export): a cache changes
    how long a run takes, never what it computes (each test built the table again: 25-35 s a test)."""
    monkeypatch.setenv("CASCADE_HOME", str(cascade_home(home)))
    return main(["router", "memory", "add", *argv, "--artifact", str(DEFAULT_ARTIFACT)])


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def test_another_tenants_row_refuses_every_file_and_leaves_the_memory_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    good = _labels(tmp_path / "good.jsonl", [{"prompt": "Say hello.", "needs_flagship": 0, "tenant": "acme"}])
    assert _cli(monkeypatch, home, "--labels", str(good), "--tenant", "acme") == 0
    before = _files(home / "router" / "memory")
    assert set(before) == {"acme.json", "acme.npz"}
    capsys.readouterr()
    foreign = _labels(tmp_path / "foreign.jsonl", [{"prompt": "Say goodbye.", "needs_flagship": 1},
                                                   {"prompt": "Say hi.", "needs_flagship": 1, "tenant": "acme"},
                                                   {"prompt": "Prove it.", "needs_flagship": 1, "tenant": "globex"}])
    assert _cli(monkeypatch, home, "--labels", str(good), "--labels", str(foreign), "--tenant", "acme") == 2
    out, err = capsys.readouterr()
    assert err == f"error: {foreign}:3: field 'tenant' is 'globex', but these labels are for tenant 'acme'\n"
    assert out == "" and _files(home / "router" / "memory") == before  # the good file was not applied either


def test_contradicting_labels_in_the_files_are_counted_and_one_pair_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    labels = _labels(tmp_path / "a.jsonl", [{"prompt": "Say hello.", "needs_flagship": 1},
                                            {"prompt": "Prove that there are infinitely many primes.",
                                             "needs_flagship": 1},
                                            {"prompt": "Say hello.", "needs_flagship": 0}])
    assert _cli(monkeypatch, home, "--labels", str(labels)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("0 -> 3 labels, 1 prompts with conflicting labels (running gateways read it within "
                           "seconds)")
    assert out[1] == (f"these label files: 1 prompts with contradicting labels (targets at least 0.5 apart), e.g. "
                      f"{labels}:1 (target 1) against {labels}:3 (target 0.5)")
    memory, meta = load_memory(home / "router" / "memory" / "shared.json")
    assert meta["conflicting_prompts"] == 1 and memory.targets.tolist() == [1.0, 1.0, 0.5]  # kept, not averaged


@pytest.mark.redis
def test_check_ids_refuses_a_request_the_ledger_did_not_keep_or_kept_for_another_tenant(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    keys = LabelKeys(prefix)
    client = redis.Redis.from_url(SHARED_URL)
    try:
        for rid, tenant in (("req-a1", "acme"), ("req-a2", "acme"), ("req-g1", "globex")):
            client.hset(keys.prompt(rid), mapping={"text": f"prompt of {rid}", "tenant": tenant})
    finally:
        client.close()
    home, ledger = tmp_path / "home", ("--check-ids", "--redis-url", SHARED_URL, "--redis-prefix", prefix)
    rows = [{"id": "req-a1", "prompt": "prompt of req-a1", "needs_flagship": 1},
            {"id": "req-a2", "prompt": "prompt of req-a2", "needs_flagship": 0}]
    unknown = _labels(tmp_path / "unknown.jsonl", [rows[0], {**rows[1], "id": "req-zz"}])
    foreign = _labels(tmp_path / "foreign.jsonl", [rows[0], rows[1], {**rows[1], "id": "req-g1"}])
    assert _cli(monkeypatch, home, "--labels", str(unknown), "--tenant", "acme", *ledger) == 2
    assert capsys.readouterr().err.startswith(f"error: {unknown}:2: field 'id': no request 'req-zz' is on record")
    assert _cli(monkeypatch, home, "--labels", str(foreign), "--tenant", "acme", *ledger) == 2
    assert capsys.readouterr().err == (f"error: {foreign}:3: field 'id': request 'req-g1' is tenant 'globex''s, "
                                       "but these labels are for tenant 'acme'\n")
    assert _files(home / "router" / "memory") == {}
    assert _cli(monkeypatch, home, "--labels", str(foreign), *ledger) == 0  # the shared memory takes any tenant's
    assert _cli(monkeypatch, home, "--labels", str(_labels(tmp_path / "ok.jsonl", rows)), "--tenant", "acme",
                *ledger) == 0
    assert set(_files(home / "router" / "memory")) == {"acme.json", "acme.npz", "shared.json", "shared.npz"}


@pytest.mark.redis
def test_from_ledger_adds_feedback_on_any_pool_as_that_pools_label(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    keys = LabelKeys(prefix)
    kept: dict[EncodableT, EncodableT] = {"score": "0.3", "at": "1.0"}  # as redis-py's hset mapping types it
    client = redis.Redis.from_url(SHARED_URL)
    try:  # feedback on a middle tier's answer, on a micro answer, and on another tenant's flagship answer
        client.hset(keys.prompt("req-1"), mapping={**kept, "text": "Write a Python function that reverses a list.",
                                                   "pool": "code", "micro": "0", "tenant": "acme"})
        client.hset(keys.feedback("req-1"), mapping={"score": "0.0", "tenant": "acme"})
        client.hset(keys.prompt("req-2"), mapping={**kept, "text": "Say hello.", "pool": "general", "micro": "1",
                                                   "tenant": "acme"})
        client.hset(keys.feedback("req-2"), mapping={"score": "1.0", "tenant": "acme"})
        client.hset(keys.prompt("req-3"), mapping={**kept, "text": "Prove it.", "pool": "frontier", "micro": "0",
                                                   "tenant": "globex"})
        client.hset(keys.feedback("req-3"), mapping={"score": "0.5", "tenant": "globex"})
    finally:
        client.close()
    home, ledger = tmp_path / "home", ("--from-ledger", "--redis-url", SHARED_URL, "--redis-prefix", prefix)
    assert _cli(monkeypatch, home, *ledger, "--tenant", "acme") == 0
    assert "2 labelled requests in the ledger at" in capsys.readouterr().out
    memory, _ = load_memory(home / "router" / "memory" / "acme.json")
    assert memory.qualities is not None and set(memory.pools) == {"code", "general", "@micro", "@flagship"}
    table = {pool: np.nan_to_num(memory.qualities[:, i], nan=-1).tolist() for i, pool in enumerate(memory.pools)}
    # req-1 (code, thumbs down): the code pool's label only, no gap; req-2 (micro pool "general", up): both
    assert table == {"code": [0.0, -1], "general": [-1, 1.0], "@micro": [-1, 1.0], "@flagship": [-1, 1.0]}
    assert np.isnan(memory.targets[0]) and memory.targets[1] == 0.5  # gap_target(1, 1): no gap
    # again, and after a label file: the requests already taken are not taken twice
    assert _cli(monkeypatch, home, *ledger, "--tenant", "acme") == 0
    assert "2 labelled requests in the ledger at" in (out := capsys.readouterr().out) and ", 0 not yet" in out
    assert len(load_memory(home / "router" / "memory" / "acme.json")[0]) == 2
    more = _labels(tmp_path / "more.jsonl", [{"prompt": "Say goodbye.", "needs_flagship": 0}])
    assert _cli(monkeypatch, home, "--labels", str(more), *ledger, "--tenant", "acme") == 0
    assert ", 0 not yet in this memory" in capsys.readouterr().out
    acme, meta = load_memory(home / "router" / "memory" / "acme.json")
    assert len(acme) == 3 and meta["ledger_requests"] == ["req-1", "req-2"]
    assert _cli(monkeypatch, home, *ledger) == 0  # the shared memory takes every tenant's
    shared, _ = load_memory(home / "router" / "memory" / "shared.json")
    assert len(shared) == 3 and "frontier" in shared.pools
    capsys.readouterr()
    assert _cli(monkeypatch, home, *ledger, "--tenant", "initech") == 2
    assert "no label rows to add" in capsys.readouterr().err
    assert _cli(monkeypatch, home) == 2  # neither --labels nor --from-ledger
