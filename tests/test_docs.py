"""The README stays a user's page (at most 220 lines, its local links resolve); modules stay small."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_at_most_220_lines_and_its_local_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 220
    links = [m.split("#")[0] for m in re.findall(r"\]\(([^)]+)\)", text) if "://" not in m]
    assert len(links) > 10
    missing = [link for link in links if link and not (ROOT / link).exists()]
    assert missing == []


def test_no_module_of_gateway_is_over_400_lines() -> None:
    modules = sorted((ROOT / "gateway").rglob("*.py"))
    assert len(modules) > 100
    long = {m.name: n for m in modules if (n := len(m.read_text().splitlines())) > 400}
    assert long == {}
