"""Keys never reach an error line, a log or a file, even from an endpoint that echoes the Authorization header;
and a teacher run where every request failed exits non-zero with the reason."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from helpers import start_chat_server
from pasta.annotate import annotate
from pasta.config import compose
from pasta.errors import MASK, PastaError, RedactingFilter, redact, register_secret

KEY_ENV = "PASTA_TEST_ENDPOINT_KEY"
SECRET = "sk-test-echoed-7d2e5b1c"


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abcdefgh12345678 was rejected", f"Authorization: Bearer {MASK} was rejected"),
        ("invalid key sk-proj-abcdefghijk", f"invalid key {MASK}"),
        ('{"api_key": "zyxwvut987654321"}', f'{{"api_key": "{MASK}"}}'),
        ("x-api-key=zyxwvut987654321", f"x-api-key={MASK}"),
        ("a plain sentence about keys and tokens", "a plain sentence about keys and tokens"),
        # Words after "basic" or "bearer" are not tokens: a reply redacted on its way in keeps them.
        ("a basic overview, Basic Understanding, basic double-pane", "a basic overview, Basic Understanding, "
                                                                     "basic double-pane"),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {MASK}"),
    ],
)
def test_key_shaped_strings_are_masked(text, expected):
    assert redact(text) == expected


def test_a_registered_key_is_masked_wherever_it_appears():
    register_secret("plain-looking-secret-value")
    assert redact("echo: plain-looking-secret-value!") == f"echo: {MASK}!"


def test_a_reply_loses_the_keys_pasta_read_and_keeps_its_key_shaped_words():
    """A teacher's reply is the response it annotates: masking "basic JavaScript" or a code answer's placeholder
    key would change its words, and the record would be rejected as text_changed."""
    from types import SimpleNamespace

    from pasta.endpoints import _redacted

    register_secret(SECRET)
    text = f'Learn basic JavaScript, then set api_key = "YOUR_API_KEY_HERE". Your key: {SECRET}'
    completion = SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=text, refusal=None))])
    assert _redacted(completion).choices[0].message.content == (
        f'Learn basic JavaScript, then set api_key = "YOUR_API_KEY_HERE". Your key: {MASK}')


def test_log_records_and_their_tracebacks_are_redacted_by_the_filter(caplog):
    register_secret("another-secret-value-42")
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "server said %s", ("another-secret-value-42",), None)
    try:
        raise ValueError("boom another-secret-value-42")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert handler.filter(record)
    assert record.getMessage() == f"server said {MASK}"
    assert "another-secret-value-42" not in record.exc_text and MASK in record.exc_text


def overrides(base_url: str, tmp_path: Path, limit: int) -> list[str]:
    return ["teacher=openai", f"teacher.base_url={base_url}", "teacher.model=t", f"teacher.api_key_env={KEY_ENV}",
            "teacher.max_retries=0", f"data.limit={limit}", f"output={tmp_path / 'ann.jsonl'}", "progress=false"]


def assert_no_key_anywhere(tmp_path: Path, *texts: str) -> None:
    for text in texts:
        assert SECRET not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("status", [401, 400])
def test_a_teacher_endpoint_that_echoes_the_key_gets_it_into_no_error_log_or_file(tmp_path, caplog, status):
    server = start_chat_server(tmp_path, rules={}, fail_first=1000, fail_status=status, echo_auth=True)
    with server as (base_url, _), pytest.raises(PastaError) as error:
        annotate(compose("annotate", overrides(base_url, tmp_path, limit=2)))
    assert "Authorization: Bearer ***" in str(error.value)
    assert_no_key_anywhere(tmp_path, str(error.value), caplog.text)


def test_a_teacher_run_where_every_request_failed_stops_with_the_reason(tmp_path):
    # Two requests rejected (400) stay under max_consecutive_errors=3, so only the all-failed check can stop it.
    with start_chat_server(tmp_path, rules={}) as (base_url, _), pytest.raises(PastaError) as error:
        annotate(compose("annotate", overrides(base_url, tmp_path, limit=2)))
    assert "the teacher failed all 2 requests of this run (last: HTTP 400: no scripted rule matched" in str(error.value)
    assert (tmp_path / "ann.jsonl").read_text() == ""


def test_an_alpaca_eval_annotator_whose_endpoint_echoes_the_key_is_one_line_without_it(tmp_path, monkeypatch, caplog):
    from pasta.evaluation.quality import evaluate_outputs, make_metric_fn

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    outputs = [{"instruction": "Name a fruit.", "output": "An apple.", "generator": "m", "dataset": "d"}]
    reference = [{**outputs[0], "output": "A pear.", "generator": "ref"}]
    server = start_chat_server(tmp_path, rules={}, fail_first=1000, fail_status=401, echo_auth=True)
    with server as (base_url, _), pytest.raises(PastaError) as error:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        evaluate_outputs(outputs, reference, results_dir=tmp_path / "run", metric_fn=make_metric_fn(None, "off"),
                         annotators_config="alpaca_eval_gpt4_turbo_fn")
    assert str(error.value).startswith("annotator alpaca_eval_gpt4_turbo_fn: AuthenticationError: ")
    assert_no_key_anywhere(tmp_path, str(error.value))


def test_environment_variables_named_like_keys_are_masked(monkeypatch):
    from pasta.errors import register_env_secrets

    monkeypatch.setenv("SOME_SERVICE_API_KEY", "value-of-a-service-key")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM_HINT", "a-long-ordinary-value")
    register_env_secrets()
    assert redact("got value-of-a-service-key and a-long-ordinary-value") == f"got {MASK} and a-long-ordinary-value"


ECHOED = f"Here it is. Authorization: Bearer {SECRET} (your key: {SECRET})"


def test_a_teacher_endpoint_that_answers_200_with_the_key_writes_it_into_no_file(tmp_path, caplog):
    """The rejected answer is kept in the rejects file (teacher_output, and the reason quotes it): redacted."""
    out = tmp_path / "out"
    with start_chat_server(tmp_path, rules={"default": ECHOED}) as (base_url, _):
        summary = annotate(compose("annotate", overrides(base_url, out, limit=2)))
    assert summary["this_run"]["num_written"] == 2
    rejected = (out / "ann.rejects.jsonl").read_text()
    assert f"Authorization: Bearer {MASK} (your key: {MASK})" in rejected
    assert_no_key_anywhere(out, caplog.text)


def test_an_alpaca_eval_annotator_that_answers_200_with_the_key_writes_it_into_no_file(tmp_path, monkeypatch):
    """alpaca_eval keeps each raw completion in its cache and in the annotations pasta writes: redacted."""
    from pasta.evaluation.quality import evaluate_outputs, make_metric_fn

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    outputs = [{"instruction": "Name a fruit.", "output": "An apple.", "generator": "m", "dataset": "d"}]
    reference = [{**outputs[0], "output": "A pear.", "generator": "ref"}]
    with start_chat_server(tmp_path, rules={"default": f"Output (a)\n{ECHOED}"}) as (base_url, _):
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        metrics, annotations = evaluate_outputs(outputs, reference, results_dir=tmp_path / "run",
                                                metric_fn=make_metric_fn(None, "off"), annotators_config="chatgpt")
    assert metrics["n_total"] == 1 and MASK in json.dumps(annotations)
    assert_no_key_anywhere(tmp_path / "run", json.dumps(annotations))
