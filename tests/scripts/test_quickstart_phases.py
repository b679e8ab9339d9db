"""The quick start's phase clock (scripts/quickstart_phases.py): it passes the demo's output through unchanged
and times the phases from the lines the real demo prints (their text is taken from gateway.cli.demo's own
output, so a change there that the clock no longer recognises fails here)."""

from __future__ import annotations

import io

from tests.scripts import ROOT, load_script

phases = load_script("quickstart_phases")

# Lines as the demo prints them (gateway/cli/demo.py: _wait_ready, _send_prompts, _print_costs).
DEMO = [
    "Redis found at redis://127.0.0.1:6379/0\n",
    "  [   0 s] waiting for micro: loading, flagship: loading\n",
    "  ready after 95 s\n",
    "\n",
    f"{'prompt':<52} {'stream':>6} {'pool':>9} {'score':>6} {'in':>4} {'out':>4} {'ttft ms*':>8}\n",
    "Hi! How are you today?                                   no     micro  0.213   12   48    310.0\n",
    "Translate 'good morning' into French.                   yes  flagship  0.291   14   48     80.2\n",
    "* streaming: time to the first token; non-streaming: time to the whole answer\n",
    "\n",
    "cost totals in the ledger (last 7 days, every run so far):\n",
    "stopping the gateway and its engines\n",
]


def test_the_demo_source_still_prints_the_lines_the_clock_looks_for() -> None:
    source = (ROOT / "gateway" / "cli" / "demo.py").read_text()
    assert 'f"  ready after ' in source and "{'prompt':<52}" in source and '"cost totals in the ledger' in source


def test_phases_are_timed_from_the_demo_lines() -> None:
    clock = phases.PhaseClock(start=100.0)
    for i, line in enumerate(DEMO):
        clock.see(line, 100.0 + 10 * i)
    assert clock.durations(end=200.0) == [("engines up", 20.0), ("first routed answer", 30.0), ("report", 50.0)]


def test_engines_never_up_gives_no_later_phases() -> None:
    clock = phases.PhaseClock(start=0.0)
    for line in DEMO[:2]:
        clock.see(line, 5.0)
    assert clock.durations(end=60.0) == []


def test_output_passes_through_and_the_table_ends_it() -> None:
    out = io.StringIO()
    code = phases.main(["--started", "0", "--phase", "setup=12.5", "--phase", "models=3"],
                       stdin=io.StringIO("".join(DEMO)), stdout=out)
    text = out.getvalue()
    assert code == 0 and text.startswith("".join(DEMO))
    table = text[len("".join(DEMO)):]
    for name in ("setup", "models", "engines up", "first routed answer", "report", "total"):
        assert f"  {name:<22}" in table
    assert "   12.5 s" in table
