"""The server's answers without a model: AnswerHead's bodies and chunks, and OpenAI's error body for the failures
caught before the engine (the app over a stub engine, its lifespan not run). tests/test_serve.py drives a real
server."""

from __future__ import annotations

import json
import types

from fastapi.testclient import TestClient

from pasta.decoding import DecodeResult
from pasta.decoding.result import DecodeStats
from pasta.serving.answers import AnswerHead, usage
from pasta.serving.app import ServeSettings, create_app
from pasta.serving.metrics import ServingMetrics
from pasta.serving.requests import Finished


def result(text: str, finish_reason: str = "eos", num_tokens: int = 3) -> DecodeResult:
    stats = DecodeStats(num_tokens=num_tokens, num_steps=2, num_threads=1, finish_reason=finish_reason)
    return DecodeResult(text=text, annotated=f"<{text}>", token_doc=None, token_ids=[0] * num_tokens, stats=stats)


def head(chat: bool, annotated: bool = False) -> AnswerHead:
    return AnswerHead(response_id="id-1", created=7, model="tiny", chat=chat, annotated=annotated)


def event_json(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n")
    return json.loads(event[len("data: "):])


def test_a_chat_stream_opens_with_the_role_and_ends_with_the_finish_reason_and_stats():
    opening = event_json(head(chat=True).chunk(0, text="", role=True))
    assert opening == {"id": "id-1", "object": "chat.completion.chunk", "created": 7, "model": "tiny",
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    end = event_json(head(chat=True).chunk(1, text=None, result=result("hi", "max_new_tokens")))
    (choice,) = end["choices"]
    assert choice["index"] == 1 and choice["delta"] == {} and choice["finish_reason"] == "length"
    assert choice["pasta"]["num_tokens"] == 3 and "annotated" not in choice["pasta"]


def test_a_completion_chunk_always_carries_text():
    piece = event_json(head(chat=False).chunk(0, text="abc"))
    assert piece["object"] == "text_completion" and piece["choices"] == [{"index": 0, "text": "abc"}]
    end = event_json(head(chat=False).chunk(0, text="", result=result("abc", "stop_string")))
    assert end["choices"][0]["text"] == "" and end["choices"][0]["finish_reason"] == "stop"


def test_the_body_has_every_choice_and_the_annotated_text_only_when_asked():
    finished = [Finished(result("one")), Finished(result("two", num_tokens=5))]
    total = usage([1, 2, 3, 4], finished)
    assert (total.prompt_tokens, total.completion_tokens, total.total_tokens) == (4, 8, 12)
    chat = head(chat=True, annotated=True).body(finished, total).model_dump(exclude_none=True)
    assert chat["object"] == "chat.completion"
    assert [c["message"]["content"] for c in chat["choices"]] == ["one", "two"]
    assert [c["pasta"]["annotated"] for c in chat["choices"]] == ["<one>", "<two>"]
    plain = head(chat=False).body(finished, total).model_dump(exclude_none=True)
    assert list(plain) == ["id", "object", "created", "model", "choices", "usage"]
    assert [c["text"] for c in plain["choices"]] == ["one", "two"]
    assert all("annotated" not in c["pasta"] for c in plain["choices"])


def stub_app():
    engine = types.SimpleNamespace(metrics=ServingMetrics(), tokenizer=None, mode="async")
    settings = ServeSettings(model_name="tiny", decode=None, max_tokens_limit=8, max_n=2, context_length=64)
    return create_app(engine, settings)


def test_every_failure_before_the_engine_answers_openai_error_body():
    client = TestClient(stub_app(), raise_server_exceptions=False)
    unknown_route = client.get("/v2/nothing")
    assert unknown_route.status_code == 404 and unknown_route.json()["error"]["type"] == "not_found"
    not_json = client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    assert not_json.json()["error"] == {"message": "the request body is not valid JSON",
                                        "type": "invalid_request_error", "param": None, "code": None}
    other_model = client.post("/v1/completions", json={"model": "big", "prompt": "hi"})
    assert other_model.status_code == 404 and other_model.json()["error"]["code"] == "model_not_found"
    too_many = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 3})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [card["id"] for card in listed["data"]] == ["tiny"]
    counted = client.get("/metrics").text  # the OpenAI routes' answers only: /v2/nothing is not one
    for status, count in (("200", 1), ("400", 2), ("404", 1)):
        assert f'pasta_requests_total{{status="{status}"}} {count}.0' in counted
