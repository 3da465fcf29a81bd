"""JSON Lines I/O and the instruction / AlpacaEval loaders, on good and bad files written here."""

from __future__ import annotations

import json
import os

import pytest

from pasta.config import compose
from pasta.data import (
    JsonlAppender,
    Record,
    append_jsonl,
    load_alpaca_eval,
    load_instructions,
    read_jsonl,
    write_json_atomic,
    write_jsonl_atomic,
)
from pasta.errors import PastaError


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _data_cfg(path, **overrides):
    return {"name": "t", "path": str(path), **overrides}


def test_read_jsonl_returns_objects_in_order_and_ignores_blank_lines(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"a": 1}', "", "   ", '{"a": 2}'])
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_malformed_line_fails_naming_file_and_line(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"a": 1}', '{"a": 2}', '{"a": '])
    with pytest.raises(PastaError, match=r"x\.jsonl:3: invalid JSON"):
        read_jsonl(path)


def test_malformed_lines_are_skipped_in_skip_mode(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ["not json", '{"a": 1}', "[1, 2]", '{"a": 2}'])
    assert read_jsonl(path, on_error="skip") == [{"a": 1}, {"a": 2}]


def test_line_that_is_not_an_object_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"a": 1}', '"just a string"'])
    with pytest.raises(PastaError, match=r"x\.jsonl:2: invalid JSON \(expected a JSON object, got str\)"):
        read_jsonl(path)


def test_missing_file_is_a_pasta_error(tmp_path):
    with pytest.raises(PastaError, match="file not found: .*nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_unknown_on_error_mode_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"a": 1}'])
    with pytest.raises(PastaError, match="on_error=ignore"):
        read_jsonl(path, on_error="ignore")


def test_appender_drops_a_truncated_last_line_then_appends_whole_lines(tmp_path):
    path = tmp_path / "out" / "results.jsonl"
    append_jsonl(path, [{"id": 1}, {"id": 2}])
    with path.open("a", encoding="utf-8") as handle:  # what a crash in the middle of a write leaves
        handle.write('{"id": 3, "text": "half wri')
    with JsonlAppender(path) as out:
        out.append({"id": 4, "text": "ünïcode"})
    assert read_jsonl(path) == [{"id": 1}, {"id": 2}, {"id": 4, "text": "ünïcode"}]
    assert path.read_bytes().endswith(b"\n")


def test_appender_keeps_a_whole_last_record_without_its_newline(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": 1}\n{"id": 2, "text": "whole"}', encoding="utf-8")  # a hand-written file, say
    append_jsonl(path, [{"id": 3}])
    assert read_jsonl(path) == [{"id": 1}, {"id": 2, "text": "whole"}, {"id": 3}]


def test_appender_keeps_a_file_that_ends_with_a_newline(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"id": 1}'])
    append_jsonl(path, [{"id": 2}])
    assert read_jsonl(path) == [{"id": 1}, {"id": 2}]


def test_appender_drops_a_truncated_only_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": 1', encoding="utf-8")
    append_jsonl(path, [{"id": 2}])
    assert read_jsonl(path) == [{"id": 2}]


def test_write_json_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "summary.json"
    write_json_atomic(path, {"v": 1})
    write_json_atomic(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert os.listdir(path.parent) == ["summary.json"]


def test_failed_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_write_jsonl_atomic_round_trips(tmp_path):
    records = [{"a": 1}, {"b": "two\nlines"}]
    write_jsonl_atomic(tmp_path / "x.jsonl", records)
    assert read_jsonl(tmp_path / "x.jsonl") == records


def test_record_id_is_stable_and_depends_on_content_only():
    record = Record(instruction="Name three colors.", input="", output="Red, green, blue.")
    # A fixed value: ids must not change between runs, machines or Python versions.
    assert record.id == "c15282a533b9a485"
    assert Record("Name three colors.", "Red, green, blue.", annotated="x", extra={"id": 7}).id == record.id
    assert Record("Name three colors.", "Red.").id != record.id
    assert Record.from_dict({"instruction": "Name three colors.", "output": "Red, green, blue."}).id == record.id


def test_load_instructions_defaults_input_and_keeps_extra_fields(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [
        json.dumps({"instruction": "Say hi.", "output": "Hi."}),
        json.dumps({"instruction": "Add.", "input": "1+1", "output": "2", "annotated": "2"}),
    ])
    records = load_instructions(_data_cfg(path))
    assert records == [Record("Say hi.", "Hi."), Record("Add.", "2", input="1+1", annotated="2")]
    assert records[1].extra == {}
    (with_extra,) = load_instructions(_data_cfg(_write_lines(tmp_path / "y.jsonl", [
        json.dumps({"instruction": "A", "output": "B", "accepted": False, "teacher": "structural"})
    ])))
    assert (with_extra.accepted, with_extra.extra) == (False, {"teacher": "structural"})


def test_load_instructions_reads_a_json_list(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps([{"instruction": "A", "input": "", "output": "B"}]), encoding="utf-8")
    assert load_instructions(_data_cfg(path)) == [Record("A", "B")]


def test_json_list_with_a_bad_record_names_the_record(tmp_path):
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps([{"instruction": "A", "output": "B"}, {"instruction": "C"}]), encoding="utf-8")
    with pytest.raises(PastaError, match=r"alpaca\.json: record 2: missing field 'output'"):
        load_instructions(_data_cfg(path))


def test_missing_field_names_line_and_field(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [
        json.dumps({"instruction": "A", "output": "B"}),
        json.dumps({"instruction": "C", "input": "D"}),
    ])
    with pytest.raises(PastaError, match=r"x\.jsonl:2: missing field 'output'"):
        load_instructions(_data_cfg(path))


def test_field_that_is_not_a_string_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "input": 3, "output": "B"})])
    with pytest.raises(PastaError, match=r"x\.jsonl:1: field 'input' is not a string"):
        load_instructions(_data_cfg(path))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"annotated": 3}, "field 'annotated' is not a string or null"),
     ({"accepted": "yes"}, "field 'accepted' is not true or false")],
)
def test_annotation_fields_of_the_wrong_type_are_rejected(tmp_path, fields, problem):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B", **fields})])
    with pytest.raises(PastaError, match=rf"x\.jsonl:1: {problem}"):
        load_instructions(_data_cfg(path))


