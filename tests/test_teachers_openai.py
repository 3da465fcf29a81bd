"""The `openai` teacher against a real HTTP server process (tests/helpers/chat_server.py) on 127.0.0.1.

Covers good answers, garbage/refusal/extra text/truncation from the teacher, 429 and 500 answers (retried by the
client), an endpoint that is down or keeps failing (a clear stop, nothing corrupted, a rerun resumes), the API key
that must never reach a file or a log, and a run killed with SIGKILL halfway that resumes to the same file.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import server_stats, start_chat_server
from pasta.annotate import annotate
from pasta.config import compose
from pasta.data import read_jsonl
from pasta.errors import PastaError
from pasta.lang import parse, plain_text
from pasta.teachers import StructuralAnnotator, StructuralConfig

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "alpaca_sample.jsonl"
KEY_ENV = "PASTA_TEST_TEACHER_KEY"
SECRET = "sk-test-do-not-leak-4f1c9a"


def sample(limit: int) -> list[dict]:
    return read_jsonl(SAMPLE)[:limit]


def good_rules(records: list[dict]) -> dict:
    """Scripted replies: each response's structural annotation, matched by the response text in the prompt."""
    rules = StructuralAnnotator(StructuralConfig())
    return {
        "rules": [
            {"contains": r["output"], "reply": rules.annotate(r["instruction"], r["output"])} for r in records
        ]
    }


def openai_overrides(base_url: str, tmp_path: Path, *extra: str, limit: int = 6) -> list[str]:
    return [
        "teacher=openai",
        f"teacher.base_url={base_url}",
        "teacher.model=test-teacher",
        f"teacher.api_key_env={KEY_ENV}",
        "teacher.concurrency=3",
        "teacher.max_retries=3",
        "teacher.timeout_s=20",
        f"data.limit={limit}",
        f"output={tmp_path / 'ann.jsonl'}",
        "progress=false",
        *extra,
    ]


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_good_and_bad_answers_are_accepted_or_rejected_with_reasons(tmp_path, caplog):
    records = sample(8)
    rules = good_rules(records[:4])
    # The other four: garbage, a refusal, a preamble, and an answer that stops halfway.
    for record, reply in zip(
        records[4:],
        [
            "asdf qwer <promise zxcv",
            "I'm sorry, but I can't help with annotating this response.",
            "Here is the annotated response:\n" + records[6]["output"],
            records[7]["output"][: len(records[7]["output"]) // 2],
        ],
        strict=True,
    ):
        rules["rules"].append({"contains": record["output"], "reply": reply})
    with caplog.at_level(logging.DEBUG), start_chat_server(tmp_path, rules=rules) as (base_url, _):
        summary = annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=8)))
    accepted = read_jsonl(tmp_path / "ann.jsonl")
    rejected = read_jsonl(tmp_path / "ann.rejects.jsonl")
    assert [r["output"] for r in accepted] == [r["output"] for r in records[:4]]
    for record in accepted:
        assert plain_text(parse(record["annotated"], require_tokens=True)) == record["output"]
        assert (record["teacher"], record["teacher_model"]) == ("openai", "test-teacher")
    assert [r["reject_reason"].split(":")[0] for r in rejected] == ["parse_error", "refused", "extra_text", "truncated"]
    assert rejected[0]["teacher_output"] == "asdf qwer <promise zxcv"
    assert summary["prompt"]["name"] == "teacher_v2"
    # The key reaches neither a file nor a log line.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace")
    assert SECRET not in caplog.text


@pytest.mark.parametrize("status", [429, 500])
def test_rate_limits_and_server_errors_are_retried(tmp_path, status):
    records = sample(4)
    with start_chat_server(tmp_path, rules=good_rules(records), fail_first=2, fail_status=status) as (base_url, _):
        summary = annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=4)))
        stats = server_stats(base_url)
    assert summary["num_accepted"] == 4 and summary["this_run"]["num_written"] == 4
    assert (stats["chat_requests"], stats["failed"]) == (6, 2)


def test_an_endpoint_that_keeps_failing_stops_the_run_with_the_reason_and_a_rerun_resumes(tmp_path):
    records = sample(5)
    failing = start_chat_server(tmp_path, rules=good_rules(records), fail_first=1000, fail_status=429)
    stops = pytest.raises(PastaError, match=r"429 injected failure \(429\) after 1 retries.*rerun the same command")
    with failing as (base_url, _), stops:
        annotate(compose("annotate", openai_overrides(base_url, tmp_path, "teacher.max_retries=1", limit=5)))
    assert read_jsonl(tmp_path / "ann.jsonl") == []
    with start_chat_server(tmp_path, rules=good_rules(records)) as (base_url, _):
        summary = annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=5)))
    assert summary["num_records"] == summary["num_accepted"] == 5


def test_an_endpoint_that_is_down_is_a_clear_stop(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(PastaError, match=r"test-teacher at http://127.0.0.1:\d+/v1 is unreachable after 1 retries"):
        annotate(compose("annotate", openai_overrides(url, tmp_path, "teacher.max_retries=1", limit=3)))
    assert (tmp_path / "ann.jsonl").read_text() == ""


def test_a_bad_key_stops_at_once(tmp_path):
    with start_chat_server(tmp_path, rules={"default": "x"}, fail_first=1000, fail_status=401) as (base_url, _):
        with pytest.raises(PastaError, match="401 injected failure.*check the key, model and base_url"):
            annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=3)))
        assert server_stats(base_url)["chat_requests"] <= 3  # no retries on 401


