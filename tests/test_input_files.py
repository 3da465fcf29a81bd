"""Every stage's input files are read through one path: bytes that are not UTF-8, invalid JSON and invalid Unicode
give one `<file>:<line>: <why>` PastaError (or a logged skip with on_error=skip), never another exception; a fuzz
test feeds random bytes and random JSON to each entry point's reader."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pasta.data import iter_numbered_jsonl, load_alpaca_eval, load_instructions, read_json_file
from pasta.errors import PastaError
from pasta.evaluation.quality import JudgeAnnotator, load_annotations
from pasta.evaluation.run_files import load_model_outputs, read_stats

GOOD = json.dumps({"instruction": "Name a fruit.", "output": "An apple."})


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"instruction": "a", "output": "b\xff"}', r"x\.jsonl:2: not valid UTF-8 \(byte 33: invalid start byte\)"),
        (b'{"instruction": "a", "output": "b\\ud800"}', r"x\.jsonl:2: invalid Unicode in output \(lone surrogate"),
        (b'{"instruction": "a", "output": {"k\\udfff": 1}}', r"x\.jsonl:2: invalid Unicode in output"),
        # A key holding a newline is shown escaped: the message stays on one line.
        (b'{"instruction": "a", "k\\n": "\\ud800"}', r"x\.jsonl:2: invalid Unicode in k\\n \(lone surrogate"),
        (b'{"instruction": "a"', r"x\.jsonl:2: invalid JSON \(Expecting"),
        (b'[1, 2]', r"x\.jsonl:2: invalid JSON \(expected a JSON object, got list\)"),
        (b"[" * 100_000, r"x\.jsonl:2: invalid JSON"),
    ],
)
def test_a_bad_line_names_the_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "x.jsonl", GOOD.encode() + b"\n" + line + b"\n" + GOOD.encode() + b"\n")
    with pytest.raises(PastaError, match=message):
        list(iter_numbered_jsonl(path))
    assert [n for n, _ in iter_numbered_jsonl(path, on_error="skip")] == [1, 3]


def test_a_utf8_byte_order_mark_is_not_an_error(tmp_path):
    path = write(tmp_path / "x.jsonl", b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    assert [r["output"] for _, r in iter_numbered_jsonl(path)] == ["An apple."]


def test_a_json_file_names_the_line_of_a_bad_byte(tmp_path):
    path = write(tmp_path / "x.json", b'[\n{"instruction": "a",\n "output": "\xc3"}]')
    with pytest.raises(PastaError, match=r"x\.json:3: not valid UTF-8"):
        read_json_file(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_instruction_data_with_a_lone_surrogate_is_refused_or_skipped(tmp_path, suffix):
    records = [{"instruction": "a", "output": "b"}, {"instruction": "c\ud800", "output": "d"}]
    text = "\n".join(json.dumps(r) for r in records) if suffix == ".jsonl" else json.dumps(records)
    path = write(tmp_path / f"x{suffix}", text.encode())
    with pytest.raises(PastaError, match="invalid Unicode"):
        load_instructions({"name": "x", "path": str(path)})
    if suffix == ".jsonl":
        kept = load_instructions({"name": "x", "path": str(path), "on_error": "skip"})
        assert [r.instruction for r in kept] == ["a"]


def test_the_lang_check_command_reports_a_bad_file_in_one_line(tmp_path, capsys):
    from pasta.lang.__main__ import main

    path = write(tmp_path / "x.jsonl", b'{"annotated": "\xff"}\n')
    assert main(["check", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:1: not valid UTF-8 (byte 15: invalid start byte); re-encode the file as UTF-8\n"


# ----------------------------------------------------------------------------------------------------- fuzzing

# Text that includes what a tokenizer or a file cannot take: lone surrogates, NUL, and non-BMP characters.
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x00", "🍝", "instruction"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
# Objects shaped like the records the readers expect, so the fuzz also reaches the field checks.
FIELDS = ("instruction", "input", "output", "generator", "dataset", "output_1", "output_2", "generator_1",
          "generator_2", "preference", "annotated", "key", "annotator", "num_tokens", "num_steps",
          "theoretical_speedup", "wall_s")
RECORD = st.dictionaries(st.sampled_from(FIELDS) | TEXT, JSON | TEXT | st.floats(0, 3), max_size=8)
LINE = st.binary(max_size=40) | JSON.map(json.dumps).map(str.encode) | RECORD.map(json.dumps).map(str.encode)
FILE = st.lists(LINE, max_size=5).map(b"\n".join) | RECORD.map(lambda r: json.dumps([r]).encode()) | st.lists(
    RECORD, max_size=3).map(lambda rs: json.dumps(rs).encode())


def _judge_pairs(path: Path) -> None:
    JudgeAnnotator("judge", judge=None, pairs_path=path)._judged()


def _stats(path: Path) -> None:
    path.rename(path.with_name("stats.jsonl"))
    read_stats(path.parent)


READERS = {
    "train/annotate data (jsonl)": ("data.jsonl", lambda p: load_instructions({"name": "x", "path": str(p)})),
    "train/annotate data (json)": ("data.json", lambda p: load_instructions({"name": "x", "path": str(p)})),
    "train/annotate data, skipping": (
        "data.jsonl", lambda p: load_instructions({"name": "x", "path": str(p), "on_error": "skip"})),
    "annotate data (rejects invalid Unicode itself)": (
        "data.jsonl", lambda p: load_instructions({"name": "x", "path": str(p)}, check_unicode=False)),
    "eval data": ("eval.jsonl", lambda p: load_alpaca_eval({"name": "x", "path": str(p)})),
    "eval outputs / reference": ("model_outputs.json", lambda p: load_model_outputs(p)),
    "eval annotations": ("annotations.json", load_annotations),
    "eval stats (resume)": ("stats.tmp", _stats),
    "eval judge verdicts (resume)": ("judge_pairs.jsonl", _judge_pairs),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=FILE)
def test_random_bytes_or_json_are_read_or_refused_with_a_pasta_error(tmp_path_factory, reader, data):
    name, read = READERS[reader]
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(data)
    try:
        read(path)
    except PastaError as exc:
        assert "\n" not in str(exc).strip()


@pytest.fixture(scope="module")
def tag_tokenizer():
    from pasta.lang.__main__ import load_tokenizer

    return load_tokenizer("tiny")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=FILE)
def test_lang_check_reads_random_files_or_exits_2(tmp_path_factory, tag_tokenizer, data):
    from pasta.lang.__main__ import run_check

    tokenizer = tag_tokenizer
    path = tmp_path_factory.mktemp("fuzz") / "x.jsonl"
    path.write_bytes(data)
    with contextlib.suppress(PastaError):  # a bad file is refused in one line; anything else fails the test
        assert run_check(path, tokenizer) in (0, 1)
