"""ShareGPT conversations (data=slimorca), one answer per prompt from several files (data=alpaca_eval_gpt4), and
their bad-input lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pasta.config import compose
from pasta.data import load_instructions, load_training_records
from pasta.data.answers import has_list
from pasta.data.sharegpt import SystemPrompt, conversation_record
from pasta.errors import PastaError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "slimorca_sample.jsonl"


def write_records(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def turns(*pairs: tuple[str, object]) -> dict:
    return {"conversations": [{"from": role, "value": value} for role, value in pairs]}


# --- ShareGPT ---------------------------------------------------------------------------------------------------


def test_one_exchange_becomes_an_instruction_record_with_the_system_prompt_in_front_or_dropped():
    record = turns(("system", "Answer like a pirate. "), ("human", "Where is the gold?"), ("gpt", "Arr, buried."))
    assert conversation_record(record) == {"instruction": "Answer like a pirate.\n\nWhere is the gold?", "input": "",
                                           "output": "Arr, buried.", "human": "Where is the gold?",
                                           "system": "Answer like a pirate."}
    assert conversation_record(record, SystemPrompt.drop)["instruction"] == "Where is the gold?"
    no_system = turns(("system", ""), ("user", "Hi?"), ("assistant", "Hello."))
    assert conversation_record(no_system) == {"instruction": "Hi?", "input": "", "output": "Hello.", "human": "Hi?",
                                              "system": ""}


def test_a_held_out_prompt_behind_a_system_prompt_is_left_out_and_counted(tmp_path, monkeypatch):
    from pasta.data import heldout

    monkeypatch.setattr(heldout, "heldout_pool", lambda: frozenset({heldout.prompt_hash("Where is the gold?")}))
    data = write_records(tmp_path / "chats.jsonl", [
        turns(("system", "Answer like a pirate."), ("human", "Where is the gold?"), ("gpt", "Arr, buried.")),
        turns(("human", "Where is the gold?"), ("gpt", "Buried.")),
        turns(("system", "Answer like a pirate."), ("human", "Where is the ship?"), ("gpt", "At sea."))])
    records, report = load_training_records(compose("train", ["data=slimorca", f"data.path={data}"]).data)
    assert [r.instruction for r in records] == ["Answer like a pirate.\n\nWhere is the ship?"]
    assert report.num_heldout_left_out == 2 and "human" not in records[0].extra and "system" not in records[0].extra
    in_system = write_records(tmp_path / "system.jsonl", [
        turns(("system", "Where is the gold?"), ("human", "Answer in one line."), ("gpt", "Buried.")),
        turns(("system", "Answer like a pirate."), ("human", "Where is the ship?"), ("gpt", "At sea."))])
    records, report = load_training_records(compose(
        "train", ["data=slimorca", f"data.path={in_system}", "data.system_prompt=drop"]).data)
    assert [r.instruction for r in records] == ["Where is the ship?"] and report.num_heldout_left_out == 1


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"messages": []}, "no 'conversations' list"),
        (turns(("human", "Q?")), "expected [system,] human, gpt turns, got human"),
        (turns(("human", "Q?"), ("gpt", None)), "turn 2 has no string 'value'"),
        (turns(("narrator", "Once."), ("gpt", "End.")), "turn 1 is from 'narrator'"),
        (turns(("human", "Q?"), ("gpt", "A."), ("human", "Q2?"), ("gpt", "A2.")), "got human, gpt, human, gpt"),
        (turns(("human", "Q?"), ("gpt", "  ")), "empty gpt turn"),
        (["not", "an", "object"], "expected a JSON object, got list"),
    ],
)
def test_a_malformed_conversation_says_why(record, reason):
    assert reason in conversation_record(record)


def test_the_shipped_sample_loads_through_data_slimorca_skipping_and_counting_its_malformed_records():
    cfg = compose("train", ["data=slimorca", f"data.path={SAMPLE}"]).data
    records, report = load_training_records(cfg)
    assert len(records) == 10 and report.num_malformed == 5
    assert all(r.instruction and r.output and r.input == "" for r in records)
    assert records[0].instruction.startswith("You are an AI assistant.") and "\n\nWhy do many cities" in (
        records[0].instruction)
    dropped = load_instructions(compose("train", ["data=slimorca", f"data.path={SAMPLE}",
                                                  "data.system_prompt=drop"]).data)
    assert dropped[0].instruction.startswith("Why do many cities")


@pytest.mark.slow
def test_the_structural_teacher_annotates_the_converted_sample(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pasta.annotate", "data=slimorca", f"data.path={SAMPLE}",
         f"output={tmp_path / 'a.jsonl'}", f"paths.output_root={tmp_path}", "progress=false"],
        capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    # The run folder is named after the entry point, as pasta.train's and pasta.eval's are.
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["annotate"]
    summary = json.loads((tmp_path / "a.summary.json").read_text())
    assert summary["data"]["num_records"] == 10 and summary["data"]["loaded"]["num_malformed"] == 5
    assert summary["num_accepted"] == 10 and summary["num_with_promises"] >= 3


@pytest.mark.skipif(os.environ.get("HF_DATASETS_OFFLINE") != "1", reason="needs HF_DATASETS_OFFLINE=1 (no hub)")
def test_slimorca_offline_without_a_local_copy_is_one_error_naming_data_path():
    with pytest.raises(PastaError, match=r"^data slimorca: data\.path is not set and hub dataset Open-Orca/SlimOrca "
                                         r"could not be loaded \(.*\); set data\.path=") as caught:
        load_instructions(compose("train", ["data=slimorca"]).data)
    assert "\n" not in str(caught.value)


# --- several answers to the same prompts -----------------------------------------------------------------------


def test_pick_keeps_one_answer_per_prompt_by_rule_and_cap(tmp_path):
    listed = "Two things:\n- one thing here\n- another thing"
    first = write_records(tmp_path / "a.jsonl", [{"instruction": "P1", "output": "x" * 30},
                                                 {"instruction": "P2", "output": "short"}])
    second = write_records(tmp_path / "b.jsonl", [{"instruction": " p1 ", "output": listed},
                                                  {"instruction": "P2", "output": "y" * 80},
                                                  {"instruction": "P3", "output": "z" * 200}])

    def outputs(**options):
        cfg = {"name": "t", "path": str(first), "answer_paths": [str(second)], **options}
        records, report = load_training_records(cfg)
        return [r.output for r in records], report

    assert outputs(pick="first")[0] == ["x" * 30, "short", "z" * 200]
    assert outputs(pick="shortest")[0] == ["x" * 30, "short", "z" * 200]
    assert outputs(pick="shortest_with_list")[0] == [listed, "short", "z" * 200]
    capped, report = outputs(pick="shortest_with_list", max_output_chars=40)
    assert capped == ["x" * 30, "short"] and report.num_too_long == 1  # P1's list is over the cap, P3 has none
    assert report.answer_sources == {"a.jsonl": 2, "b.jsonl": 0}


def test_max_output_chars_alone_drops_long_answers_and_counts_them(tmp_path):
    data = write_records(tmp_path / "a.jsonl", [{"instruction": "P1", "output": "x" * 10},
                                                {"instruction": "P2", "output": "x" * 11}])
    records, report = load_training_records({"name": "t", "path": str(data), "max_output_chars": 10})
    assert [r.instruction for r in records] == ["P1"] and report.num_too_long == 1
    with pytest.raises(PastaError, match=r"^data\.max_output_chars: must be >= 1 or null, got "):
        load_instructions({"name": "t", "path": str(data), "max_output_chars": 0})


def test_has_list_sees_list_items_and_sections_not_a_single_dash():
    assert has_list("Intro:\n1. one\n2. two") and has_list("## A\ntext\n## B\ntext")
    assert not has_list("A - B, and\n- only one item")


def test_alpaca_eval_gpt4_without_the_shared_files_is_one_error_naming_the_file_and_its_key(tmp_path):
    cfg = compose("train", ["data=alpaca_eval_gpt4", f"paths.shared_data_dir={tmp_path}"]).data
    with pytest.raises(PastaError, match=rf"^data alpaca_eval_gpt4: file not found: {tmp_path}/alpaca_eval\.jsonl; "
                                         r"set data\.path="):
        load_training_records(cfg)
    (tmp_path / "alpaca_eval.jsonl").write_text(json.dumps({"instruction": "Q", "output": "A"}) + "\n")
    with pytest.raises(PastaError, match=r"file not found: .*verbose__model_outputs\.json; set data\.answer_paths\[0\]="):
        load_training_records(cfg)
