"""Nothing is scored from a corrupt or mismatched file: duplicate prompts are refused before decoding, saved
annotations are checked row by row, and a resume with a setting that changes the tokens is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pasta.config import compose
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation.quality import load_annotations

TINY = ["model=tiny", "decode.max_new_tokens=4", "eval.warmup_prompts=0", "device=cpu", "eval.mode=generate"]
EVAL_SAMPLE = Path(__file__).resolve().parent.parent / "data" / "eval_sample.jsonl"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_an_eval_set_with_a_prompt_twice_is_refused_before_any_model_is_loaded(tmp_path, monkeypatch):
    def no_model(*_args, **_kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("pasta.models.load_model", no_model)
    record = {"instruction": "Name a fruit.", "output": "An apple."}
    data = tmp_path / "eval.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [record, {"instruction": "Other.", "output": "x"}, record]))
    cfg = compose("eval", [*TINY, f"eval_data.path={data}", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(PastaError, match=r"record 3: instruction given twice: 'Name a fruit\.'"):
        evaluate(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("override", "says"),
    [("lang.reservation.scale=3", r"reservation\.scale=2\.0, not 3"),
     ("decode.max_new_tokens=5", r"decode\.max_new_tokens=4, not 5"), ("seed=1", "seed=0, not 1")],
)
def test_resuming_with_a_setting_that_changes_the_tokens_is_refused_naming_it(tmp_path, override, says):
    run = ["eval.limit=1", f"output_dir={tmp_path / 'run'}", "decode=async"]
    evaluate(compose("eval", [*TINY, *run]))
    with pytest.raises(PastaError, match=f"holds a run with {says}: "):
        evaluate(compose("eval", [*TINY, *run, override]))


def annotations(path: Path, preferences: list, instructions: list[str] | None = None) -> Path:
    instructions = instructions or [json.loads(line)["instruction"] for line in EVAL_SAMPLE.read_text().splitlines()]
    rows = [{"instruction": instruction, "output_1": "ref", "output_2": f"answer {i}", "generator_1": "reference",
             "generator_2": "mine", "preference": preference}
            for i, (instruction, preference) in enumerate(zip(instructions, preferences, strict=False))]
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize(
    ("preferences", "message"),
    [
        ([1.0, 7.5], r"row 2: preference 7\.5 is outside \[1, 2\]"),
        ([1.0, "banana"], r"row 2: preference 'banana' is not a number"),
        ([1.0, "1.5"], r"row 2: preference '1\.5' is not a number"),
        ([True], r"row 1: preference True is not a number"),
        ([-1], r"row 1: preference -1 is outside \[1, 2\]"),
    ],
)
def test_annotations_with_a_preference_outside_1_to_2_are_refused_naming_the_row(tmp_path, preferences, message):
    with pytest.raises(PastaError, match=message):
        load_annotations(annotations(tmp_path / "a.json", preferences))


def test_annotations_may_hold_draws_and_unjudged_rows(tmp_path):
    frame = load_annotations(annotations(tmp_path / "a.json", [1.0, 2.0, 1.5, 0, None]))
    assert frame["preference"].isna().tolist() == [False, False, False, False, True]


def test_annotations_with_a_row_twice_are_refused(tmp_path):
    path = annotations(tmp_path / "a.json", [1.0, 2.0], ["Name a fruit.", "Name a fruit."])
    with pytest.raises(PastaError, match=r"row 2: instruction given twice: 'Name a fruit\.'"):
        load_annotations(path)


def test_annotations_of_instructions_outside_the_eval_set_are_refused(tmp_path):
    path = annotations(tmp_path / "a.json", [1.0, 2.0], ["Not an eval prompt.", "Nor this."])
    cfg = compose("eval", [f"eval.annotations={path}", f"output_dir={tmp_path / 'out'}", "eval.length_controlled=off"])
    with pytest.raises(PastaError, match="holds 2 instructions that are not in the evaluation set"):
        evaluate(cfg)
    assert not (tmp_path / "out").exists()
