"""The annotation stage end to end with the structural teacher: records, rejects, resume, bad input, summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pasta.annotate import annotate, companion_paths
from pasta.config import compose
from pasta.data import Record, read_jsonl
from pasta.errors import PastaError
from pasta.lang import parse, plain_text

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "alpaca_sample.jsonl"
LIST_ANSWER = (
    "Here are some simple habits that help you stay hydrated on a hot summer day:\n\n"
    "1. Carry a refillable water bottle so you can sip throughout the day.\n"
    "2. Eat water-rich foods such as watermelon, cucumber and oranges every day.\n"
    "3. Limit alcohol and very sugary drinks, which can leave you more dehydrated.\n\n"
    "Small, regular sips work better than drinking a lot at once."
)


def run_annotate(tmp_path: Path, *overrides: str, name: str = "ann.jsonl") -> dict:
    cfg = compose("annotate", [f"output={tmp_path / name}", "progress=false", *overrides])
    return annotate(cfg)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_sample_run_keeps_every_response_exactly_and_measures_its_structure(tmp_path, capsys):
    summary = run_annotate(tmp_path)
    records = read_jsonl(tmp_path / "ann.jsonl")
    sources = read_jsonl(SAMPLE)
    assert [r["id"] for r in records] == [Record.from_dict(s).id for s in sources]  # input order, every record once
    for record, source in zip(records, sources, strict=True):
        assert (record["instruction"], record["input"], record["output"]) == (
            source["instruction"], source["input"], source["output"],
        )  # fmt: skip
        doc = parse(record["annotated"], require_tokens=True)
        assert plain_text(doc) == source["output"]
        assert record["accepted"] and record["reject_reason"] is None
        assert (record["teacher"], record["teacher_model"]) == ("structural", "rules-v4")
        assert record["num_promises"] == len(record["chunk_tokens"]) == len(doc.promises)
        assert record["chunk_tokens"] == [p.num_tokens for p in doc.promises]
        assert record["theoretical_speedup"] == pytest.approx(record["num_tokens"] / record["num_steps"], abs=1e-4)
        assert (record["theoretical_speedup"] > 1) == (record["num_promises"] > 0)
        # Measured as training sees it (the default uncounted policy): a promise costs two tags and its topic.
        num_syncs = record["annotated"].count("<sync/>")
        assert record["num_tag_steps"] >= 3 * record["num_promises"] + num_syncs
        assert (record["num_tag_steps"] == 0) == (record["num_promises"] == 0)
        assert (record["repetition"] is None) == (not doc.promises)
    assert summary["num_records"] == summary["num_accepted"] == 80
    assert summary["tag_steps_per_fork"]["count"] == summary["cross_thread_repetition"]["count"] == (
        summary["num_with_promises"])
    assert summary["num_with_promises"] == sum(1 for r in records if r["num_promises"])
    assert summary["by_teacher"] == {"structural (rules-v4)": {"num_records": 80, "num_accepted": 80, "acceptance_rate": 1.0}}
    assert json.loads((tmp_path / "ann.summary.json").read_text()) == summary
    assert read_jsonl(tmp_path / "ann.rejects.jsonl") == []
    printed = capsys.readouterr().out
    assert "structural (rules-v4)" in printed and "100.0%" in printed and "chunk tokens:" in printed


def bad_records() -> list[dict]:
    good = {"instruction": "How can I stay hydrated?", "input": "", "output": LIST_ANSWER}
    return [
        good,
        {"instruction": "Say nothing.", "input": "", "output": ""},
        {"instruction": "Echo.", "input": "", "output": 'Tagged <promise topic="a"/> x<async topic="a">y</async>'},
        {"instruction": "Write a lot.", "input": "", "output": "word " * 200},
        dict(good),  # the same record twice: annotated once
        {"instruction": "Broken text.", "input": "", "output": "bad \udc80 bytes"},
    ]


def test_drop_sends_rejected_records_with_reasons_to_the_rejects_file(tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", bad_records())
    summary = run_annotate(tmp_path, f"data.path={data}", "data.name=bad", "max_response_chars=500")
    kept = read_jsonl(tmp_path / "ann.jsonl")
    rejected = read_jsonl(tmp_path / "ann.rejects.jsonl")
    assert [r["output"] for r in kept] == [LIST_ANSWER]
    assert kept[0]["num_promises"] == 3
    assert [r["reject_reason"].split(":")[0] for r in rejected] == [
        "empty_response", "contains_tags", "too_long", "invalid_unicode",
    ]  # fmt: skip
    assert all(r["annotated"] is None and r["num_promises"] is None and not r["accepted"] for r in rejected)
    assert rejected[-1]["output"] == "bad \\udc80 bytes"  # escaped, so the line is valid UTF-8
    assert summary["reject_reasons"] == {"empty_response": 1, "contains_tags": 1, "too_long": 1, "invalid_unicode": 1}
    assert summary["this_run"]["num_duplicates_in_input"] == 1
    assert summary["acceptance_rate"] == 0.2


def test_keep_unannotated_keeps_teacher_side_rejects_as_plain_responses(tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", bad_records())
    summary = run_annotate(
        tmp_path, f"data.path={data}", "data.name=bad", "max_response_chars=500", "on_reject=keep_unannotated"
    )
    kept = read_jsonl(tmp_path / "ann.jsonl")
    assert [r["output"][:4] for r in kept] == ["Here", "word"]
    too_long = kept[1]
    assert too_long["annotated"] == too_long["output"] and not too_long["accepted"]
    assert too_long["reject_reason"].startswith("too_long: 1000 characters > max_response_chars=500")
    assert (too_long["num_promises"], too_long["theoretical_speedup"]) == (0, 1.0)
    # Records that cannot be training data at all are dropped whatever on_reject says.
    assert [r["reject_reason"].split(":")[0] for r in read_jsonl(tmp_path / "ann.rejects.jsonl")] == [
        "empty_response", "contains_tags", "invalid_unicode",
    ]  # fmt: skip
    assert summary["num_kept_unannotated"] == 1


def test_rerun_resumes_without_repeating_and_matches_an_uninterrupted_run(tmp_path):
    run_annotate(tmp_path, name="full.jsonl")
    first = run_annotate(tmp_path, "data.limit=30", name="resumed.jsonl")
    assert first["this_run"]["num_written"] == 30
    second = run_annotate(tmp_path, name="resumed.jsonl")
    assert (second["this_run"]["num_already_done"], second["this_run"]["num_written"]) == (30, 50)
    third = run_annotate(tmp_path, name="resumed.jsonl")
    assert third["this_run"]["num_written"] == 0
    assert (tmp_path / "resumed.jsonl").read_bytes() == (tmp_path / "full.jsonl").read_bytes()


def test_a_half_written_last_line_is_cut_and_its_record_done_again(tmp_path):
    run_annotate(tmp_path, name="full.jsonl")
    full = (tmp_path / "full.jsonl").read_bytes()
    lines = full.splitlines(keepends=True)
    (tmp_path / "crashed.jsonl").write_bytes(b"".join(lines[:40]) + lines[40][: len(lines[40]) // 2])
    summary = run_annotate(tmp_path, name="crashed.jsonl")
    assert summary["this_run"]["num_written"] == 40
    assert (tmp_path / "crashed.jsonl").read_bytes() == full


def test_an_output_made_by_another_teacher_is_not_extended(tmp_path):
    output = tmp_path / "ann.jsonl"
    record = {"id": "x", "teacher": "openai", "teacher_model": "gpt-4o-mini", "accepted": True}
    output.write_text(json.dumps(record) + "\n")
    with pytest.raises(PastaError, match=r"ann.jsonl:1 was written by teacher openai \(gpt-4o-mini\)"):
        run_annotate(tmp_path)


def test_an_output_of_the_structural_teacher_is_not_extended_under_other_settings(tmp_path):
    run_annotate(tmp_path, "data.limit=5")
    with pytest.raises(PastaError, match=r"written by teacher structural \(rules-v4\), not structural \(rules-v4 "
                                         r"topic_words=1\)"):
        run_annotate(tmp_path, "teacher.topic_words=1")
    summary = run_annotate(tmp_path, "teacher.topic_words=1", name="short.jsonl")
    assert list(summary["by_teacher"]) == ["structural (rules-v4 topic_words=1)"]


def test_non_utf8_input_is_a_one_line_error(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(json.dumps({"instruction": "x", "output": "caf"}).encode()[:-2] + b"\xe9\"}\n")
    with pytest.raises(PastaError, match="not valid UTF-8"):
        run_annotate(tmp_path, f"data.path={data}")
    assert not (tmp_path / "ann.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("on_reject=ignore", "on_reject: 'ignore' is not one of drop, keep_unannotated"),
        ("max_response_chars=0", "max_response_chars: must be >= 1 or null, got 0"),
        ("+teacher.min_wrds=3", "unknown key.*min_wrds"),
        ("teacher.topic_words=0", "teacher.topic_words: must be >= 1"),
    ],
)
def test_bad_stage_settings_are_user_errors(tmp_path, override, message):
    with pytest.raises(PastaError, match=message):
        run_annotate(tmp_path, override)


def test_companion_files_sit_beside_the_output():
    assert companion_paths(Path("out/a5k.jsonl")) == (Path("out/a5k.rejects.jsonl"), Path("out/a5k.summary.json"))


def test_a_100kb_response_is_not_sent_by_default_and_annotated_when_allowed(tmp_path):
    item = "- Keep a notebook by the bed and write down every idea that comes to you at night.\n"
    big = {"instruction": "Give me ideas.", "input": "", "output": "Ideas:\n" + item * (100_000 // len(item))}
    data = write_jsonl(tmp_path / "big.jsonl", [big])
    refused = run_annotate(tmp_path, f"data.path={data}", name="default.jsonl")
    assert refused["reject_reasons"] == {"too_long": 1}
    allowed = run_annotate(tmp_path, f"data.path={data}", "max_response_chars=null", name="allowed.jsonl")
    [record] = read_jsonl(tmp_path / "allowed.jsonl")
    assert allowed["num_accepted"] == 1 and record["num_promises"] == big["output"].count("- Keep")
    assert plain_text(parse(record["annotated"])) == big["output"]
