"""The request path reads top to bottom: from `ChatService.handle`, the request is handed on three times (screen, plan,
send) and nothing calls back into the service module. Traced with a profiler over a served gateway and fake engines,
on the deepest path there is: a cascaded request whose unsure micro answer escalates, JSON and stream."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from gateway.api.app import create_app
from gateway.serving.openai.schema import ChatRequest
from gateway.settings import Settings
from tests.conftest import policy_yaml
from tests.servers import serve

SERVICE = "gateway/serving/service.py"
CASCADE = "  cascade: {enabled: true, min_confidence: 0.5, first_tokens: 4}"


class _PathTrace:
    """`handed`: first calls of a gateway or policies function outside the service module, made from it and passed
    the request (a `ChatRequest`, or what holds one as `.request`). `reentered`: first calls of a service function
    but `ChatService.handle` from a gateway module outside it (callbacks)."""

    def __init__(self) -> None:
        self.on = False
        self.handed: Counter[str] = Counter()
        self.reentered: Counter[str] = Counter()
        self._seen: dict[int, FrameType] = {}  # kept alive: a freed frame's id is reused

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.on or id(frame) in self._seen or frame.f_back is None:
            return
        self._seen[id(frame)] = frame
        here, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        entry = frame.f_code.co_qualname == "ChatService.handle"  # the path's start, called by the chat endpoint
        if here.endswith(SERVICE) and not caller.endswith(SERVICE) and "/gateway/" in caller and not entry:
            self.reentered[frame.f_code.co_qualname] += 1
        elif caller.endswith(SERVICE) and not here.endswith(SERVICE) and _ours(here) and _holds_request(frame):
            self.handed[frame.f_code.co_qualname] += 1


def _ours(path: str) -> bool:
    return ("/gateway/" in path or "/policies/" in path) and "/site-packages/" not in path


def _holds_request(frame: FrameType) -> bool:
    return any(isinstance(v, ChatRequest) or isinstance(getattr(v, "request", None), ChatRequest)
               for v in frame.f_locals.values())


@pytest.mark.parametrize("stream", [False, True])
def test_an_escalated_cascade_request_is_handed_on_three_times_and_never_calls_back(
        tmp_path: Path, upstreams: Any, stream: bool) -> None:
    _, micro_url, _, flagship_url = upstreams
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(micro_url, flagship_url, CASCADE))
    app = create_app(Settings(policy_path=policy, scorer="length", start_engines=False, ledger="memory",
                              home=tmp_path, access_log=None))
    trace = _PathTrace()
    threading.setprofile(trace)  # the server's thread, started below, runs the request
    try:
        with serve(app) as url:
            trace.on = True
            body = {"model": "auto", "stream": stream, "messages": [{"role": "user", "content": "hi"}],
                    "metadata": {"fake_logprob": "-3.0", "fake_tokens": "8"}}
            resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
            trace.on = False
    finally:
        threading.setprofile(None)
    assert resp.status_code == 200
    assert resp.headers["x-cascade-route"] == "score:micro, cascade:flagship"  # the deepest path was taken
    assert trace.handed == Counter({"InputGuard.screen": 1, "Planner.plan": 1, "CacheLayer.send": 1}), trace.handed
    assert trace.reentered == Counter(), trace.reentered
