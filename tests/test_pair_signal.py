"""scripts/pair_signal.py: a round's saved candidates re-paired under each speed reward and lambda, per side."""

from __future__ import annotations

import json

import pytest

from helpers.scripts import load_script
from pasta.errors import PastaError


def candidate(quality: float, num_tokens: int, num_steps: int, text: str = "x") -> dict:
    forked = num_steps < num_tokens
    return {
        "text": text, "annotated": text, "speedup": num_tokens / num_steps, "quality": quality, "judge": "fake:j",
        "num_tokens": num_tokens, "num_steps": num_steps, "finish_reason": "eos", "malformed": {},
        "tokens": {"main_ids": [5], "opener_ids": [], "body_ids": [[6]] if forked else [], "num_predicted": []},
    }


def scores_record(key: str, candidates: list[dict]) -> dict:
    return {"id": key, "prompt_index": 0, "instruction": key, "input": "", "reference": "r", "prompt_ids": [1, 2],
            "judge": "fake:j", "status": "scored", "reference_num_tokens": 60, "candidates": candidates}


def test_quality_alone_chooses_the_plain_answer_and_the_theoretical_reward_the_longer_fork(tmp_path, capsys):
    # One prompt: a plain answer as long as the reference, judged better, and a fork twice as long in 80 steps.
    scores = tmp_path / "scores.jsonl"
    scores.write_text(json.dumps(scores_record("a", [candidate(0.6, 60, 60), candidate(0.5, 120, 80)])) + "\n")
    pair_signal = load_script("pair_signal")
    assert pair_signal.main([str(scores), "--rewards", "theoretical", "latency_capped", "--lambdas", "1", "inf"]) == 0
    table = capsys.readouterr().out
    assert "| theoretical | 1 | 1 | 1 / 0 | 0 / 0 | 1.50 / 1.00 | 2.00 / 1.00 | 0.500 / 0.600 |" in table
    assert "| theoretical | inf | 1 | 0 / 1 | 0 / 0 | 1.00 / 1.50 | 1.00 / 2.00 | 0.600 / 0.500 |" in table
    # Capped latency: the fork's speed is 60 / 80 = 0.75 against the plain answer's 1.0, so the plain one wins.
    assert "| latency_capped | 1 | 1 | 0 / 1 |" in table
    assert "quality (fake:j)" in table


