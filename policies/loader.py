"""Load a policy file: YAML → duplicate keys → schema → cross-references → `LoadedPolicy`.

Every failure is a `PolicyError` whose `problems` each read ``FILE:LINE: yaml.path: what is wrong (fix)``.
Loading is pure: it reads one file and touches nothing else, so a bad file can never disturb a
running policy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from policies.checks import Loc, reference_problems
from policies.fields import did_you_mean, keys_at
from policies.schema import Policy
from policies.threshold import THRESHOLD_TAGS

__all__ = ["LoadedPolicy", "PolicyError", "default_policy_path", "dotted_path", "load_policy", "parse_policy"]


class PolicyError(Exception):
    """A policy file that cannot be used. `problems` holds one human-readable line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid policy {source}:\n  " + "\n  ".join(problems))


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A checked policy with its identity: `version` is the content hash every decision carries. `placements`: each
    tier's placement on the pool map, by pool (opaque here: the gateway loads them beside the policy and swaps them
    with it, `gateway.serving.routing.placements`); empty until loaded."""

    policy: Policy
    version: str
    source: str
    text: str = field(default="", repr=False, compare=False)
    placements: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def at(self, loc: Sequence[int | str], message: str) -> str:
        """`message` about the value at `loc` (e.g. ("pools", "micro")), prefixed with the policy's file:line:
        for checks made after parsing (what the machine has), worded like the loader's own."""
        root = _compose(self.text, self.source)[0] if self.text else None
        return _at(self.source, root, tuple(loc), message)


def dotted_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a path: ("pools", "micro", "engine") -> "pools.micro.engine",
    list indexes as [i]. Empty for the top level."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _yaml_path(loc: Loc) -> str:
    return dotted_path(loc) or "(top level)"


def _line_of(node: yaml.Node | None, loc: Loc) -> int | None:
    """1-based line of the deepest YAML node found along `loc` (pydantic's error location)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _at(source: str, root: yaml.Node | None, loc: Loc, message: str) -> str:
    line = _line_of(root, loc)
    return f"{source}:{line}: {_yaml_path(loc)}: {message}" if line else f"{source}: {_yaml_path(loc)}: {message}"


def _duplicate_keys(node: yaml.Node | None, loc: Loc = ()) -> Iterator[tuple[Loc, int, str]]:
    """(path, line, message) for every mapping key given twice (PyYAML would silently keep the last)."""
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = str(getattr(key, "value", ""))
            line = key.start_mark.line + 1
            if name in first and name != "<<":
                yield (*loc, name), line, f"duplicate key {name!r} (first at line {first[name]}); remove one"
            first.setdefault(name, line)
            yield from _duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*loc, i))


_CUSTOM_MESSAGES = frozenset({"value_error", "assertion_error", "missing", "extra_forbidden"})
"""Error types whose message already names the value (ours) or where there is no value to show."""


def _hint(err: ErrorDetails) -> str:
    """How to fix one schema error, as ops read it."""
    if err["type"] == "extra_forbidden":
        guess = did_you_mean(str(err["loc"][-1]), keys_at(Policy, err["loc"][:-1]))
        fix = f"did you mean `{guess}`?" if guess else "check its spelling or remove it;"
        return f" (unknown key: {fix} `cascade policy schema` lists the keys)"
    if err["type"] == "missing":
        return " (add this key)"
    if err["type"].startswith("union_tag"):
        tag = str((err.get("ctx") or {}).get("discriminator", "'type'")).strip("'")
        return f" (fix the `{tag}`)"
    if err["type"] not in _CUSTOM_MESSAGES and isinstance(err["input"], str | int | float | bool):
        return f" (got {err['input']!r})"
    return ""


def _schema_problems(source: str, exc: ValidationError, root: yaml.Node | None) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        # drop pydantic's discriminator tags ("local", "raise_threshold", ...) from the path shown to ops
        loc = tuple(p for i, p in enumerate(err["loc"]) if not _is_tag(err["loc"], i))
        problems.append(_at(source, root, loc, f"{err['msg']}{_hint(err)}"))
    return problems


def _is_tag(loc: tuple[int | str, ...], i: int) -> bool:
    """Whether loc[i] is a discriminator tag pydantic inserts (after pools.NAME, `action`, routing.threshold or an
    engine's `speculative`)."""
    if i > 0 and loc[i - 1] == "threshold" and loc[:1] == ("routing",) and loc[i] in THRESHOLD_TAGS:
        return True
    if i > 0 and loc[i - 1] == "speculative" and loc[i] in ("ngram", "draft"):
        return True
    return (loc[:1] == ("pools",) and i == 2) or (i > 0 and loc[i - 1] == "action" and isinstance(loc[i], str))


def _compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(source, [_yaml_problem(source, exc)]) from exc
    return root, data


def _yaml_problem(source: str, exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped, what it found, where the construct it was reading began."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{source}: not valid YAML: {' '.join(str(exc).split())}"
    mark = exc.problem_mark
    began = exc.context_mark
    context = f" ({exc.context} that starts at line {began.line + 1})" if exc.context and began is not None else ""
    fix = "indent with spaces, not tabs" if "\\t" in str(exc.problem) else (
        "check the indentation, quotes and brackets here and on the lines above")
    return f"{source}:{mark.line + 1}: column {mark.column + 1}: not valid YAML: {exc.problem}{context} ({fix})"


def parse_policy(text: str, source: str = "<policy>") -> LoadedPolicy:
    """Check policy text. Raises `PolicyError` listing every problem found (of the first failing phase:
    YAML syntax, then duplicate keys, then the schema, then cross-references)."""
    root, data = _compose(text, source)
    dupes = [f"{source}:{line}: {_yaml_path(loc)}: {msg}" for loc, line, msg in _duplicate_keys(root)]
    if dupes:
        raise PolicyError(source, dupes)
    if not isinstance(data, dict):
        raise PolicyError(source, [f"{source}: the top level must be a mapping with `pools` and `routing`"])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(source, _schema_problems(source, exc, root)) from exc
    problems = [_at(source, root, loc, msg) for loc, msg in reference_problems(policy)]
    if problems:
        raise PolicyError(source, problems)
    version = hashlib.sha256(text.encode()).hexdigest()[:12]
    return LoadedPolicy(policy=policy, version=version, source=source, text=text)


def default_policy_path() -> Path:
    """The demo policy shipped in this package (`policies/default.yaml`)."""
    return Path(str(files("policies").joinpath("default.yaml")))


def load_policy(path: str | Path) -> LoadedPolicy:
    """Read and check a policy file. Raises `PolicyError` (also for an unreadable file)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, [f"{source}: cannot read the file: {exc.strerror}"]) from exc
    return parse_policy(text, source)
