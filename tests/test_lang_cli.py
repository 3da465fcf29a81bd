"""`python -m pasta.lang check` and `explain`: what an annotation author sees."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pasta.lang.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_model_and_tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    tiny_model_and_tokenizer[1].save_pretrained(path)
    return str(path)


def test_check_accepts_the_shipped_annotated_examples(tokenizer_dir, capsys):
    assert main(["--tokenizer", tokenizer_dir, "check", str(ROOT / "data" / "annotated_examples.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "12 records, 12 valid, 0 invalid" in out
    assert "theoretical speedup:   mean" in out


def test_check_reports_each_invalid_record_by_line_and_exits_nonzero(tokenizer_dir, tmp_path, capsys):
    records = [
        {"annotated": 'ok <promise topic="a"/><async topic="a">x</async>', "output": "ok x"},
        {"annotated": '<promise topic="a"/>', "output": ""},
        {"annotated": 'A <promise topic="a"/><async topic="a">x</async>', "output": "A y"},
        {"output": "no annotation"},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["--tokenizer", tokenizer_dir, "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert 'line 2: at char 0: promise "a" has no async block before the end of the response' in out
    assert "line 3: plain text differs from `output` at char 2" in out
    assert "line 4: no `annotated` string field" in out
    assert "4 records, 1 valid, 3 invalid" in out


def test_check_of_a_missing_file_is_one_line_error(tokenizer_dir, capsys):
    assert main(["--tokenizer", tokenizer_dir, "check", "missing.jsonl"]) == 2
    assert capsys.readouterr().err.strip() == "error: file not found: missing.jsonl"


def test_a_usage_mistake_is_one_error_line_and_exit_code_2_with_secrets_masked(capsys):
    """An unknown flag or a value of the wrong type, in any subcommand: one `error:` line, not argparse's usage
    block; a key pasted by mistake is not echoed."""
    for argv, says in (
        (["explain", "Tips.", "--bogus", "sk-abcdefghijklmnopqrstuvwx"], "error: unrecognized arguments: --bogus ***"),
        (["explain", "Tips.", "--multiple", "x"], "error: argument --multiple: invalid int value: 'x'"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.startswith(says) and err.count("\n") == 1, err
        assert "python -m pasta.lang" in err and "usage:" not in err


def test_explain_json_shows_threads_positions_and_visibility(tokenizer_dir, capsys):
    text = 'Tips: <promise topic="a"/><async topic="a">Sleep.</async><sync/> Bye.'
    assert main(["--tokenizer", tokenizer_dir, "explain", text, "--json", "--policy", "exact"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["plain_text"] == "Tips: Sleep. Bye."
    assert [t["thread"] for t in info["threads"]] == ["main", "chunk 1"]
    sync = next(t for t in info["tokens"] if t["token"] == "<|sync|>")
    assert "chunk 1" in sync["sees"]
    first_chunk_row = next(t for t in info["tokens"] if t["thread"] == "chunk 1")
    promise_end = next(t for t in info["tokens"] if t["token"] == "<|promise_end|>")
    assert first_chunk_row["position"] == promise_end["position"] + 1
    assert info["theoretical_speedup"] == info["num_tokens"] / info["num_steps"]


def test_explain_of_malformed_text_is_one_line_error(tokenizer_dir, capsys):
    assert main(["--tokenizer", tokenizer_dir, "explain", "a </async>"]) == 2
    assert "</async> without an open async block" in capsys.readouterr().err


def test_module_help_runs_as_a_program():
    out = subprocess.run(
        [sys.executable, "-m", "pasta.lang", "--help"], capture_output=True, text=True, check=True
    )
    assert "check" in out.stdout and "explain" in out.stdout


def test_explain_shows_the_form_training_writes_under_the_policy(tokenizer_dir, capsys):
    """By default, the stages' reservation policy (uncounted): no `<|promise_tokens|>` row the student never trains
    on; a counted policy writes each promise's measured tokens="N"."""
    from pasta.lang import ReservationPolicy

    text = 'Tips: <promise topic="a"/><async topic="a">Sleep well.</async><sync/> Bye.'
    shown = {}
    for flags in ([], ["--policy", "exact"]):
        assert main(["--tokenizer", tokenizer_dir, "explain", text, "--json", *flags]) == 0
        shown[tuple(flags)] = json.loads(capsys.readouterr().out)
    default, exact = shown[()], shown[("--policy", "exact")]
    assert default["reservation"]["policy"] == ReservationPolicy().policy == "uncounted"
    assert default["threads"][1]["tokens_attr"] is None
    assert "<|promise_tokens|>" not in [t["token"] for t in default["tokens"]]
    assert exact["threads"][1]["tokens_attr"] == exact["threads"][1]["num_tokens"] - 1  # the body, not its end tag
    assert "<|promise_tokens|>" in [t["token"] for t in exact["tokens"]]
    assert default["num_steps"] < exact["num_steps"]  # the count's tokens are main-thread steps