def test_the_samples_length_is_shown_beside_the_chosen_side_and_a_tolerance_pairs_as_the_stage(tmp_path, capsys):
    # Three plain answers to a 60-token reference: as long (best under the capped latency), twice as long (the worst),
    # and 10% longer, judged a little worse (the worst within 0.2 of the best's length).
    scores = tmp_path / "scores.jsonl"
    answers = [candidate(0.5, 60, 60, "x" * 60), candidate(0.5, 120, 120, "x" * 120), candidate(0.4, 66, 66, "x" * 66)]
    scores.write_text(json.dumps(scores_record("a", answers)) + "\n")
    pair_signal = load_script("pair_signal")
    assert pair_signal.main([str(scores), "--rewards", "latency_capped", "--lambdas", "1"]) == 0
    out = capsys.readouterr().out
    # The chosen side is shorter than the samples it was chosen from: 1.00 against 1.37 of the reference's tokens.
    assert "every candidate's tokens / its reference's (mean): 1.37" in out
    assert "| latency_capped | 1 | 1 | 0 / 0 | 0 / 0 | 1.00 / 1.00 | 1.00 / 2.00 | 0.500 / 0.500 |" in out
    assert pair_signal.main([str(scores), "--rewards", "latency_capped", "--lambdas", "1",
                             "--length-tolerance", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "rejected sides within 0.2 of the chosen side's length" in out
    assert "| latency_capped | 1 | 1 | 0 / 0 | 0 / 0 | 1.00 / 1.00 | 1.00 / 1.10 | 0.500 / 0.400 |" in out


def test_the_quality_floor_chooses_no_answer_judged_below_the_median_candidate(tmp_path, capsys):
    # At lambda 1 the fastest fork (0.2 quality, below the median 0.5) would be chosen over the plain answers; with the
    # floor the faster fork of median quality is, against the slowest answer it is not judged worse than.
    scores = tmp_path / "scores.jsonl"
    answers = [candidate(0.2, 60, 20), candidate(0.5, 60, 40), candidate(0.6, 60, 60), candidate(0.4, 60, 60)]
    scores.write_text(json.dumps(scores_record("a", answers)) + "\n")
    pair_signal = load_script("pair_signal")
    assert pair_signal.main([str(scores), "--rewards", "theoretical", "--lambdas", "1"]) == 0
    assert "| theoretical | 1 | 1 | 1 / 0 | 0 / 0 | 3.00 / 1.00 | 1.00 / 1.00 | 0.200 / 0.400 |" in capsys.readouterr().out
    assert pair_signal.main([str(scores), "--rewards", "theoretical", "--lambdas", "1", "--quality-floor"]) == 0
    out = capsys.readouterr().out
    assert "chosen sides judged no worse than their prompt's median candidate" in out
    assert "| theoretical | 1 | 1 | 1 / 0 | 0 / 0 | 1.50 / 1.00 | 1.00 / 1.00 | 0.500 / 0.400 |" in out


def test_a_file_that_is_not_a_round_s_scores_is_refused_with_the_reason(tmp_path):
    scores = tmp_path / "scores.jsonl"
    scores.write_text(json.dumps({"id": "a", "text": "not a scored prompt"}) + "\n")
    with pytest.raises(PastaError, match="not a preference round's scores.jsonl"):
        load_script("pair_signal").main([str(scores)])


def test_chosen_must_end_chooses_no_answer_its_budget_cut(tmp_path, capsys):
    # At lambda inf the long answer the budget cut (judged best) is chosen over the one that ended; with
    # --chosen-must-end the ended one is chosen and the cut one rejected.
    scores = tmp_path / "scores.jsonl"
    cut = dict(candidate(0.7, 120, 120), finish_reason="max_total_tokens")
    scores.write_text(json.dumps(scores_record("a", [candidate(0.5, 60, 60), cut])) + "\n")
    pair_signal = load_script("pair_signal")
    assert pair_signal.main([str(scores), "--rewards", "theoretical", "--lambdas", "inf"]) == 0
    assert "| theoretical | inf | 1 | 0 / 0 | 1 / 0 | 1.00 / 1.00 | 2.00 / 1.00 | 0.700 / 0.500 |" in (
        capsys.readouterr().out)
    assert pair_signal.main([str(scores), "--rewards", "theoretical", "--lambdas", "inf", "--chosen-must-end"]) == 0
    out = capsys.readouterr().out
    assert "chosen sides that ended by themselves: none cut by its budget" in out
    assert "| theoretical | inf | 1 | 0 / 0 | 0 / 1 | 1.00 / 1.00 | 1.00 / 2.00 | 0.500 / 0.700 |" in out


def test_both_rejected_sides_add_each_forks_pair_against_its_own_words_untagged(tmp_path, capsys,
                                                                                 tiny_model_and_tokenizer):
    # One prompt: a plain answer judged better and a fork in 30 steps for 60 tokens. With both rejected sides the
    # fork is also paired against its own words untagged, encoded by the tokenizer given.
    scores = tmp_path / "scores.jsonl"
    scores.write_text(json.dumps(scores_record("a", [candidate(0.6, 60, 60), candidate(0.5, 60, 30, "fork")])) + "\n")
    tiny_model_and_tokenizer[1].save_pretrained(tmp_path / "policy")
    pair_signal = load_script("pair_signal")
    argv = [str(scores), "--rewards", "theoretical", "--lambdas", "1"]
    assert pair_signal.main(argv) == 0
    assert "| theoretical | 1 | 1 | 1 / 0 |" in capsys.readouterr().out
    assert pair_signal.main([*argv, "--rejected-side", "both", "--tokenizer", str(tmp_path / "policy")]) == 0
    out = capsys.readouterr().out
    assert "rejected sides: both (stage.rejected_side)" in out
    assert "| theoretical | 1 | 2 | 2 / 0 |" in out


def test_an_untagged_pairing_without_a_usable_tokenizer_is_refused(tmp_path, capsys):
    scores = tmp_path / "scores.jsonl"
    scores.write_text(json.dumps(scores_record("a", [candidate(0.6, 60, 60), candidate(0.5, 60, 30)])) + "\n")
    pair_signal = load_script("pair_signal")
    with pytest.raises(SystemExit) as exited:
        pair_signal.main([str(scores), "--rejected-side", "untagged"])
    assert exited.value.code == 2 and "--rejected-side untagged needs --tokenizer" in capsys.readouterr().err
    with pytest.raises(PastaError, match=f"^--tokenizer.*{tmp_path / 'absent'}"):
        pair_signal.main([str(scores), "--rejected-side", "both", "--tokenizer", str(tmp_path / "absent")])