def test_requests_the_server_rejects_are_left_for_a_rerun_until_too_many_in_a_row(tmp_path):
    records = sample(6)
    rules = good_rules(records[:1] + records[2:])  # record 1 matches no rule: the server answers 400
    with start_chat_server(tmp_path, rules=rules) as (base_url, _):
        summary = annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=6)))
    assert summary["this_run"]["num_failed_requests"] == 1
    written = {r["output"] for r in read_jsonl(tmp_path / "ann.jsonl")}
    assert written == {r["output"] for r in records} - {records[1]["output"]}
    # The third rejection in a row stops the run, whichever request it was: the endpoint sends nothing after it, and
    # the requests already in flight report the same stop. Sent at most: the six taken ahead (2 x concurrency 3) and
    # one more for each of the two rejections read before the stop.
    with start_chat_server(tmp_path, rules={"rules": []}) as (base_url, _):
        with pytest.raises(PastaError, match="rejected 3 requests in a row.*HTTP 400: no scripted rule matched"):
            annotate(compose("annotate", openai_overrides(base_url, tmp_path, limit=20)))
        assert 3 <= server_stats(base_url)["chat_requests"] <= 8


def test_a_missing_key_variable_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(PastaError, match=f"environment variable {KEY_ENV} is not set"):
        annotate(compose("annotate", openai_overrides("http://127.0.0.1:9/v1", tmp_path)))


def _sigint_as_in_a_terminal() -> None:
    """An ignored or blocked SIGINT stays so across exec, and under the full suite the test worker passed one on
    (the interrupted run finished and exited 0, twice in CI): the child gets Ctrl-C as a terminal delivers it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _run_cli(base_url: str, tmp_path: Path, output: Path, run_dir: str) -> subprocess.Popen:
    overrides = openai_overrides(base_url, tmp_path, "teacher.concurrency=2", limit=40)
    overrides = [o for o in overrides if not o.startswith("output=")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", KEY_ENV: SECRET}
    return subprocess.Popen(
        [sys.executable, "-m", "pasta.annotate", *overrides, f"output={output}", f"hydra.run.dir={tmp_path / run_dir}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        preexec_fn=_sigint_as_in_a_terminal,
    )  # fmt: skip


def _count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _interrupt_after(process: subprocess.Popen, output: Path, num_lines: int, sig: signal.Signals) -> str:
    deadline = time.monotonic() + 240
    while _count_lines(output) < num_lines and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    return stderr


@pytest.mark.slow
def test_runs_interrupted_by_ctrl_c_and_by_a_kill_resume_to_the_same_file_as_an_uninterrupted_run(tmp_path):
    records = sample(40)
    with start_chat_server(tmp_path, rules=good_rules(records), delay=0.1) as (base_url, _):
        annotate(compose("annotate", openai_overrides(base_url, tmp_path, "teacher.concurrency=2", limit=40)))
        expected = (tmp_path / "ann.jsonl").read_bytes()
        output = tmp_path / "interrupted.jsonl"

        first = _run_cli(base_url, tmp_path, output, "run1")
        stderr = _interrupt_after(first, output, 8, signal.SIGINT)
        assert first.returncode == 2, stderr
        assert stderr.strip().splitlines()[-1].startswith("error: interrupted (")
        assert "rerun the same command to resume" in stderr and "Traceback" not in stderr
        after_ctrl_c = _count_lines(output)

        second = _run_cli(base_url, tmp_path, output, "run2")
        _interrupt_after(second, output, after_ctrl_c + 8, signal.SIGKILL)
        after_kill = _count_lines(output)
        assert 8 <= after_ctrl_c < after_kill < 40
        complete_lines = output.read_text().split("\n")[:-1]  # a kill may cut the last line; the rerun cuts it
        assert all(json.loads(line)["id"] for line in complete_lines)

        third = _run_cli(base_url, tmp_path, output, "run3")
        _, stderr = third.communicate(timeout=300)
        assert third.returncode == 0, stderr
    assert output.read_bytes() == expected


def test_ctrl_c_does_not_wait_for_the_requests_in_flight(tmp_path):
    """A server that answers in a minute, requests that time out in 20 s and are retried: the interrupted run exits
    at once, with the line that says how to resume, instead of waiting on its requests in flight."""
    with start_chat_server(tmp_path, rules={"default": "x"}, delay=60) as (base_url, _):
        process = _run_cli(base_url, tmp_path, tmp_path / "interrupted.jsonl", "run")
        deadline = time.monotonic() + 120
        while server_stats(base_url)["chat_requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        waited = time.monotonic() - started
    assert process.returncode == 2 and "rerun the same command to resume" in stderr.strip().splitlines()[-1]
    assert waited < 15  # the requests in flight had 20 s to go at least


def test_openai_yaml_matches_the_dataclass_defaults():
    import dataclasses

    from omegaconf import OmegaConf

    from pasta.teachers.openai_teacher import OpenAITeacherConfig

    cfg = OmegaConf.to_container(compose("annotate", ["teacher=openai"]).teacher, resolve=True)
    assert cfg == dataclasses.asdict(OpenAITeacherConfig())
