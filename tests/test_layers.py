"""The shape of the house, checked from the code's imports: no import circles (lazy imports included), and
no upward imports: `policies` is pure (it imports only itself), `router_models` and `backends` never import
the gateway, and nothing but the benchmarks imports `loadtest`. Also: every layer agrees where state lives."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "backends", "policies", "router_models", "loadtest")
# what each package may import from the others (itself always)
ALLOWED = {
    "policies": set(),
    "router_models": set(),
    "backends": {"policies"},
    "gateway": {"backends", "policies", "router_models"},
    "loadtest": {"gateway", "backends", "policies", "router_models"},
}
# inside a package, what each sub-package may import from its siblings, at any depth (modules at the package's top,
# such as `backends.background` or `gateway.settings`, are open to all of them)
SIBLINGS = {
    "backends.models": set(),
    "backends.clients": set(),
    "backends.engines": {"backends.models"},
    "backends.quantization": {"backends.engines", "backends.models"},
    "router_models.embedders": set(),
    "router_models.serving": {"router_models.embedders"},  # the serving path never imports training code
    "router_models.training": {"router_models.embedders", "router_models.serving"},
    "loadtest.load": set(),
    "loadtest.bench": {"loadtest.load"},
    "loadtest.scenarios": {"loadtest.load", "loadtest.bench"},
    "loadtest.studies": {"loadtest.load", "loadtest.bench"},  # one-off studies: no benchmark imports them
    # the gateway: metrics are a leaf every package may import (of the gateway it reads only the ledger's record);
    # control never imports the request path (the router reads the live threshold, not the other way round)
    "gateway.ledger": set(),
    "gateway.telemetry": {"gateway.ledger"},
    "gateway.control": {"gateway.telemetry"},
    "gateway.control.fleet": set(),
    "gateway.control.adaptation": set(),
    "gateway.control.policy": {"gateway.control.fleet"},  # a reload the pools cannot apply yet (PolicyNotApplied)
    "gateway.serving.openai": set(),
    "gateway.serving.routing": {"gateway.serving.openai"},
    "gateway.serving.records": {"gateway.serving.openai", "gateway.serving.routing"},
    "gateway.serving.sending": {"gateway.serving.openai", "gateway.serving.routing", "gateway.serving.records"},
    # batch lines go through the serving path (the chat service, the endpoints' parsers) under the running policy;
    # nothing on the request path imports the batches back (the lane is a protocol the serving parts hold)
    "gateway.batches": {"gateway.serving", "gateway.control", "gateway.tenancy"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(tree: ast.AST) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every import, in functions and under `if TYPE_CHECKING:` too: an import made late or
    for the type checker alone is still a dependency, and a circle through one is still a circle."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        stack.extend(ast.iter_child_nodes(node))


def _parse(path: Path) -> ast.Module:
    """`ast.parse` of a file, tried again when CPython 3.11 raises "AST constructor recursion depth mismatch", a
    spurious SystemError reported from threaded programs (python/cpython#106905; a pytest-xdist worker keeps earlier
    tests' server threads). This test failed once in the fast tier here with a message cut at "System..." (2026-12-07),
    most likely that. A real syntax error is a SyntaxError, not this."""
    source = path.read_text(encoding="utf-8")
    for _ in range(2):
        try:
            return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        for target, names in _imports(_parse(path)):
            if target.split(".")[0] not in PACKAGES:
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges.update(subs or ([target] if target in modules else []))
        edges.discard(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_code() -> None:
    graph = _graph()
    assert "gateway.cli.main" in graph and "gateway.cli.serve" in graph["gateway.cli.main"]  # lazy import seen
    assert "backends.engines.args" in graph["backends.engines.supervisor"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_no_upward_imports() -> None:
    wrong = sorted(
        f"{src} imports {dst}"
        for src, targets in _graph().items()
        for dst in targets
        if (a := src.split(".")[0]) != (b := dst.split(".")[0]) and b not in ALLOWED[a]
    )
    assert wrong == []


def _ruled(module: str) -> list[str]:
    """Every sub-package named in SIBLINGS that holds `module`, at any depth (`gateway.control` and
    `gateway.control.fleet` both hold `gateway.control.fleet.pool_set`)."""
    parts = module.split(".")
    return [sub for n in range(2, len(parts)) if (sub := ".".join(parts[:n])) in SIBLINGS]


def _sibling(sub: str, module: str) -> str | None:
    """The sibling sub-package of `sub` that holds `module`; None for a module outside `sub`'s parent, inside `sub`
    itself, or at the parent's top (open to every sub-package)."""
    parent = sub.rsplit(".", 1)[0]
    parts = module.split(".")
    depth = parent.count(".") + 2
    if not module.startswith(f"{parent}.") or len(parts) <= depth:
        return None
    sibling = ".".join(parts[:depth])
    return None if sibling == sub else sibling


def test_sub_packages_import_only_downwards() -> None:
    graph = _graph()
    for sub in SIBLINGS:  # every sub-package named here exists, so a rename cannot empty the rule
        assert any(m.startswith(f"{sub}.") for m in graph), sub
    assert _ruled("gateway.control.fleet.pool_set") == ["gateway.control", "gateway.control.fleet"]
    assert _sibling("gateway.control.fleet", "gateway.control.adaptation.degradation") == "gateway.control.adaptation"
    assert _sibling("gateway.control.fleet", "gateway.control.engine_host") is None  # the package's top: open
    assert _sibling("gateway.control", "gateway.serving.routing.router") == "gateway.serving"
    wrong = sorted(
        f"{src} imports {dst}"
        for src, targets in graph.items()
        for sub in _ruled(src)
        for dst in targets
        if (b := _sibling(sub, dst)) is not None and b not in SIBLINGS[sub]
    )
    assert wrong == []


def test_no_package_imports_the_tests() -> None:
    wrong = sorted(f"{name} imports {target}" for name, path in _modules().items()
                   for target, _ in _imports(_parse(path))
                   if target.split(".")[0] == "tests")
    assert wrong == []


@pytest.mark.parametrize("env_home", [None, "relative/home"])
def test_every_layer_agrees_where_state_lives(tmp_path: Path, env_home: str | None) -> None:
    """Started from another folder, the gateway's settings, the demo models, the router's caches and its
    artifact store all resolve the same state folder (they used to pick three different ones)."""
    code = (
        "from gateway.settings import default_home as g\n"
        "from backends.models.demo import default_home as b\n"
        "from router_models.embedders.onnx_minilm import default_cache_dir as c\n"
        "from router_models.serving.artifact_store import default_store_dir as r\n"
        "print(g(), b(), c().parent, r().parent, sep='\\n')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CASCADE_HOME"} | {"PYTHONPATH": str(ROOT)}
    if env_home is not None:
        env["CASCADE_HOME"] = env_home
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    expected = (tmp_path / (env_home or ".cascade")).resolve()
    assert out == [str(expected)] * 4
