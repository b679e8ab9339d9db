"""Counting the tokens of an answer the engine did not count: a local pool's engine counts them (`/tokenize`);
a remote pool's prompt never leaves the gateway again (its own tokenizer here, else an estimate)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from backends.clients.shared import EngineUnavailable, Headers
from gateway.serving.openai.prompt_count import count_request_usage
from gateway.serving.openai.usage import Usage, count_usage
from policies.money import Price
from policies.pools import EngineSpec, LocalPool, RemotePool

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}]
_PRICE = Price.model_validate({"input_per_mtok": "1", "output_per_mtok": "1"})


class RecordingEngines:
    """A fake engine client: answers `/tokenize` with 7 tokens and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []

    async def post_json(self, base_url: str, path: str, body: bytes, headers: Headers | None = None) -> bytes:
        self.calls.append((base_url, path, body))
        return orjson.dumps({"count": 7})

    @asynccontextmanager
    async def stream(self, base_url: str, path: str, body: bytes,
                     headers: Headers | None = None) -> AsyncIterator[AsyncIterator[bytes]]:
        raise EngineUnavailable("not used")
        yield  # pragma: no cover

    async def get_text(self, url: str, timeout_s: float = 2.0, headers: Headers | None = None) -> str:
        raise EngineUnavailable("not used")

    async def aclose(self) -> None:
        return None


def _remote(tokenizer: str | None = None) -> RemotePool:
    return RemotePool(type="remote", price=_PRICE, urls=("https://api.example.com",), model="m",
                      api_key_env="KEY", tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A word-level tokenizer (one token a word) with a chat template of 2 tokens a message + 1 to prompt."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "[role]", "system", "user", "assistant", "be", "brief",
             "one", "two", "three", "four"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast_class: Any = PreTrainedTokenizerFast  # untyped constructor
    fast = fast_class(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}[role] {{ m['role'] }} {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}assistant{% endif %}")
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(str(path))
    yield path


async def test_a_remote_pool_without_a_tokenizer_is_estimated_and_nothing_is_sent() -> None:
    engines = RecordingEngines()
    usage = await count_usage(_remote(), engines, "https://api.example.com", "m", MESSAGES, "four four four four")
    assert engines.calls == []  # no /tokenize at the third party, with or without its key
    assert usage == Usage(len("be brief" + "one two three") // 4, len("four four four four") // 4, "estimate")


async def test_a_remote_pool_with_a_tokenizer_counts_on_the_gateway(tokenizer_dir: Path) -> None:
    engines = RecordingEngines()
    usage = await count_usage(_remote(str(tokenizer_dir)), engines, "https://api.example.com", "m", MESSAGES,
                              "four four four")
    assert engines.calls == []
    # [role] system be brief / [role] user one two three / assistant
    assert usage == Usage(4 + 5 + 1, 3, "tokenizer")


async def test_a_broken_tokenizer_directory_falls_back_to_an_estimate(tmp_path: Path) -> None:
    engines = RecordingEngines()
    usage = await count_usage(_remote(str(tmp_path / "missing")), engines, "https://x", "m", MESSAGES, "")
    assert usage.source == "estimate" and engines.calls == []


async def test_a_local_pool_is_counted_by_its_own_engine() -> None:
    engines = RecordingEngines()
    local = LocalPool(type="local", price=_PRICE, engine=EngineSpec(model="demo:micro", served_name="micro"))
    usage = await count_usage(local, engines, "http://127.0.0.1:8100", "micro", MESSAGES, "four")
    assert usage == Usage(7, 7, "tokenizer")
    assert [(url, path) for url, path, _ in engines.calls] == [("http://127.0.0.1:8100", "/tokenize")] * 2


async def test_a_pool_the_policy_no_longer_names_is_estimated_and_nothing_is_sent() -> None:
    engines = RecordingEngines()
    usage = await count_usage(None, engines, "http://127.0.0.1:8100", "m", MESSAGES, "four")
    assert usage.source == "estimate" and engines.calls == []


@pytest.mark.parametrize(("limits", "billed"), [
    ({}, 1000),  # no limit in the request: the count stands
    ({"max_tokens": 900}, 900),
    ({"max_completion_tokens": 800, "max_tokens": 900}, 800),  # the chat API's newer name wins, as the engine reads it
    ({"max_tokens": 900, "n": 2}, 1000),  # two choices may make twice the limit
    ({"max_tokens": 2000}, 1000),
])
async def test_a_counted_completion_is_capped_by_the_requests_own_limit(limits: dict[str, int], billed: int) -> None:
    """A stream cut short by its client is billed on its relayed text re-tokenized, which for broken UTF-8 can
    count more tokens than the engine made (a fresh clone: 970 for a request of at most 900); never more than the
    request allowed."""
    upstream = {"model": "m", "messages": MESSAGES, **limits}
    usage = await count_request_usage("chat", _remote(), RecordingEngines(), "https://api.example.com", "m",
                                      upstream, "abcd" * 1000)  # estimated: 1,000 tokens
    assert usage.completion_tokens == billed and usage.source == "estimate"


@pytest.mark.parametrize(("prompt", "prompt_tokens"), [
    ([[5, 6, 7], [8]], 4),  # token ids only: their count, no text to count
    ([5, 6, 7], 3),
    ("one two three four", 4),  # a text: counted as it is (here estimated, 18 characters)
    (["one two", "three four five six"], 6),  # texts: one prompt, joined by a newline (27 characters)
])
async def test_a_completions_prompt_is_counted_from_its_texts_and_its_token_ids(prompt: Any,
                                                                                 prompt_tokens: int) -> None:
    engines = RecordingEngines()
    usage = await count_request_usage("completions", _remote(), engines, "https://api.example.com", "m",
                                      {"model": "m", "prompt": prompt}, "four four")
    assert usage == Usage(prompt_tokens, 2, "estimate") and engines.calls == []


async def test_a_responses_body_that_no_longer_parses_is_counted_from_its_completion_alone() -> None:
    """The body was validated when parsed; one changed since (an input item that is not an object) counts no
    prompt messages instead of failing the record."""
    usage = await count_request_usage("responses", _remote(), RecordingEngines(), "https://api.example.com", "m",
                                      {"model": "m", "input": [5]}, "four four four four")
    assert usage == Usage(1, 4, "estimate")