def test_skip_mode_drops_bad_records_and_keeps_good_ones(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [
        json.dumps({"instruction": "A", "output": "B"}),
        "{broken",
        json.dumps({"output": "no instruction"}),
        json.dumps({"instruction": "C", "output": "D"}),
    ])
    records = load_instructions(_data_cfg(path, on_error="skip"))
    assert [r.instruction for r in records] == ["A", "C"]


def test_shuffle_offset_and_limit_select_disjoint_reproducible_windows(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl",
                        [json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) for i in range(20)])
    first = load_instructions(_data_cfg(path, shuffle=True, seed=3, limit=5))
    second = load_instructions(_data_cfg(path, shuffle=True, seed=3, offset=5, limit=5))
    assert first == load_instructions(_data_cfg(path, shuffle=True, seed=3, limit=5))
    assert len(first) == len(second) == 5
    assert not {r.instruction for r in first} & {r.instruction for r in second}
    assert [r.instruction for r in first] != [f"q{i}" for i in range(5)]
    assert [r.instruction for r in load_instructions(_data_cfg(path, offset=18))] == ["q18", "q19"]


def test_extra_paths_follow_the_selected_records_whole_in_pattern_then_name_order(tmp_path):
    # A preference run's round-*/forking.jsonl files added to SFT data: data.limit picks from `path` only.
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": f"q{i}", "output": "a"}) for i in range(5)])
    for round_index in (2, 1):
        folder = tmp_path / "pref" / f"round-{round_index}"
        folder.mkdir(parents=True)
        _write_lines(folder / "forking.jsonl", [json.dumps({"instruction": f"r{round_index}", "output": "b",
                                                            "annotated": "b", "round": round_index})])
    extra = [str(tmp_path / "pref" / "round-*" / "forking.jsonl")]
    records = load_instructions(_data_cfg(path, limit=2, extra_paths=extra))
    assert [r.instruction for r in records] == ["q0", "q1", "r1", "r2"]
    assert records[2].annotated == "b" and records[2].extra["round"] == 1


