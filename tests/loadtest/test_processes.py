"""`loadtest.processes.free_port`: a port for a server about to start, out of the way of outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from loadtest import processes
from loadtest.processes import free_port


def test_ports_are_drawn_below_the_ephemeral_range_and_are_free() -> None:
    ports = {free_port() for _ in range(20)}
    low = processes._ephemeral_low()
    assert low > 21000, "this host's ephemeral range leaves no room below it: the test means nothing here"
    assert all(20000 <= port < low for port in ports) and len(ports) > 1  # drawn, not one fixed port
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when drawn


def test_without_room_below_the_range_the_kernel_chooses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text("1024\t65000\n")
    assert processes._ephemeral_low(tmp_path / "range") == 1024
    assert processes._ephemeral_low(tmp_path / "absent") == 0
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: 1024)
    assert 0 < free_port() < 65536


def test_each_xdist_worker_draws_from_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    monkeypatch.setattr(processes, "_ephemeral_low", lambda: 32768)
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(processes._slice(20000, 32768))
        assert all(slices[-1][0] <= free_port() < slices[-1][1] for _ in range(5))
    assert slices == [(20000, 24256), (24256, 28512), (28512, 32768)]  # apart, and together the whole range
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")  # not one of the count: the whole range
    assert processes._slice(20000, 32768) == (20000, 32768)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert processes._slice(20000, 32768) == (20000, 32768)
