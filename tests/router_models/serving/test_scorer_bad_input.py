"""Bad input to the shipped scorer: a 100,000-character prompt, a 500-turn conversation, an empty message, binary
junk. Each is scored on at most what the router was trained on (2,000 characters, 64 word pieces), without failing
or moving the texts batched beside it, and each cut is counted (the gateway's `/metrics`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest

from gateway.api.app import create_app
from gateway.settings import Settings
from router_models.serving.classifier_scorer import BatchingConfig, ClassifierScorer, EmbeddingClassifier, load_model
from router_models.serving.scorer import SCORING_CHARS, ConversationShape, prompt_shape, read_conversation
from tests.servers import serve

LONG = "Explain the following log and find the bug. " + "line of a very long log file " * 3_500  # ~100,000 chars
TURNS = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "some text here " * 40}
         for i in range(500)]
JUNK = ["", "\x00\x01\x02" * 30, "abc\udc80\ud800def", bytes(range(256)).decode("latin-1") * 4, "\ufffd" * 50]


@pytest.fixture(scope="module")
def model() -> EmbeddingClassifier:
    return load_model(None, 1)


@pytest.fixture
async def scorer(model: EmbeddingClassifier) -> AsyncIterator[ClassifierScorer]:
    """The shipped model behind a scorer on this test's event loop (its answers are posted to it)."""
    made = ClassifierScorer(model, BatchingConfig(workers=1, max_batch=16), version=model.version)
    yield made
    await made.aclose()


def _longest_text(scorer: ClassifierScorer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    model = scorer._model
    assert isinstance(model, EmbeddingClassifier)
    original = EmbeddingClassifier.score_and_features.__get__(model)

    def recording(texts: Sequence[str], shapes: Sequence[ConversationShape] | None = None
                  ) -> tuple[list[float], object, object]:
        seen.extend(len(t) for t in texts)
        return original(texts, shapes)  # type: ignore[no-any-return]

    monkeypatch.setattr(model, "score_and_features", recording)
    return seen


async def test_a_long_prompt_is_scored_on_its_first_2000_characters(scorer: ClassifierScorer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _longest_text(scorer, monkeypatch)
    before = dict(scorer.truncated)
    score, model = await scorer.score_one(LONG)
    assert model == "primary" and 0.0 <= score <= 1.0
    assert max(seen) <= SCORING_CHARS  # the model never read the whole prompt
    cut, _ = await scorer.score_one(LONG[:SCORING_CHARS], prompt_shape(LONG))  # as training cut it: same score
    assert cut == score
    assert scorer.truncated["chars"] == before["chars"] + 2 and scorer.truncated["tokens"] == before["tokens"] + 1
    assert scorer.features(LONG[:SCORING_CHARS], prompt_shape(LONG)) is not None  # kept for the label memory


async def test_a_500_turn_conversation_is_scored_on_its_cut_text(scorer: ClassifierScorer) -> None:
    text, shape = read_conversation(TURNS)
    assert len(text) == SCORING_CHARS and shape.user_turns == 250 and shape.assistant_turns == 250
    users = [str(m["content"]).strip() for m in TURNS if m["role"] == "user"]
    assert text == "\n\n".join([users[-1], *reversed(users[:-1])])[:SCORING_CHARS]  # the whole join, cut
    score, model = await scorer.score_one(text, shape)
    assert model == "primary" and 0.0 <= score <= 1.0


async def test_empty_and_junk_are_scored_without_moving_their_neighbours(scorer: ClassifierScorer) -> None:
    normal = "What is the capital of Peru, and why was it founded there?"
    alone = (await scorer.score_one(normal + " (alone)"))[0]
    together = await asyncio.gather(scorer.score_one(normal + " (alone)", prompt_shape(normal + " x")),
                                    *(scorer.score_one(j) for j in JUNK), scorer.score_one(normal + " (alone)"))
    assert together[-1][0] == alone  # the same text beside junk in one batch: the same score (cached or not)
    for score, model in together:
        assert model == "primary" and 0.0 <= score <= 1.0
    fresh = "Name three rivers of Africa, longest first."
    batch = await asyncio.gather(*(scorer.score_one(j + " again") for j in JUNK), scorer.score_one(fresh))
    assert batch[-1][0] == (await scorer.score([fresh]))[0]
    assert scorer.batch_sizes and max(scorer.batch_sizes) > 1  # they did share a model call


def test_the_gateway_counts_cut_prompts_in_metrics(policy_file: Path) -> None:
    settings = Settings(policy_path=policy_file, scorer="classifier", start_engines=False, ledger="memory",
                        policy_watch_interval_s=0)
    with serve(create_app(settings)) as url:
        for content in ("a short question?", LONG, "word " * 300):
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "auto", "messages": [{"role": "user", "content": content}]})
            assert reply.status_code == 200, reply.text
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    counted = {what: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() for what in ("chars", "tokens")
               if line.startswith(f'cascade_router_truncated_total{{what="{what}"}}')}
    assert counted == {"chars": 1.0, "tokens": 2.0}, counted
