"""Load a policy file: YAML → schema check → cross-reference check → `LoadedPolicy`.

Every failure is a `PolicyError` whose message names the file, the line, the YAML path and the fix.
Loading is pure: it reads one file and touches nothing else, so a bad file can never disturb a
running policy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.schema import Policy

__all__ = ["LoadedPolicy", "PolicyError", "load_policy", "parse_policy"]


class PolicyError(Exception):
    """A policy file that cannot be used. `problems` holds one human-readable line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid policy {source}:\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A checked policy with its identity: `version` is the content hash every decision carries."""

    policy: Policy
    version: str
    source: str


def _yaml_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the deepest YAML node found along `loc` (pydantic's error location)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _schema_problems(source: str, exc: ValidationError, root: yaml.Node | None) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        # drop pydantic's discriminator tags ("local"/"remote") from the path shown to ops
        loc = tuple(p for p in err["loc"] if p not in ("local", "remote") or err["loc"].index(p) < 2)
        line = _line_of(root, loc)
        where = f"{source}:{line}" if line else source
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = " (unknown key: check its spelling or remove it; `cascade policy schema` lists the keys)"
        elif err["type"] == "missing":
            hint = " (add this key)"
        problems.append(f"{where}: {_yaml_path(loc)}: {err['msg']}{hint}")
    return problems


def _reference_problems(source: str, policy: Policy) -> list[str]:
    pools = set(policy.pools)
    problems = []

    def need_pool(name: str | None, where: str) -> None:
        if name is not None and name not in pools:
            problems.append(f"{source}: {where}: unknown pool {name!r}; defined pools: {sorted(pools)}")

    need_pool(policy.routing.micro_pool, "routing.micro_pool")
    need_pool(policy.routing.flagship_pool, "routing.flagship_pool")
    seen: set[str] = set()
    for i, rule in enumerate(policy.routing.rules):
        where = f"routing.rules[{i}]"
        if rule.name in seen:
            problems.append(f"{source}: {where}.name: duplicate rule name {rule.name!r}; names must be unique")
        seen.add(rule.name)
        need_pool(rule.pool, f"{where}.pool")
        if (rule.pool is None) == (rule.threshold is None):
            problems.append(f"{source}: {where}: give exactly one of `pool` or `threshold`")
    for alias, pool in policy.aliases.items():
        need_pool(pool, f"aliases.{alias}")
        if alias == "auto" or alias in pools:
            problems.append(f"{source}: aliases.{alias}: alias shadows a pool name or 'auto'; rename it")
    for name, tenant in policy.tenants.items():
        for pool in tenant.allowed_pools or ():
            need_pool(pool, f"tenants.{name}.allowed_pools")
    return problems


def parse_policy(text: str, source: str = "<policy>") -> LoadedPolicy:
    """Check policy text. Raises `PolicyError` listing every problem found."""
    try:
        root = yaml.compose(text)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise PolicyError(source, [f"{where}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise PolicyError(source, [f"{source}: the top level must be a mapping with `pools` and `routing`"])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(source, _schema_problems(source, exc, root)) from exc
    problems = _reference_problems(source, policy)
    if problems:
        raise PolicyError(source, problems)
    version = hashlib.sha256(text.encode()).hexdigest()[:12]
    return LoadedPolicy(policy=policy, version=version, source=source)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read and check a policy file. Raises `PolicyError` (also for an unreadable file)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, [f"{source}: cannot read the file: {exc.strerror}"]) from exc
    return parse_policy(text, source)
