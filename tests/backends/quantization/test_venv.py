"""How the quantization venv is installed: uv with pip's settings where uv is, pip where it is not or uv fails.
The real install is `test_demo.py`'s (it creates the venv where missing); these check the commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.quantization import venv as venv_module
from backends.quantization.quantize import _worker_env
from backends.quantization.venv import QUANT_REQUIREMENTS, QuantVenvError, ensure_quant_venv, uv_install_args


def test_uv_gets_pips_indexes_links_constraints_and_ca_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://index.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a/simple file:///b/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/c.txt")
    monkeypatch.setenv("PIP_CERT", "/etc/ca.pem")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    args, env = uv_install_args()
    assert args == ["--index-url", "https://index.example/simple", "--extra-index-url", "file:///a/simple",
                    "--extra-index-url", "file:///b/simple", "--find-links", "/wheels", "--constraint", "/etc/c.txt",
                    "--index-strategy", "unsafe-best-match"]
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem"}


def _record(monkeypatch: pytest.MonkeyPatch, fail_uv: bool) -> list[list[str]]:
    ran: list[list[str]] = []

    def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        ran.append(cmd)
        if fail_uv and cmd[0] == "/opt/uv" and cmd[1] == "pip":
            raise QuantVenvError("`uv pip install` failed (exit 2); log x:\nno solution")
        if cmd[1:3] in (["-m", "venv"], ["venv", "--python"]):  # what a created venv has
            python = Path(cmd[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.touch()

    monkeypatch.setattr(venv_module, "_run", run)
    monkeypatch.setattr(venv_module, "_uv", lambda: "/opt/uv")
    monkeypatch.setattr(venv_module, "uv_install_args", lambda: (["--find-links", "/w"], {}))
    return ran


def test_uv_installs_each_group_in_order_and_the_marker_is_written_last(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _record(monkeypatch, fail_uv=False)
    python = ensure_quant_venv(tmp_path, say=lambda _: None)
    assert [cmd[:2] for cmd in ran] == [["/opt/uv", "venv"]] + [["/opt/uv", "pip"]] * len(QUANT_REQUIREMENTS)
    assert [cmd[-len(group):] for cmd, group in zip(ran[1:], QUANT_REQUIREMENTS, strict=True)] == \
        [list(group) for group in QUANT_REQUIREMENTS]
    marker = json.loads((python.parents[1] / ".cascade-quant-venv.json").read_text())
    assert marker["requirements"] == [list(r) for r in QUANT_REQUIREMENTS]
    assert ensure_quant_venv(tmp_path, say=lambda _: None) == python and len(ran) == 1 + len(QUANT_REQUIREMENTS)


def test_a_failed_uv_install_starts_again_with_pip_and_says_so(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _record(monkeypatch, fail_uv=True)
    said: list[str] = []
    ensure_quant_venv(tmp_path, say=said.append)
    pip = [cmd for cmd in ran if cmd[0] != "/opt/uv"]
    assert pip[0][1:3] == ["-m", "venv"] and all(cmd[1:4] == ["-m", "pip", "install"] for cmd in pip[1:])
    assert len(pip) == 1 + len(QUANT_REQUIREMENTS)
    assert any("uv failed (`uv pip install` failed (exit 2); log x:); installing with pip" in line for line in said)


def test_cascade_installer_pip_skips_uv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_INSTALLER", "pip")
    assert venv_module._uv() is None


def test_the_worker_writes_the_bytecode_the_install_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """uv installs no bytecode (`uv_install_args`), so the worker must write it even where the caller turns that
    off: otherwise every quantization compiles torch's imports again."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = _worker_env(1)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["OMP_NUM_THREADS"] == "1"