def test_an_extra_path_that_matches_no_file_is_an_error_naming_it(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B"})])
    missing = str(tmp_path / "pref" / "round-*" / "forking.jsonl")
    with pytest.raises(PastaError, match=r"^data.extra_paths: no file matches '.*round-\*/forking.jsonl'$"):
        load_instructions(_data_cfg(path, extra_paths=[missing]))


def test_a_bad_record_in_an_extra_file_names_that_file_and_line(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B"})])
    extra = _write_lines(tmp_path / "more.jsonl", [json.dumps({"instruction": "C", "output": "D"}),
                                                  json.dumps({"instruction": "E"})])
    with pytest.raises(PastaError, match=r"more.jsonl:2: missing field 'output'"):
        load_instructions(_data_cfg(path, extra_paths=[str(extra)]))


def test_malformed_pasta_lang_in_an_extra_file_fails_in_one_line_or_is_skipped_counted_and_logged(tmp_path, caplog):
    """Issue 36: an extra file's record whose annotation does not parse (an <async> without its promise) was
    dropped unseen under data.on_error=fail."""
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B"})])
    extra = _write_lines(tmp_path / "forking.jsonl", [
        json.dumps({"instruction": "C", "output": "D E", "annotated": 'D<promise topic="e"/><async topic="e">E</async>'}),
        json.dumps({"instruction": "F", "output": "G", "annotated": '<async topic="g">G</async>'}),
        json.dumps({"instruction": "H", "output": "I", "annotated": '<async topic="i">I</async>', "accepted": False}),
    ])
    with pytest.raises(PastaError, match=r"^\S*forking.jsonl:2: field 'annotated' is not well-formed PASTA-LANG \("):
        load_instructions(_data_cfg(path, extra_paths=[str(extra)]))
    with caplog.at_level("WARNING", logger="pasta.data.instructions"):
        records = load_instructions(_data_cfg(path, extra_paths=[str(extra)], on_error="skip"))
    assert [r.instruction for r in records] == ["A", "C", "H"]  # H is not used for training: accepted false
    assert "skipping " in caplog.text and "forking.jsonl:2: field 'annotated' is not well-formed" in caplog.text
    assert f"data.extra_paths: skipped 1 of 3 records of {extra} (data.on_error=skip)" in caplog.text


def test_negative_limit_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B"})])
    with pytest.raises(PastaError, match=r"^data.limit: must be >= 0 or null, got -1$"):
        load_instructions(_data_cfg(path, limit=-1))


def test_data_config_without_a_name_is_rejected(tmp_path):
    with pytest.raises(PastaError, match="data config '<unnamed>' is invalid"):
        load_instructions({"path": str(tmp_path / "x.jsonl")})


def test_stage_keys_in_the_data_node_do_not_disturb_the_loader(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [json.dumps({"instruction": "A", "output": "B"})])
    assert len(load_instructions(_data_cfg(path, strip_annotations=True))) == 1


def test_missing_file_without_hub_fallback_names_the_override(tmp_path):
    with pytest.raises(PastaError, match=r"file not found: .*absent\.jsonl; set data\.path="):
        load_instructions(_data_cfg(tmp_path / "absent.jsonl"))
    with pytest.raises(PastaError, match=r"set eval_data\.path="):
        load_alpaca_eval(_data_cfg(tmp_path / "absent.jsonl"))


def test_a_folder_for_the_data_file_is_refused_not_replaced_by_the_hub_copy(tmp_path):
    cfg = _data_cfg(tmp_path, hub_id="pasta-tests/no-such-dataset")
    with pytest.raises(PastaError, match=rf"data\.path={tmp_path} is not a file"):
        load_instructions(cfg)
    with pytest.raises(PastaError, match=rf"eval_data\.path={tmp_path} is not a file"):
        load_alpaca_eval(cfg)


@pytest.mark.skipif(os.environ.get("HF_DATASETS_OFFLINE") != "1", reason="needs HF_DATASETS_OFFLINE=1 (no hub)")
def test_missing_file_with_unreachable_hub_is_one_clear_error(tmp_path):
    cfg = _data_cfg(tmp_path / "absent.jsonl", hub_id="pasta-tests/no-such-dataset")
    with pytest.raises(PastaError, match=r"absent\.jsonl is absent and hub dataset pasta-tests/no-such-dataset"):
        load_instructions(cfg)


def test_alpaca_eval_loader_fills_generator_and_dataset(tmp_path):
    path = _write_lines(tmp_path / "e.jsonl", [
        json.dumps({"instruction": "Q", "output": "ref", "generator": "gpt4", "dataset": "helpful_base"}),
        json.dumps({"instruction": "Q2", "output": "ref2"}),
    ])
    records = load_alpaca_eval(_data_cfg(path))
    assert records[0] == {"instruction": "Q", "output": "ref", "generator": "gpt4", "dataset": "helpful_base"}
    assert records[1] == {"instruction": "Q2", "output": "ref2", "generator": "reference", "dataset": "t"}


def test_alpaca_eval_record_without_reference_is_rejected(tmp_path):
    path = _write_lines(tmp_path / "e.jsonl", [json.dumps({"instruction": "Q"})])
    with pytest.raises(PastaError, match=r"e\.jsonl:1: missing field 'output'"):
        load_alpaca_eval(_data_cfg(path))


def test_shipped_samples_load_through_the_default_configs():
    train = load_instructions(compose("train").data)
    evaluation = load_alpaca_eval(compose("eval").eval_data)
    assert len(train) >= 60 and all(r.instruction and r.output for r in train)
    assert len(evaluation) >= 20 and all(r["generator"] and r["dataset"] for r in evaluation)
    assert len({r.id for r in train}) == len(train)


def test_shared_alpaca_and_alpaca_eval_load_through_configured_paths(shared_data_dir):
    train = load_instructions(compose("train", ["data=alpaca_5k", "data.limit=100"]).data)
    evaluation = load_alpaca_eval(compose("eval", ["eval_data=alpaca_eval"]).eval_data)
    assert len(train) == 100
    assert len(evaluation) == 805
    assert {r["generator"] for r in evaluation} == {"gpt4_1106_preview"}
