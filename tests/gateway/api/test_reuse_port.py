"""The port `serve --workers N` holds: the parent's socket (bound with SO_REUSEPORT, never listening) keeps every
other program off the port while the workers, binding the same way, still share it and take its connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.api.workers import WorkerGroup, reuse_port_socket
from gateway.settings import Settings
from tests.servers import free_port


def test_a_held_port_refuses_other_programs_and_admits_the_workers() -> None:
    port = free_port()
    with reuse_port_socket("127.0.0.1", port):  # the parent's hold
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # a program binding the usual way (a server that drew the same port)
        with reuse_port_socket("127.0.0.1", port) as worker:
            worker.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = worker.accept()  # the connection went to the listening worker, not the hold
                conn.close()


def test_the_parent_refuses_a_port_already_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            reuse_port_socket("127.0.0.1", taken.getsockname()[1])


async def test_a_group_on_a_taken_port_exits_1_in_one_line_and_starts_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(policy_path=tmp_path / "policy.yaml", home=tmp_path, scorer="none")
        group = WorkerGroup(settings, "127.0.0.1", port, 2, "WARNING", False)
        assert await group.run() == 1
    assert group.procs == [] and group.engines is None
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
