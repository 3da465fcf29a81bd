"""The OpenAI-compatible test server (tests/helpers/chat_server.py) answers the real openai client over HTTP."""

from __future__ import annotations

import math

import openai
import pytest

from helpers import server_stats, start_chat_server

USER_HELLO = [{"role": "user", "content": "hello there"}]


def client(base_url: str, max_retries: int = 0, timeout: float = 10.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=max_retries, timeout=timeout)


def test_scripted_server_answers_the_openai_client_with_content_usage_and_models(tmp_path):
    rules = {"rules": [{"contains": "hello", "reply": "Hi, how can I help?"}]}
    with start_chat_server(tmp_path, rules=rules, model="judge-x") as (base_url, _):
        c = client(base_url)
        reply = c.chat.completions.create(model="judge-x", messages=USER_HELLO)
        assert reply.choices[0].message.content == "Hi, how can I help?"
        assert reply.usage.completion_tokens > 0
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        assert [m.id for m in c.models.list()] == ["judge-x"]


def test_top_logprobs_are_returned_only_when_asked(tmp_path):
    rules = {
        "rules": [
            {"contains": "hello", "reply": "1", "top_logprobs": {"1": math.log(0.7), "2": math.log(0.3)}}
        ]
    }
    with start_chat_server(tmp_path, rules=rules) as (base_url, _):
        c = client(base_url)
        plain = c.chat.completions.create(model="m", messages=USER_HELLO)
        assert plain.choices[0].logprobs is None
        asked = c.chat.completions.create(model="m", messages=USER_HELLO, logprobs=True, top_logprobs=2)
        first = asked.choices[0].logprobs.content[0]
        assert first.token == "1"
        assert [(t.token, round(math.exp(t.logprob), 6)) for t in first.top_logprobs] == [
            ("1", 0.7),
            ("2", 0.3),
        ]


def test_queue_replies_come_first_in_order_then_rules_then_default(tmp_path):
    rules = {
        "queue": ["first", "second"],
        "rules": [{"regex": "hel+o", "reply": "by rule"}],
        "default": "fallback",
    }
    with start_chat_server(tmp_path, rules=rules) as (base_url, _):
        c = client(base_url)
        asked = [USER_HELLO, USER_HELLO, USER_HELLO, [{"role": "user", "content": "other"}]]
        replies = [c.chat.completions.create(model="m", messages=m).choices[0].message.content for m in asked]
        assert replies == ["first", "second", "by rule", "fallback"]


def test_request_matching_no_rule_is_answered_400(tmp_path):
    rules = {"rules": [{"contains": "never", "reply": "x"}]}
    with (
        start_chat_server(tmp_path, rules=rules) as (base_url, _),
        pytest.raises(openai.BadRequestError, match="no scripted rule matched"),
    ):
        client(base_url).chat.completions.create(model="m", messages=USER_HELLO)


@pytest.mark.parametrize("status", [429, 500])
def test_injected_failures_then_success_through_the_clients_retries(tmp_path, status):
    rules = {"default": "finally"}
    with start_chat_server(tmp_path, rules=rules, fail_first=2, fail_status=status) as (base_url, _):
        reply = client(base_url, max_retries=3).chat.completions.create(model="m", messages=USER_HELLO)
        assert reply.choices[0].message.content == "finally"
        stats = server_stats(base_url)
        assert (stats["chat_requests"], stats["failed"]) == (3, 2)


def test_failures_outlasting_the_retries_reach_the_caller(tmp_path):
    with start_chat_server(tmp_path, rules={"default": "never seen"}, fail_first=5, fail_status=429) as (
        base_url,
        _,
    ):
        with pytest.raises(openai.RateLimitError):
            client(base_url, max_retries=1).chat.completions.create(model="m", messages=USER_HELLO)
        assert server_stats(base_url)["chat_requests"] == 2


def test_delay_makes_a_short_client_timeout_expire(tmp_path):
    with (
        start_chat_server(tmp_path, rules={"default": "late"}, delay=2.0) as (base_url, _),
        pytest.raises(openai.APITimeoutError),
    ):
        client(base_url, timeout=0.3).chat.completions.create(model="m", messages=USER_HELLO)


def test_server_process_is_stopped_when_the_context_exits(tmp_path):
    with start_chat_server(tmp_path, rules={"default": "x"}) as (_, process):
        assert process.poll() is None
    assert process.poll() is not None


@pytest.mark.slow
def test_tiny_mode_serves_a_real_model_greedily_with_logprobs(tmp_path):
    with start_chat_server(tmp_path, mode="tiny") as (base_url, _):
        c = client(base_url, timeout=120)
        replies = [
            c.chat.completions.create(
                model="tiny", messages=USER_HELLO, max_tokens=6, logprobs=True, top_logprobs=3
            ).choices[0]
            for _ in range(2)
        ]
    assert replies[0].message.content == replies[1].message.content  # greedy: deterministic
    content = replies[0].logprobs.content
    assert 1 <= len(content) <= 6
    for position in content:
        assert len(position.top_logprobs) == 3
        assert position.logprob <= 0.0
        # greedy picks the most likely token
        assert math.isclose(position.logprob, position.top_logprobs[0].logprob, abs_tol=1e-5)
