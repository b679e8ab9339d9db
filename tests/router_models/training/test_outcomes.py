"""Reading real outcomes: each source's format on a miniature copy, and the real data where it is present."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from router_models.serving.scorer import conversation_shape, conversation_text, prompt_shape
from router_models.training.outcomes import DEFAULT_ROUTING_DIR, DEFAULT_SOURCES, SOURCES, load_outcomes, prompt_key
from router_models.training.targets import TARGETS, targets


def _jsonl_gz(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def _mini(root: Path) -> Path:
    mmlu = root / "routellm-mmlu" / "responses"
    mmlu.mkdir(parents=True)
    with (mmlu / "mmlu_anatomy.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"])
        w.writerows([["What is X?\nA. a\nAnswer:", "False", "True"], ["Dropped?\nAnswer:", "True", "True"]])
    contaminated = json.dumps({"eval_prompt": "Dropped?\nAnswer:"})
    (root / "routellm-mmlu" / "contaminated_prompts.jsonl").write_text(contaminated + "\n")
    gsm = root / "routellm-gsm8k"
    gsm.mkdir()
    with (gsm / "gsm8k_responses.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview", "x_response"])
        w.writerow(["Janet has 3 ducks.", "True", "False", "text"])
    zero = [{"id": "z1", "prompt": "Janet has 3 ducks.", "source": "ZeroEval/gsm", "Meta-Llama-3.1-8B-Instruct": "1",
             "Qwen2-7B-Instruct": "None", "gpt-4o-2024-08-06": "1", "overlap": "[]"},
            {"id": "z2", "prompt": "No outcome", "source": "ZeroEval/crux", "Meta-Llama-3.1-8B-Instruct": "None",
             "gpt-4o-2024-08-06": "1", "overlap": "[]"}]
    _jsonl_gz(root / "zeroeval" / "zeroeval.jsonl.gz", zero)
    _jsonl_gz(root / "zeroeval" / "zeroeval-all-models.jsonl.gz", [{"id": "z1", "o1-mini": "1"}])
    return root


def test_each_format_is_read_with_its_models_and_keys(tmp_path: Path) -> None:
    ex = load_outcomes(_mini(tmp_path), sources=["routellm-mmlu", "routellm-gsm8k", "zeroeval"])
    by_source = {e.source: e for e in ex}
    # the contaminated prompt and the one without a micro-class outcome are dropped
    assert [e.source for e in ex] == ["routellm-mmlu", "routellm-gsm8k", "zeroeval"]
    mmlu = by_source["routellm-mmlu"]
    assert (mmlu.weak, mmlu.strong, mmlu.target, mmlu.label, mmlu.group) == (0.0, 1.0, 1.0, 1, "anatomy")
    assert by_source["routellm-gsm8k"].target == 0.0
    zero = by_source["zeroeval"]
    assert (zero.weak, zero.strong) == (1.0, 1.0)  # the missing Qwen outcome is not counted as wrong
    assert "o1-mini" in zero.models and math.isnan(zero.outcomes[zero.models.index("Qwen2-7B-Instruct")])
    assert zero.key == by_source["routellm-gsm8k"].key == prompt_key("Janet has 3 ducks.")


_LLAMA, _MISTRAL, _SONNET, _OPUS = ("Llama-2-7b-chat-hf", "Mistral-7B-Instruct-v0.1", "claude-3-5-sonnet-20240620",
                                    "claude-3-opus-20240229")
TURNS = [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "..."},
         {"role": "user", "content": "Now one about rain."}]


def _rmb(root: Path) -> list[str]:
    """A miniature rmb-helpfulness file; returns the texts of its usable rows (as the gateway scores them)."""
    rows: list[dict[str, object]] = [
        {"id": "r1", "prompt": "Fix my SQL join", "category": "Helpfulness/Code/Debugging",
         "scores": {_LLAMA: 0.0, _SONNET: 1.0, _OPUS: 1.0}, "pairs": [[_SONNET, _LLAMA], [_OPUS, _LLAMA]]},
        {"id": "r2", "prompt": "Write a haiku.", "messages": TURNS, "category": "Helpfulness/Generation/Poetry",
         "scores": {_MISTRAL: 1.0, _OPUS: 0.0, "Gemini-pro": 0.5},
         "pairs": [[_MISTRAL, _OPUS], ["Gemini-pro", _OPUS], [_MISTRAL, "Gemini-pro"]]},
        {"id": "r3", "prompt": "No frontier answer judged", "category": "Helpfulness/Chat/Small talk",
         "scores": {_LLAMA: 1.0, "Gemini-pro": 0.0}, "pairs": [[_LLAMA, "Gemini-pro"]]},
    ]
    beaten = [[big, small] for big in (_SONNET, _OPUS) for small in (_LLAMA, _MISTRAL)]  # the usual order
    rows += [{"id": f"u{i}", "prompt": f"Prove lemma {i}", "category": "Helpfulness/Reasoning/Math",
              "scores": {_LLAMA: 0.0, _MISTRAL: 0.0, _SONNET: 1.0, _OPUS: 1.0}, "pairs": beaten} for i in range(4)]
    _jsonl_gz(root / "rmb-helpfulness" / "rmb-helpfulness.jsonl.gz", rows)
    return ["Fix my SQL join", conversation_text(TURNS)]


def test_preferences_are_read_with_their_pairs_and_the_conversation_text_and_shape(tmp_path: Path) -> None:
    texts = _rmb(tmp_path)
    code, haiku, *usual = load_outcomes(tmp_path, sources=["rmb-helpfulness"])  # r3: no frontier score, dropped
    assert len(usual) == 4
    assert [code.text, haiku.text] == texts and haiku.text.startswith("Now one about rain.")
    assert (code.shape, haiku.shape) == (prompt_shape("Fix my SQL join"), conversation_shape(TURNS))
    assert haiku.shape is not None and (haiku.shape.user_turns, haiku.shape.assistant_turns) == (2, 1)
    assert (code.group, code.weak, code.strong, haiku.weak, haiku.strong) == ("Code", 0.0, 1.0, 1.0, 0.0)
    named = [(haiku.models[w], haiku.models[lo]) for w, lo in haiku.pairs]
    assert named == [(_MISTRAL, _OPUS), ("Gemini-pro", _OPUS), (_MISTRAL, "Gemini-pro")]
    for name in ("irt-fail", "irt-pairwise"):  # the pairwise fit: the frontier won the first, lost the second
        first, second, *_ = targets([code, haiku, *usual], name)
        assert 0.0 < second < 0.5 < first < 1.0, name
    assert "rmb-helpfulness" in DEFAULT_SOURCES


def test_a_source_is_read_again_when_one_of_its_files_changes(tmp_path: Path) -> None:
    """Read once per process while the files stay as they were (tests and benchmarks read them many times)."""
    root = _mini(tmp_path)
    first = load_outcomes(root, sources=["routellm-gsm8k"])
    assert load_outcomes(root, sources=["routellm-gsm8k"]) == first
    with (root / "routellm-gsm8k" / "gsm8k_responses.csv").open("a", newline="") as fh:
        csv.writer(fh).writerow(["Tom has 2 cats.", "False", "True", "text"])
    again = load_outcomes(root, sources=["routellm-gsm8k"])
    assert [e.text for e in again] == [first[0].text, "Tom has 2 cats."]


def test_every_target_is_finite_and_bounded(tmp_path: Path) -> None:
    ex = load_outcomes(_mini(tmp_path), sources=["routellm-mmlu", "routellm-gsm8k", "zeroeval"])
    for name in TARGETS:
        y = targets(ex, name)
        assert len(y) == len(ex) and all(-1.0 <= v <= 1.0 for v in y), name
    with pytest.raises(ValueError, match="unknown target"):
        targets(ex, "vibes")


def test_missing_folder_and_unknown_source_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="CASCADE_ROUTING_DATA"):
        load_outcomes(tmp_path / "absent")
    with pytest.raises(ValueError, match="unknown sources"):
        load_outcomes(tmp_path, sources=["mmlu"])


@pytest.mark.skipif(not DEFAULT_ROUTING_DIR.is_dir(), reason=f"shared routing data not at {DEFAULT_ROUTING_DIR}")
def test_the_real_sources_load_with_their_model_classes() -> None:
    ex = load_outcomes(max_per_source=300)
    assert sorted({e.source for e in ex}) == sorted(s.name for s in SOURCES)
    for spec in SOURCES:
        rows = [e for e in ex if e.source == spec.name]
        assert len(rows) == 300, spec.name
        assert all(m in rows[0].models for m in spec.weak_models + spec.strong_models), spec.name
        gap = sum(e.strong - e.weak for e in rows) / len(rows)
        assert gap > 0.05, f"{spec.name}: the frontier class should beat the micro class on average ({gap:.3f})"
