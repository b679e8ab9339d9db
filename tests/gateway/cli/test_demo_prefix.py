"""The quick start's records stay apart: `cascade demo` runs its gateway and reads its report under its own Redis
key prefix, and the tests write under theirs, never under the `cascade:` a real gateway and its report use."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.cli import demo
from gateway.settings import Settings
from tests.conftest import TEST_PREFIX


def _demo_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cascade")
    demo.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["demo", *argv])


def test_the_demo_serves_and_reports_under_its_own_prefix(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = _demo_args()
    assert args.prefix == demo.DEMO_PREFIX == "cascade-demo:"
    command = demo.gateway_command(args)
    assert command[command.index("--redis-prefix") + 1] == "cascade-demo:"
    read: list[str] = []

    def print_report(url: str, by: str, days: int, prefix: str) -> int:
        read.append(prefix)
        return 0

    monkeypatch.setattr("gateway.costs.cli.print_report", print_report)
    assert demo._print_costs("redis://127.0.0.1:6379/0", args.prefix) == 0
    assert read == ["cascade-demo:"] and "prefix cascade-demo:" in capsys.readouterr().out
    assert demo.gateway_command(_demo_args("--prefix", "mine:"))[-1] == "mine:"


def test_the_prefix_comes_from_the_environment_and_the_tests_set_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TEST_PREFIX != "cascade:"
    assert Settings(policy_path=Path("p.yaml")).redis_prefix == TEST_PREFIX
    monkeypatch.setenv("CASCADE_REDIS_PREFIX", "team-a:")
    assert Settings(policy_path=Path("p.yaml")).redis_prefix == "team-a:"
    monkeypatch.delenv("CASCADE_REDIS_PREFIX")
    assert Settings(policy_path=Path("p.yaml")).redis_prefix == "cascade:"
