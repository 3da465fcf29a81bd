"""The held-out evaluation pool: which prompts it holds, and that no training stage ever trains on one of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pasta.config import compose
from pasta.data import load_alpaca_eval, load_instructions, load_training_records, read_jsonl
from pasta.data.heldout import (
    HELDOUT_POOL_SEED,
    HELDOUT_POOL_SIZE,
    MAX_POOL_PROMPT_LINES,
    POOL_FILE,
    is_heldout,
    pool_hashes,
    select_subset,
)
from pasta.errors import PastaError
from pasta.lang import add_tag_tokens

ANNOTATED = Path(__file__).resolve().parents[1] / "data" / "annotated_examples.jsonl"


@pytest.fixture(scope="module")
def alpaca_eval(shared_data_dir) -> list[dict]:
    return load_alpaca_eval(compose("eval", ["eval_data=alpaca_eval"]).eval_data)


@pytest.fixture(scope="module")
def pool(alpaca_eval) -> list[dict]:
    return select_subset(alpaca_eval, HELDOUT_POOL_SIZE, HELDOUT_POOL_SEED)


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_shipped_pool_is_the_evaluations_subset_300_seed_0_and_holds_the_studys_100(alpaca_eval, pool):
    assert POOL_FILE.read_text().split() == pool_hashes(alpaca_eval)
    assert all(is_heldout(r["instruction"]) for r in pool)
    assert all(is_heldout(r["instruction"]) for r in select_subset(alpaca_eval, 100, 0))  # the study's prompts
    others = [r for r in alpaca_eval if r not in pool]
    assert len(others) == 505 and not any(is_heldout(r["instruction"]) for r in others)


def test_a_reformatted_alpaca_eval_copy_selects_the_same_held_out_prompts(alpaca_eval, pool):
    import unicodedata

    copy_ = [{**r, "instruction": unicodedata.normalize("NFD", r["instruction"].strip()).replace("\n", "\r\n")}
             for r in alpaca_eval]
    for size in (100, 300):
        selected = select_subset(copy_, size, HELDOUT_POOL_SEED)
        original = select_subset(alpaca_eval, size, HELDOUT_POOL_SEED)
        assert [alpaca_eval[copy_.index(r)] for r in selected] == original


def test_pool_prompts_are_matched_by_normalised_text_not_by_position(pool):
    prompt = pool[0]["instruction"]
    assert is_heldout(prompt.upper()) and is_heldout("  " + prompt.replace(" ", " \n\t ") + "\n")
    assert not is_heldout(prompt + " Answer briefly.")
    split = next(r["instruction"] for r in pool if "\n\n" in r["instruction"])  # AlpacaEval writes input inline
    instruction, input_text = split.split("\n\n", 1)
    assert not is_heldout(instruction) and is_heldout(instruction, input_text)


def test_the_longest_pool_prompt_spans_the_lines_the_guard_matches(pool):
    assert max(sum(1 for line in r["instruction"].splitlines() if line.strip()) for r in pool) == MAX_POOL_PROMPT_LINES


@pytest.mark.parametrize("disguise", [
    lambda p: p.replace("'", "\u2019").replace('"', "\u201c"),  # typographic quotes
    lambda p: "\ufeff" + p.replace(" ", " \u200b", 3) + "\u00ad",  # a BOM, zero-width spaces, a soft hyphen
    lambda p: f"You are a helpful assistant.\n\n{p}",  # under a system prompt
    lambda p: f"User: {p}\nAssistant:",  # after a role label
    lambda p: f"### Instruction:\n{p}\n\n### Response:",  # in the Alpaca template
    lambda p: f"<|im_start|>user\n{p}<|im_end|>",  # in a chat template's markers
    lambda p: f"[INST] {p} [/INST]",
], ids=["quotes", "invisible", "system", "label", "alpaca-template", "chatml", "inst"])
def test_a_pool_prompt_is_found_in_a_disguised_copy(pool, disguise):
    quoted = next(r["instruction"] for r in pool if "'" in r["instruction"])
    multiline = next(r["instruction"] for r in pool if "\n" in r["instruction"].strip())
    for prompt in (pool[0]["instruction"], quoted, multiline):
        assert is_heldout(disguise(prompt)), prompt


def test_a_pool_prompt_given_as_the_input_or_after_it_is_found(pool):
    prompt = pool[0]["instruction"]
    assert is_heldout("Answer the question below.", prompt)
    assert is_heldout("Answer briefly.", prompt.upper())
    split = next(r["instruction"] for r in pool if "\n\n" in r["instruction"])
    instruction, input_text = split.split("\n\n", 1)
    assert is_heldout(input_text, instruction)  # the fields swapped


def test_training_records_leave_out_pool_prompts_from_the_data_and_every_extra_file(pool, tmp_path):
    kept = [{"instruction": f"Name a colour, take {n}.", "output": "Blue."} for n in range(3)]
    heldout = [{"instruction": pool[0]["instruction"].upper(), "output": "Trained on? Never."},
               {"instruction": "Answer the question.", "input": pool[1]["instruction"], "output": "Never."},
               {"instruction": f"### Instruction:\n{pool[2]['instruction']}", "output": "Never."},
               {"instruction": pool[3]["instruction"].replace(" ", "\u200b ", 2), "output": "Never."}]
    data = write_records(tmp_path / "data.jsonl", [kept[0], heldout[0], kept[1], heldout[1], heldout[2]])
    extra = write_records(tmp_path / "forking.jsonl", [heldout[3], kept[2]])
    cfg = {"name": "mixed", "path": str(data), "extra_paths": [str(extra)], "limit": 2}
    records, report = load_training_records(cfg)
    assert [r.instruction for r in records] == [k["instruction"] for k in kept]  # the limit counts kept records
    assert report.num_heldout_left_out == 4
    assert len(load_instructions(cfg)) == 2 + 2  # a reader that does not train sees the file as it is


def test_alpaca_eval_gpt4_is_every_prompt_outside_the_pool_once(alpaca_eval, pool):
    records, report = load_training_records(compose("train", ["data=alpaca_eval_gpt4"]).data)
    outside = {r["instruction"] for r in alpaca_eval} - {r["instruction"] for r in pool}
    assert sorted(r.instruction for r in records) == sorted(outside)
    assert report.num_heldout_left_out == 300 and sum(report.answer_sources.values()) == len(records)


def test_sft_on_pool_prompts_alone_says_they_were_left_out_not_that_the_data_is_empty(pool, tmp_path):
    from pasta.training.sft import run_sft

    data = write_records(tmp_path / "data.jsonl", [{"instruction": r["instruction"], "output": "x"} for r in pool[:3]])
    cfg = compose("train", ["stage=sft", "model=tiny", f"data.path={data}", f"output_dir={tmp_path / 'run'}",
                            "device=cpu"])
    with pytest.raises(PastaError, match=r"^data sample: no training record is left: 3 records of the held-out "
                                         r"pool left out$"):
        run_sft(cfg)


@pytest.mark.slow
def test_sft_never_trains_on_a_pool_prompt_and_train_info_says_how_many_it_left_out(pool, tmp_path):
    from pasta.training.sft import run_sft

    annotated = read_jsonl(ANNOTATED)
    leaked = [{**annotated[n], "instruction": pool[n]["instruction"]} for n in range(3)]
    data = write_records(tmp_path / "data.jsonl", leaked + annotated)
    cfg = compose("train", ["stage=sft", "model=tiny", f"data.path={data}", f"output_dir={tmp_path / 'run'}",
                            "device=cpu", "stage.max_length=96", "stage.max_steps=1",
                            "stage.per_device_train_batch_size=2", "data.min_promise_share=null"])
    run_sft(cfg)
    info = json.loads((tmp_path / "run" / "train_info.json").read_text())
    assert info["loaded"]["num_heldout_left_out"] == 3
    assert info["examples"]["num_records"] == len(annotated)


class LengthJudge:
    name = "fake:length"

    def score(self, items):
        return [min(1.0, len(item.candidate) / 200) for item in items]


@pytest.mark.slow
def test_preference_rounds_never_sample_a_pool_prompt(pool, tiny_model_and_tokenizer, tmp_path, monkeypatch):
    from pasta.training.pref import run_pref

    model, tokenizer = (copy.deepcopy(x) for x in tiny_model_and_tokenizer)
    add_tag_tokens(tokenizer, model)
    sft_folder = tmp_path / "sft-final"
    model.save_pretrained(sft_folder)
    tokenizer.save_pretrained(sft_folder)
    annotated = read_jsonl(ANNOTATED)[:2]
    leaked = [{**annotated[0], "instruction": pool[n]["instruction"]} for n in range(2)]
    data = write_records(tmp_path / "data.jsonl", leaked + annotated)  # the pool's first: a round's window
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    run_pref(compose("train", [
        "stage=pref", "device=cpu", f"output_dir={tmp_path / 'pref'}", f"model.path={sft_folder}",
        f"data.path={data}", "stage.rounds=1", "stage.prompts_per_round=2", "stage.num_samples=2",
        "stage.max_new_tokens=6", "stage.per_device_train_batch_size=2", "stage.max_steps=1",
        "stage.sample_batch_size=2", "stage.max_length=160", "stage.save_steps=100"]))
    sampled = {e["instruction"] for e in read_jsonl(tmp_path / "pref" / "round-1" / "scores.jsonl")}
    assert sampled == {r["instruction"] for r in annotated}
    info = json.loads((tmp_path / "pref" / "train_info.json").read_text())
    assert info["loaded"]["num_heldout_left_out"] == 2
