"""A pool's `speculative` block: typed by `method`, every mistake refused with file:line, the old free dict
refused with what replaced it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies.loader import PolicyError, parse_policy
from policies.schema import EngineSpec
from policies.speculative import DraftSpeculation, NgramSpeculation, describe, tokens_per_step
from tests.policies.test_loader import GOOD

_MICRO_ENGINE = "served_name: micro\n"


def _with_engine_lines(*lines: str) -> str:
    """The default policy with `lines` added to the micro pool's engine block."""
    added = "".join(f"      {line}\n" for line in lines)
    assert GOOD.count(_MICRO_ENGINE) == 1
    return GOOD.replace(_MICRO_ENGINE, _MICRO_ENGINE + added)


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return err.value.problems


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_ngram_and_draft_parse_into_their_types() -> None:
    ngram = parse_policy(_with_engine_lines("speculative: {method: ngram, num_speculative_tokens: 3}"))
    spec = ngram.policy.pools["micro"].engine.speculative  # type: ignore[union-attr]
    assert spec == NgramSpeculation(method="ngram", num_speculative_tokens=3, prompt_lookup_min=2,
                                    prompt_lookup_max=4)
    draft = parse_policy(_with_engine_lines("speculative: {method: draft, num_speculative_tokens: 2, "
                                            "model: 'demo:draft'}"))
    assert draft.policy.pools["micro"].engine.speculative == DraftSpeculation(  # type: ignore[union-attr]
        method="draft", num_speculative_tokens=2, model="demo:draft")
    assert parse_policy(GOOD).policy.pools["micro"].engine.speculative is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("lines", "expected"), [
    (("speculative:", "  method: ngram", "  num_speculative_tokens: 4", "  prompt_lookup_maximum: 4"),
     "pools.micro.engine.speculative.prompt_lookup_maximum: Extra inputs are not permitted (unknown key: did you mean "
     "`prompt_lookup_max`?"),
    (("speculative:", "  method: eagle", "  num_speculative_tokens: 4"),
     "pools.micro.engine.speculative: Input tag 'eagle' found using 'method' does not match any of the expected "
     "tags: 'ngram', 'draft'"),
    (("speculative:", "  method: draft", "  num_speculative_tokens: 4"),
     "pools.micro.engine.speculative.model: Field required (add this key)"),
    (("speculative:", "  method: ngram", "  num_speculative_tokens: 0"),
     "pools.micro.engine.speculative.num_speculative_tokens: Input should be greater than or equal to 1"),
    (("speculative:", "  method: ngram", "  num_speculative_tokens: 4", "  prompt_lookup_min: 5",
      "  prompt_lookup_max: 3"), "prompt_lookup_min 5 > prompt_lookup_max 3: no n-gram length fits; swap them"),
], ids=["misspelt-key", "unknown-method", "draft-without-model", "no-tokens", "empty-window"])
def test_mistakes_come_with_file_line_and_what_is_wrong(lines: tuple[str, ...], expected: str) -> None:
    text = _with_engine_lines(*lines)
    (problem,) = _problems(text)
    assert expected in problem
    assert problem.startswith("p.yaml:")
    line = int(problem.split(":")[1])
    assert _line(text, "speculative:") <= line <= _line(text, "speculative:") + len(lines)


def test_the_old_free_dict_is_refused_with_what_replaced_it() -> None:
    text = _with_engine_lines("speculative_config: {method: ngram, num_speculative_tokens: 4}")
    (problem,) = _problems(text)
    assert problem.startswith("p.yaml:") and "pools.micro.engine" in problem
    assert "speculative_config was replaced by speculative: {method: ngram | draft" in problem
    with pytest.raises(ValidationError, match="speculative_config was replaced"):
        EngineSpec.model_validate({"model": "m", "served_name": "m", "speculative_config": {"method": "ngram"}})


def test_tokens_per_step_runs_from_one_to_k_plus_one() -> None:
    assert tokens_per_step(4, 0.0) == 1.0
    assert tokens_per_step(4, 1.0) == 5.0
    assert tokens_per_step(4, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)


def test_describe_says_what_each_method_does() -> None:
    ngram = describe(NgramSpeculation(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2,
                                      prompt_lookup_max=3))
    assert "the last 3..2 tokens are looked up" in ngram[0] and "no draft model" in ngram[0]
    assert "yields 1..5 tokens" in ngram[1] and "2.31 at 0.6" in ngram[1]
    draft = describe(DraftSpeculation(method="draft", num_speculative_tokens=2, model="demo:draft"))
    assert "draft model demo:draft proposes 2 tokens" in draft[0] and "yields 1..3 tokens" in draft[1]
