"""Stage 2 (preference): pairs from hand-made scores, judge retries and failures, the BoNBoN loss on the layout,
a few real steps, and whole rounds with resume after a crash."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from helpers.decoding import scripted_list
from helpers.models import cut_checkpoint, lively_model, looping_model
from helpers.training import ANNOTATED, hand_pairs
from pasta.config import compose
from pasta.data import Record, read_jsonl
from pasta.decoding import DecodeConfig
from pasta.errors import PastaError
from pasta.evaluation.length import answer_tokens
from pasta.lang import (
    IGNORE_INDEX,
    ReservationPolicy,
    TagIds,
    add_tag_tokens,
    encode_text,
    parse,
    sequence_logprobs,
)
from pasta.training.candidates import Candidate, ScoredPrompt
from pasta.training.config import Reference, RejectedSide, SpeedReward, settings_from_cfg
from pasta.training.examples import build_sft_examples, token_doc_of
from pasta.training.feedback import usable_promises
from pasta.training.pairs import Scored, best_and_worst, combined_score, make_pairs, summarize
from pasta.training.pref import run_pref, train_round
from pasta.training.sampling import judge_with_retries

SMALL_ANNOTATED = (
    'Tips: <promise topic="water"/><promise topic="sleep"/><async topic="water">Drink water.</async>'
    '<async topic="sleep">Sleep well.</async><sync/> Done.'
)


# --- pairs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quality_weight", "expected"),
    [(0.0, (1, 0)), (1.0, (1, 0)), (4.0, (0, 1)), (math.inf, (0, 1))],
)
def test_pair_is_best_and_worst_by_speedup_plus_lambda_quality(quality_weight, expected):
    # Scores at lambda=1: 1.9, 2.1, 2.0; at lambda=4: 4.6, 2.4, 3.5; at inf: the quality alone.
    candidates = [Scored(1.0, 0.9), Scored(2.0, 0.1), Scored(1.5, 0.5)]
    assert best_and_worst(candidates, quality_weight) == expected


def test_quality_only_score_ignores_speed():
    assert combined_score(Scored(3.0, 0.25), math.inf) == 0.25
    assert combined_score(Scored(3.0, 0.25), 2.0) == 3.5


def test_tied_candidates_make_no_pair_and_equal_scores_take_the_earliest():
    assert best_and_worst([Scored(1.0, 0.5), Scored(1.0, 0.5)], 1.0) is None
    assert best_and_worst([Scored(1.0, 0.5)], 1.0) is None
    assert best_and_worst([Scored(1.0, 0.0), Scored(2.0, 0.0), Scored(2.0, 0.0), Scored(1.0, 0.0)], 1.0) == (
        1,
        0,
    )


def test_a_malformed_candidate_is_never_chosen_and_is_rejected_first():
    # The garbled fork scores highest on speed; the clean fork is chosen, and the garbled one is the rejected side
    # although the plain answer scores lower.
    candidates = [Scored(1.0, 0.5), Scored(2.5, 0.5, num_malformed=1), Scored(1.6, 0.5)]
    assert best_and_worst(candidates, 1.0) == (2, 1)
    assert best_and_worst([Scored(2.0, 0.5, 1), Scored(1.5, 0.5, 2)], 1.0) is None


def test_with_a_length_tolerance_the_rejected_side_is_as_long_as_the_chosen_one():
    # The long rambling answer (index 0) scores worst; among answers within 15% of the best's 400 characters the
    # worst is the slow one of the same length (index 2), the pair stage.pair_length_tolerance asks for.
    candidates = [Scored(0.5, 0.1, num_chars=1000), Scored(2.0, 0.5, num_chars=400), Scored(1.0, 0.5, num_chars=380),
                  Scored(1.5, 0.5, num_chars=200)]
    assert best_and_worst(candidates, 1.0) == (1, 0)
    assert best_and_worst(candidates, 1.0, length_tolerance=0.15) == (1, 2)
    assert best_and_worst(candidates, 1.0, length_tolerance=0.0) is None


def test_make_pairs_skips_a_prompt_without_a_candidate_of_the_chosen_ones_length():
    short_fast = scored_entry("a", [0.5, 0.5], speedups=[2.0, 1.0], texts=["x" * 100, "x" * 400])
    matched = scored_entry("b", [0.5, 0.5], speedups=[2.0, 1.0], texts=["x" * 400, "x" * 420])
    pairs, skipped = make_pairs([short_fast, matched], 1.0, SpeedReward.theoretical, length_tolerance=0.15)
    assert [pair.id for pair in pairs] == ["b"]
    assert skipped == Counter({"no_length_match": 1})
    assert len(make_pairs([short_fast, matched], 1.0, SpeedReward.theoretical)[0]) == 2


def test_with_a_quality_floor_the_chosen_side_is_not_judged_below_it_nor_the_rejected_side_above_the_chosen():
    # At lambda 1 the fastest answer (index 0) is chosen although judged worst, against the slow one judged best
    # (2); with the floor at 0.5 the best of those judged 0.5 or more is index 1, and the worst it is judged no worse
    # than is index 3.
    candidates = [Scored(3.0, 0.2), Scored(2.0, 0.5), Scored(0.4, 0.9), Scored(1.0, 0.4)]
    assert best_and_worst(candidates, 1.0) == (0, 2)
    assert best_and_worst(candidates, 1.0, quality_floor=0.5) == (1, 3)
    assert best_and_worst(candidates, 1.0, quality_floor=0.95) is None
    # A malformed answer stays the rejected side whatever its quality: its pair teaches the structure.
    assert best_and_worst([Scored(1.0, 0.5), Scored(2.0, 0.9, num_malformed=1)], 1.0, quality_floor=0.5) == (0, 1)


def test_make_pairs_with_a_quality_floor_chooses_no_answer_judged_below_its_prompts_median_and_counts_the_rest():
    # "a": the fastest fork (2) is judged 0.5, the median of 0.9, 0.5, 0.5 and the malformed 3's 0.5: it stays
    # chosen. "b": its only fork is judged below the median and the plain answers tie on score with equal quality:
    # no untagged pair and no best-vs-worst pair.
    below = scored_entry("b", [0.9, 0.1, 0.9], speedups=[1.0, 3.0, 1.0], texts=["plain", "fork", "plain too"])
    below = dataclasses.replace(below, candidates=[
        below.candidates[0], dataclasses.replace(below.candidates[1], tokens=FORK), below.candidates[2]])
    def plain_ids(text, ended):
        return [1] * len(text)

    pairs, skipped = make_pairs([forked_entry(), below], 1.0, SpeedReward.theoretical,
                                rejected_side=RejectedSide.both, plain_ids=plain_ids, quality_floor=True)
    assert [(p.id, p.chosen.index, p.rejected.index) for p in pairs] == [("a", 2, 2), ("a", 2, 3)]
    assert skipped == Counter({"fork_below_quality_floor": 1, "below_quality_floor": 1})
    pairs, skipped = make_pairs([below], 1.0, SpeedReward.theoretical, rejected_side=RejectedSide.both,
                                plain_ids=plain_ids)
    assert [(p.chosen.index, p.rejected.index) for p in pairs] == [(1, 1), (1, 0)] and not skipped
    settings = settings_from_cfg(compose("train", ["stage=pref", "stage.quality_floor=true"]).stage)
    assert settings.quality_floor is True


def test_with_chosen_must_end_an_answer_its_budget_cut_is_never_chosen_and_is_rejected_first():
    # At lambda inf the long cut answer (1) is judged best; with the rule the best that ended (2) is chosen, the
    # cut one rejected although another ended answer (0) is judged worse. Every answer cut: no pair.
    candidates = [Scored(1.0, 0.3), Scored(1.0, 0.9, ended=False), Scored(1.0, 0.6)]
    assert best_and_worst(candidates, math.inf) == (1, 0)
    assert best_and_worst(candidates, math.inf, chosen_must_end=True) == (2, 1)
    assert best_and_worst(candidates, math.inf, quality_floor=0.5, chosen_must_end=True) == (2, 1)
    assert best_and_worst([Scored(1.0, 0.9, ended=False), Scored(1.0, 0.3, ended=False)], math.inf,
                          chosen_must_end=True) is None


def test_make_pairs_with_chosen_must_end_counts_the_cut_sides_and_the_prompts_left_without_a_pair():
    # "a": its best fork (2) was cut, so the untagged pair takes the other fork (1), and best vs worst chooses the
    # plain answer (0) against the cut fork, which now ranks with the malformed one (3) and scores below it. "b":
    # every answer cut. Without the rule the cut fork is chosen in both of a's pairs.
    def ends(entry, *reasons):
        return dataclasses.replace(entry, candidates=[dataclasses.replace(c, finish_reason=r)
                                                      for c, r in zip(entry.candidates, reasons, strict=True)])

    def plain_ids(text, ended):
        return [1] * len(text)

    a = ends(forked_entry(), "eos", "eos", "max_total_tokens", "eos")
    b = ends(scored_entry("b", [0.5, 0.4]), "max_new_tokens", "max_new_tokens")
    pairs, skipped = make_pairs([a, b], 1.0, SpeedReward.theoretical, rejected_side=RejectedSide.both,
                                plain_ids=plain_ids)
    assert [(p.id, p.chosen.index, p.rejected.index) for p in pairs] == [("a", 2, 2), ("a", 2, 3), ("b", 0, 1)]
    summary = summarize([a, b], pairs, skipped, 1.0, SpeedReward.theoretical)
    assert (summary["chosen_num_cut"], summary["rejected_num_cut"]) == (3, 2)
    pairs, skipped = make_pairs([a, b], 1.0, SpeedReward.theoretical, rejected_side=RejectedSide.both,
                                plain_ids=plain_ids, chosen_must_end=True)
    assert [(p.id, p.chosen.index, p.rejected.index) for p in pairs] == [("a", 1, 1), ("a", 0, 2)]
    assert skipped == Counter({"no_fork": 1, "all_cut": 1})
    summary = summarize([a, b], pairs, skipped, 1.0, SpeedReward.theoretical)
    assert (summary["chosen_num_cut"], summary["rejected_num_cut"]) == (0, 1)
    settings = settings_from_cfg(compose("train", ["stage=pref", "stage.chosen_must_end=true"]).stage)
    assert settings.chosen_must_end is True


def scored_entry(key, qualities, speedups=None, status="scored", texts=None):
    speedups = speedups or [1.0] * len(qualities)
    texts = texts or [f"t{i}" for i in range(len(qualities))]
    return ScoredPrompt.from_json({
        "id": key,
        "instruction": key,
        "judge": "fake:j",
        "status": status,
        "prompt_ids": [1, 2],
        "candidates": [
            {
                "speedup": s,
                "quality": q,
                "judge": "fake:j",
                "text": text,
                "annotated": text,
                "tokens": {"main_ids": [5 + i], "opener_ids": [], "body_ids": [], "num_predicted": []},
            }
            for i, (s, q, text) in enumerate(zip(speedups, qualities, texts, strict=True))
        ],
        "prompt_index": 0,
        "input": "",
        "reference": "",
    })


FORK = {"main_ids": [7, 8], "opener_ids": [[9]], "body_ids": [[10, 11]], "num_predicted": [2]}


def forked_entry():
    """Candidate 0 is plain and scores second best (lambda 1); 1 and 2 fork, 2 the faster and the best; 3 forks
    fastest but is malformed."""
    entry = scored_entry("a", [0.9, 0.5, 0.5, 0.5], speedups=[1.0, 1.2, 1.5, 3.0],
                         texts=["plain", "fork one", "fork two", "broken"])
    return dataclasses.replace(entry, candidates=[
        entry.candidates[0],
        *(dataclasses.replace(c, tokens=FORK, finish_reason="eos") for c in entry.candidates[1:3]),
        dataclasses.replace(entry.candidates[3], tokens=FORK, malformed={"unclosed": 1}),
    ])


def test_an_untagged_pair_is_the_best_fork_against_its_own_words_decoded_sequentially():
    # The chosen side is 2, the rejected side its own text without tags, one token a step (eos kept: it ended).
    # Prompt "b" never forks: no pair.
    entry = forked_entry()
    encoded = []

    def plain_ids(text, ended):
        encoded.append((text, ended))
        return [ord(ch) for ch in text] + ([0] if ended else [])

    pairs, skipped = make_pairs([entry, scored_entry("b", [0.5, 0.4])], 1.0, SpeedReward.theoretical,
                                rejected_side=RejectedSide.untagged, plain_ids=plain_ids)
    (pair,) = pairs
    assert skipped == Counter({"no_fork": 1}) and encoded == [("fork two", True)]
    assert (pair.chosen.index, pair.rejected.index) == (2, 2) and pair.chosen.tokens == FORK
    assert pair.rejected.tokens == {"main_ids": [*map(ord, "fork two"), 0], "opener_ids": [], "body_ids": [],
                                    "num_predicted": []}
    assert pair.rejected.text == pair.rejected.annotated == pair.chosen.text == "fork two"
    assert pair.rejected.speedup == 1.0 and pair.rejected.quality == pair.chosen.quality
    assert pair.chosen.score > pair.rejected.score  # the same words, the same quality: the fork is faster
    entry = dataclasses.replace(entry, reference_num_tokens=9)  # the rejected side's length is its own plain tokens
    (pair,), _ = make_pairs([entry], 1.0, SpeedReward.theoretical, rejected_side=RejectedSide.untagged,
                            plain_ids=plain_ids)
    summary = summarize([entry], [pair], Counter(), 1.0, SpeedReward.theoretical)
    assert summary["rejected_mean_length_ratio"] == pytest.approx(9 / 9)  # "fork two" and eos
    # A fork whose tags cost more steps than its chunks save is slower than its own words: not taught.
    slow = dataclasses.replace(entry, candidates=[dataclasses.replace(c, speedup=0.9) for c in entry.candidates])
    assert make_pairs([slow], 1.0, SpeedReward.theoretical, rejected_side=RejectedSide.untagged,
                      plain_ids=plain_ids) == ([], Counter({"fork_not_better": 1}))
    with pytest.raises(PastaError, match="pair_length_tolerance applies to rejected_side=worst"):
        settings_from_cfg(compose("train", ["stage=pref", "stage.rejected_side=untagged",
                                            "stage.pair_length_tolerance=0.2"]).stage)


def test_with_both_rejected_sides_a_prompt_gives_its_untagged_pair_and_its_best_vs_worst_pair():
    # "a": the best fork (2) against its untagged words, and against the worst candidate (3, malformed); "b" never
    # forks, so only its best-vs-worst pair; the skipped count says which pair is missing.
    plain = scored_entry("b", [0.5, 0.4])
    pairs, skipped = make_pairs([forked_entry(), plain], 1.0, SpeedReward.theoretical,
                                rejected_side=RejectedSide.both, plain_ids=lambda text, ended: [1] * len(text))
    assert [(p.id, p.chosen.index, p.rejected.index, p.rejected.forked) for p in pairs] == [
        ("a", 2, 2, False), ("a", 2, 3, True), ("b", 0, 1, False)]
    assert pairs[0].rejected.text == pairs[0].chosen.text == "fork two"
    assert skipped == Counter({"no_fork": 1})
    # Quality only (lambda inf): the fork and its own words score the same, so no untagged pair is made.
    pairs, skipped = make_pairs([forked_entry(), plain], math.inf, SpeedReward.theoretical,
                                rejected_side=RejectedSide.both, plain_ids=lambda text, ended: [1] * len(text))
    assert [(p.id, p.chosen.index, p.rejected.index) for p in pairs] == [("a", 0, 3), ("b", 0, 1)]
    assert skipped == Counter({"no_fork": 1, "fork_not_better": 1})
    settings = settings_from_cfg(compose("train", ["stage=pref", "stage.rejected_side=both",
                                                   "stage.pair_length_tolerance=0.2"]).stage)
    assert (settings.rejected_side, settings.pair_length_tolerance) == (RejectedSide.both, 0.2)


def test_make_pairs_skips_ties_and_failed_judging_and_names_the_judge_on_every_score():
    scored = [
        scored_entry("a", [0.2, 0.8], speedups=[2.0, 1.0]),
        scored_entry("b", [0.5, 0.5]),
        scored_entry("c", [0.5, None], status="judge_failed"),
    ]
    pairs, skipped = make_pairs(scored, 4.0, SpeedReward.theoretical)
    assert skipped == Counter({"tie": 1, "judge_failed": 1})
    (pair,) = pairs
    assert (pair.chosen.index, pair.rejected.index) == (1, 0)
    assert pair.chosen.score == pytest.approx(1.0 + 4 * 0.8)
    assert pair.judge == pair.chosen.judge == pair.rejected.judge == "fake:j"
    assert pair.chosen.tokens["main_ids"] == [6]
    pairs, _ = make_pairs(scored[:1], math.inf, SpeedReward.theoretical)
    assert pairs[0].quality_weight == "inf"


def test_the_latency_reward_prefers_the_answer_that_takes_fewer_steps_not_more_tokens_per_step():
    # A writes 100 tokens in 50 steps (theoretical 2.0), B 40 tokens in 30 steps (1.33); the reference has 60.
    entry = scored_entry("a", [0.5, 0.5], speedups=[2.0, 40 / 30])
    entry = dataclasses.replace(entry, reference_num_tokens=60, candidates=[
        dataclasses.replace(entry.candidates[0], num_tokens=100, num_steps=50),
        dataclasses.replace(entry.candidates[1], num_tokens=40, num_steps=30),
    ])
    (by_theoretical,), _ = make_pairs([entry], 1.0, SpeedReward.theoretical)
    assert (by_theoretical.chosen.index, by_theoretical.rejected.index) == (0, 1)
    (by_latency,), _ = make_pairs([entry], 1.0, SpeedReward.latency)
    assert (by_latency.chosen.index, by_latency.rejected.index) == (1, 0)
    assert by_latency.chosen.speed == pytest.approx(60 / 30) and by_latency.chosen.speedup == pytest.approx(40 / 30)
    with pytest.raises(PastaError, match="stage.speed_reward=theoretical"):
        make_pairs([dataclasses.replace(entry, reference_num_tokens=None)], 1.0, SpeedReward.latency)


def test_the_capped_latency_reward_gives_no_credit_for_an_answer_shorter_than_the_reference():
    # The reference has 60 tokens. A: 30 tokens in 30 steps, plain and short (latency 2.0, capped 1.0). B: 60 tokens
    # in 40 steps, a fork as long as the reference (1.5 both ways). C: 120 tokens in 60 steps (1.0 / 1.0).
    entry = scored_entry("a", [0.5, 0.5, 0.5], speedups=[1.0, 1.5, 2.0])
    entry = dataclasses.replace(entry, reference_num_tokens=60, candidates=[
        dataclasses.replace(entry.candidates[0], num_tokens=30, num_steps=30),
        dataclasses.replace(entry.candidates[1], num_tokens=60, num_steps=40),
        dataclasses.replace(entry.candidates[2], num_tokens=120, num_steps=60),
    ])
    (by_latency,), _ = make_pairs([entry], 1.0, SpeedReward.latency)
    assert by_latency.chosen.index == 0 and by_latency.chosen.speed == pytest.approx(2.0)
    (capped,), _ = make_pairs([entry], 1.0, SpeedReward.latency_capped)
    assert (capped.chosen.index, capped.rejected.index) == (1, 0)
    assert capped.chosen.speed == pytest.approx(1.5) and capped.rejected.speed == pytest.approx(1.0)
    with pytest.raises(PastaError, match="stage.speed_reward=latency_capped needs"):
        make_pairs([dataclasses.replace(entry, reference_num_tokens=None)], 1.0, SpeedReward.latency_capped)


def test_a_round_summary_says_whether_its_pairs_teach_forking_and_how_long_each_side_is():
    # Reference: 60 tokens. Prompt a: a short plain answer (30 tokens) beats a long fork (90 tokens in 60 steps) on
    # quality. Prompt b: a fork as long as the reference (60 in 40) beats a plain one (60 in 60) on speed.
    a = scored_entry("a", [0.9, 0.1], speedups=[1.0, 1.5])
    a = dataclasses.replace(a, reference_num_tokens=60, candidates=[
        dataclasses.replace(a.candidates[0], num_tokens=30, num_steps=30),
        dataclasses.replace(a.candidates[1], num_tokens=90, num_steps=60, tokens={**a.candidates[1].tokens,
                                                                                  "body_ids": [[7, 8]]}),
    ])
    b = scored_entry("b", [0.5, 0.5], speedups=[1.5, 1.0])
    b = dataclasses.replace(b, reference_num_tokens=60, candidates=[
        dataclasses.replace(b.candidates[0], num_tokens=60, num_steps=40, tokens={**b.candidates[0].tokens,
                                                                                  "body_ids": [[7]]}),
        dataclasses.replace(b.candidates[1], num_tokens=60, num_steps=60),
    ])
    pairs, skipped = make_pairs([a, b], 1.0, SpeedReward.latency_capped)
    summary = summarize([a, b], pairs, skipped, 1.0, SpeedReward.latency_capped)
    assert (summary["chosen_num_forked"], summary["rejected_num_forked"]) == (1, 1)
    assert summary["chosen_mean_length_ratio"] == pytest.approx((0.5 + 1.0) / 2)
    assert summary["rejected_mean_length_ratio"] == pytest.approx((1.5 + 1.0) / 2)


# --- judging --------------------------------------------------------------------------------------------------


class FlakyJudge:
    """Fails (None) on the items listed in `fail_first` the first `fails` times it sees them."""

    name = "fake:flaky"

    def __init__(self, fails: int):
        self.fails = fails
        self.calls = 0

    def score(self, items):
        self.calls += 1
        return [
            None if self.calls <= self.fails and "bad" in item.candidate else len(item.candidate) / 100
            for item in items
        ]


def test_judge_failures_are_retried_then_left_as_none_never_zero():
    from pasta.judges import JudgeItem

    items = [JudgeItem("q", "good answer"), JudgeItem("q", "bad answer")]
    assert judge_with_retries(FlakyJudge(fails=1), items, retries=2) == [0.11, 0.10]
    judge = FlakyJudge(fails=10)
    assert judge_with_retries(judge, items, retries=2) == [0.11, None]
    assert judge.calls == 3


# --- the BoNBoN loss on the layout ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tagged(tiny_model_and_tokenizer):
    model, tokenizer = (copy.deepcopy(x) for x in tiny_model_and_tokenizer)
    add_tag_tokens(tokenizer, model)
    return model, tokenizer


def pref_cfg(tmp_path, *overrides):
    return compose(
        "train",
        [
            "stage=pref",
            "device=cpu",
            f"output_dir={tmp_path}",
            "stage.logging_steps=1",
            "stage.max_length=160",
            "stage.save_steps=100",
            *overrides,
        ],
    )


def test_trainer_loss_is_alpha_sft_plus_one_minus_alpha_ipo_on_layout_log_probs(tagged, tmp_path, monkeypatch):
    from datasets import Dataset
    from trl import DPOConfig
    from trl.trainer import dpo_trainer

    from pasta.decoding import teacher_forced_logprobs
    from pasta.training.collator import PairCollator
    from pasta.training.pref import pair_examples
    from pasta.training.trainers import LayoutDPOTrainer

    model, tokenizer = tagged
    model = copy.deepcopy(model)
    policy = ReservationPolicy()
    tag_ids = add_tag_tokens(tokenizer)
    alpha, beta = 0.3, 0.25
    pairs = hand_pairs(tokenizer)
    examples = pair_examples(pairs)
    collator = PairCollator(tag_ids=tag_ids, pad_id=tokenizer.pad_token_id, policy=policy, max_length=4096)
    args = DPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        remove_unused_columns=False,
        loss_type=["sft", "ipo"],
        loss_weights=[alpha, 1 - alpha],
        beta=beta,
        max_length=None,
    )
    asked = []
    trl_head = dpo_trainer.add_fused_lm_head
    monkeypatch.setattr(dpo_trainer, "add_fused_lm_head", lambda model, **kwargs: asked.append(
        kwargs.get("outputs", ("log_probs",))) or trl_head(model, **kwargs))
    trainer = LayoutDPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=args,
        data_collator=collator,
        train_dataset=Dataset.from_list(examples),
        processing_class=tokenizer,
    )
    # the CPU heads (policy, reference) compute the fields TRL asked its heads for
    assert asked == [trainer.lm_head_outputs(), ("log_probs",)]
    batch = collator(examples)
    model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, dict(batch))
        inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}
        logprobs = sequence_logprobs(model(**inputs).logits, batch["shift_labels"])  # [2B, S]
    chosen_targets = batch["shift_labels"][: len(pairs)]
    sft = -logprobs[: len(pairs)].sum() / (chosen_targets != IGNORE_INDEX).sum()
    # The policy is its own reference at the start: every log-ratio is 0, so IPO is (0 - 1/(2 beta))^2.
    torch.testing.assert_close(loss, alpha * sft + (1 - alpha) * (1 / (2 * beta)) ** 2)
    # The sequence log-probs the trainer uses are the decoder's teacher-forced ones for the same answer.
    assert trainer._metrics["eval"]["logps/chosen"][-1] == pytest.approx(
        logprobs[: len(pairs)].sum(1).mean().item(), rel=1e-5
    )
    small = Record("Two tips?", "", annotated=SMALL_ANNOTATED)
    (example,), _ = build_sft_examples(
        [small], tokenizer, strip_annotations=False, max_length=4096, too_long="skip"
    )
    single = collator(
        [{"prompt": {"prompt_ids": example["prompt_ids"]}, "chosen": example, "rejected": example}]
    )
    with torch.no_grad():
        inputs = {k: single[k][:1] for k in ("input_ids", "position_ids", "attention_mask")}
        expected = sequence_logprobs(model(**inputs).logits, single["shift_labels"][:1]).sum()
    forced, _ = teacher_forced_logprobs(
        model, tokenizer, example["prompt_ids"], token_doc_of(example, tag_ids), policy
    )
    assert forced.total().item() == pytest.approx(expected.item(), rel=1e-4)


def test_a_few_pref_steps_change_the_weights_and_lower_the_loss_on_a_repeated_pair_batch(tagged, tmp_path):
    model, tokenizer = tagged
    model = copy.deepcopy(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = pref_cfg(
        tmp_path,
        "stage.finetune=full",
        "stage.per_device_train_batch_size=2",
        "stage.max_steps=6",
        "stage.learning_rate=2e-3",
        "stage.max_length=96",
    )
    settings = settings_from_cfg(cfg.stage)
    metrics = train_round(
        model,
        tokenizer,
        hand_pairs(tokenizer),
        settings,
        cfg,
        tmp_path / "round-1",
        ReservationPolicy(),
        resume=False,
    )
    losses = metrics["loss_history"]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5
    final = load_file(tmp_path / "round-1" / "final" / "model.safetensors")
    changed = [
        name for name, value in final.items() if name in start and not torch.allclose(value, start[name])
    ]
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.embed_tokens.weight" in changed


def test_pairs_longer_than_max_length_are_cut_and_counted_or_skipped_as_sft_examples_are(tagged):
    from pasta.training.config import TooLong
    from pasta.training.pref import fit_pairs, pair_rows

    _, tokenizer = tagged
    pairs = hand_pairs(tokenizer)
    rows = sorted(pair_rows(p) for p in pairs)
    assert fit_pairs(pairs, rows[-1], TooLong.truncate) == (pairs, 0, 0)
    shorter = [p for p in pairs if pair_rows(p) == rows[0]]
    assert fit_pairs(pairs, rows[0], TooLong.truncate) == (pairs, 0, 1)
    assert fit_pairs(pairs, rows[0], TooLong.skip) == (shorter, 1, 0)
    # A prompt that fills max_length alone leaves no answer token to train on: skipped either way.
    shortest_prompt = min(len(p.prompt_ids) for p in pairs)
    assert fit_pairs(pairs, shortest_prompt, TooLong.truncate) == ([], 2, 0)


def test_a_full_round_trains_float32_weights_whatever_the_dtype_it_sampled_in(tagged, tmp_path):
    """On a GPU the round's policy is loaded in bfloat16 to sample; full finetuning trains float32 weights, or
    steps this small round away."""
    model, tokenizer = tagged
    policy = copy.deepcopy(model).to(torch.bfloat16)
    cfg = pref_cfg(tmp_path, "stage.finetune=full", "stage.per_device_train_batch_size=1", "stage.max_steps=1",
                   "stage.learning_rate=1e-5", "stage.max_length=96")
    train_round(policy, tokenizer, hand_pairs(tokenizer, num_pairs=1), settings_from_cfg(cfg.stage), cfg,
                tmp_path / "round-1", ReservationPolicy(), resume=False)
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    start = {name: value.float() for name, value in model.state_dict().items()}
    final = load_file(tmp_path / "round-1" / "final" / "model.safetensors")
    assert final["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32
    assert not torch.equal(final["model.layers.0.self_attn.q_proj.weight"],
                           start["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16).float())


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_the_reference_scored_once_gives_the_losses_of_a_reference_forward_on_every_step(tagged, tmp_path, finetune):
    from pasta.training.pref import pair_examples

    model, tokenizer = tagged
    pairs = hand_pairs(tokenizer)[::-1]  # longest first: the reference pass scores them in the other order
    assert [e["length"] for e in pair_examples(pairs)] == sorted((e["length"] for e in pair_examples(pairs)), reverse=True)
    runs = {}
    for precompute in (True, False):
        cfg = pref_cfg(tmp_path / str(precompute), f"stage.finetune={finetune}", f"stage.precompute_ref_log_probs={precompute}",
                       "stage.per_device_train_batch_size=1", "stage.num_train_epochs=2", "stage.learning_rate=2e-3",
                       "stage.max_length=96", "stage.merge_lora=false")  # fmt: skip
        policy = copy.deepcopy(model)
        forwards = []
        policy.model.norm.register_forward_hook(lambda *_, seen=forwards: seen.append(1))  # full: the reference's copy too
        metrics = train_round(policy, tokenizer, pairs, settings_from_cfg(cfg.stage), cfg,
                              tmp_path / str(precompute) / "round-1", ReservationPolicy(), resume=False)  # fmt: skip
        runs[precompute] = (metrics["loss_history"], metrics["margin_history"], len(forwards))
    (losses, margins, num_forwards), (step_losses, step_margins, step_forwards) = runs[True], runs[False]
    assert len(losses) == 4 and max(margins) > 0.01  # 2 pairs x 2 epochs, and the policy moved off its reference
    assert losses == pytest.approx(step_losses, rel=1e-4) and margins == pytest.approx(step_margins, abs=1e-3)
    # 4 policy steps, and the reference's forwards: the 2 pairs once, against once per step
    assert (num_forwards, step_forwards) == (4 + 2, 4 + 4)
    if finetune == "lora":  # stage.merge_lora=false: the round's adapter loads onto the base the round saved
        from pasta.models import load_model

        final = tmp_path / "True" / "round-1" / "final"
        loaded, _ = load_model({"name": "adapter", "path": str(final)})
        assert (final.parent / "base" / "config.json").is_file()
        assert loaded.get_input_embeddings().weight.shape == model.get_input_embeddings().weight.shape
        # and a resumed run takes the round as finished, as it does a merged model
        from pasta.training.rounds import ROUND_METRICS, finished_round_metrics

        metrics = {"round": 1, "mean_score": 0.5, "mean_score_margin": 0.1, "train": {}}
        (final.parent / ROUND_METRICS).write_text(json.dumps(metrics))
        assert finished_round_metrics(final.parent, 1) == metrics


# --- whole rounds ---------------------------------------------------------------------------------------------


class LengthJudge:
    """Deterministic stand-in for a quality judge: longer plain text scores higher."""

    name = "fake:length"

    def score(self, items):
        return [min(1.0, len(item.candidate) / 200) for item in items]


@pytest.fixture
def sft_folder(tagged, tmp_path) -> Path:
    model, tokenizer = tagged
    folder = tmp_path / "sft-final"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def rounds_cfg(tmp_path, sft_folder, *overrides):
    return pref_cfg(
        tmp_path / "pref",
        f"model.path={sft_folder}",
        f"data.path={ANNOTATED}",
        "stage.rounds=2",
        "stage.prompts_per_round=3",
        "stage.num_samples=3",
        "stage.max_new_tokens=12",
        "stage.per_device_train_batch_size=2",
        "stage.max_steps=2",
        "stage.sample_batch_size=2",
        "stage.learning_rate=1e-3",
        *overrides,
    )


def test_rounds_write_scores_pairs_metrics_and_chain_their_policies(sft_folder, tmp_path, monkeypatch):
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    final = run_pref(rounds_cfg(tmp_path, sft_folder))
    out = tmp_path / "pref"
    assert final == out / "round-2" / "final" and (final / "config.json").is_file()
    for r in (1, 2):
        scores = read_jsonl(out / f"round-{r}" / "scores.jsonl")
        assert len(scores) == 3 and all(len(e["candidates"]) == 3 for e in scores)
        assert all(
            c["judge"] == "fake:length" and c["quality"] is not None for e in scores for c in e["candidates"]
        )
        metrics = json.loads((out / f"round-{r}" / "metrics.json").read_text())
        pairs = read_jsonl(out / f"round-{r}" / "pairs.jsonl")
        assert metrics["num_pairs"] == len(pairs) > 0 and metrics["judge"] == "fake:length"
        assert metrics["num_pairs"] + sum(metrics["skipped"].values()) == 3
        assert metrics["num_pairs_cut"] <= metrics["num_pairs"]  # longer than stage.max_length, trained cut
        assert metrics["mean_speedup"] >= 1.0 and metrics["train"]["train_loss"] > 0
    round_2 = json.loads((out / "round-2" / "metrics.json").read_text())
    assert round_2["policy"] == str(out / "round-1" / "final")
    # The prompt window moves on: round 2 samples the next three prompts.
    ids_1 = [e["id"] for e in read_jsonl(out / "round-1" / "scores.jsonl")]
    ids_2 = [e["id"] for e in read_jsonl(out / "round-2" / "scores.jsonl")]
    assert not set(ids_1) & set(ids_2)
    info = json.loads((out / "train_info.json").read_text())
    assert info["status"] == "done" and len(info["rounds"]) == 2


def test_a_crashed_round_resumes_without_redoing_finished_work(sft_folder, tmp_path, monkeypatch):
    from pasta.training import pref

    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    cfg = rounds_cfg(tmp_path, sft_folder)
    original_train = pref.train_round
    with monkeypatch.context() as patch:

        def crash_in_round_2(model, tokenizer, pairs, settings, cfg, round_dir, *args, **kwargs):
            if round_dir.name == "round-2":
                raise KeyboardInterrupt
            return original_train(model, tokenizer, pairs, settings, cfg, round_dir, *args, **kwargs)

        patch.setattr(pref, "train_round", crash_in_round_2)
        with pytest.raises(KeyboardInterrupt):
            run_pref(cfg)
    out = tmp_path / "pref"
    round_1_scores = (out / "round-1" / "scores.jsonl").read_text()
    round_2_scores = (out / "round-2" / "scores.jsonl").read_text()
    with pytest.raises(PastaError, match="resume=true"):
        run_pref(cfg)

    sampled = []
    original_sample = pref.sample_and_score

    def counting(model, tokenizer, prompts, *args, **kwargs):
        sampled.append(len(prompts))
        return original_sample(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(pref, "sample_and_score", counting)
    final = run_pref(rounds_cfg(tmp_path, sft_folder, "resume=true"))
    assert sampled == [3], "round 1 is not redone; round 2 reads back its scored prompts"
    assert (out / "round-1" / "scores.jsonl").read_text() == round_1_scores
    assert (out / "round-2" / "scores.jsonl").read_text() == round_2_scores
    assert (final / "config.json").is_file()


def test_a_resume_redoes_a_round_whose_metrics_do_not_read_back(sft_folder, tmp_path, monkeypatch):
    """Issue 36: a torn round-1/metrics.json is written again from what the round kept; nothing is sampled again."""
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    run_pref(rounds_cfg(tmp_path, sft_folder, "stage.rounds=1"))
    round_dir = tmp_path / "pref" / "round-1"
    written = json.loads((round_dir / "metrics.json").read_text())
    scores = (round_dir / "scores.jsonl").read_text()
    (round_dir / "metrics.json").write_text("{bad")
    decoded = []
    monkeypatch.setattr("pasta.decoding.decode_async", lambda *args, **kwargs: decoded.append(1))
    final = run_pref(rounds_cfg(tmp_path, sft_folder, "stage.rounds=1", "resume=true"))
    redone = json.loads((round_dir / "metrics.json").read_text())
    assert final == round_dir / "final" and (final / "config.json").is_file()
    assert (round_dir / "scores.jsonl").read_text() == scores and not decoded
    for key in ("round", "judge", "num_pairs", "mean_score", "mean_score_margin", "skipped"):
        assert redone[key] == written[key], key
    info = json.loads((tmp_path / "pref" / "train_info.json").read_text())
    assert info["status"] == "done" and info["rounds"][0]["num_pairs"] == written["num_pairs"]
    # Resumed from other weights, the round's candidates would be another policy's: refused, nothing touched.
    with pytest.raises(PastaError, match=f"started from model {sft_folder}, this run asks {final}"):
        run_pref(rounds_cfg(tmp_path, final, "stage.rounds=1", "resume=true"))
    assert (round_dir / "scores.jsonl").read_text() == scores
    assert json.loads((tmp_path / "pref" / "train_info.json").read_text()) == info


def test_a_resume_over_a_round_whose_final_weights_are_cut_short_is_one_line(sft_folder, tmp_path, monkeypatch):
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    run_pref(rounds_cfg(tmp_path, sft_folder, "stage.rounds=1"))
    weights = tmp_path / "pref" / "round-1" / "final" / "model.safetensors"
    os.truncate(weights, 1000)
    with pytest.raises(PastaError) as info:
        run_pref(rounds_cfg(tmp_path, sft_folder, "stage.rounds=2", "resume=true"))
    assert str(info.value).startswith(f"round 1: {weights} is incomplete (")


def test_a_run_pairs_another_runs_saved_candidates_again_from_its_policy_without_sampling(
    sft_folder, tmp_path, monkeypatch
):
    """stage.candidates_from + stage.keep_rounds: round 2 of a finished run again, paired under other settings from
    that run's round-1 policy and its round-2 candidates; nothing is sampled and the source run is left as it was."""
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    run_pref(rounds_cfg(tmp_path, sft_folder))
    source = tmp_path / "pref"
    saved = {path: path.read_bytes() for path in source.rglob("*") if path.is_file()}
    decoded = []
    monkeypatch.setattr("pasta.decoding.decode_async", lambda *args, **kwargs: decoded.append(1))
    again = [f"stage.candidates_from={source}", "stage.keep_rounds=1", "stage.quality_weight=inf"]

    final = run_pref(rounds_cfg(tmp_path / "again", sft_folder, *again))
    out = tmp_path / "again" / "pref"
    assert final == out / "round-2" / "final" and (final / "config.json").is_file() and not decoded
    assert (out / "round-1" / "final" / "model.safetensors").samefile(source / "round-1" / "final" / "model.safetensors")
    assert not (out / "round-1" / "checkpoints").exists()
    assert (out / "round-2" / "scores.jsonl").read_bytes() == saved[source / "round-2" / "scores.jsonl"]
    metrics = json.loads((out / "round-2" / "metrics.json").read_text())
    assert metrics["policy"] == str(out / "round-1" / "final") and metrics["quality_weight"] == "inf"
    assert json.loads(saved[source / "round-2" / "metrics.json"])["quality_weight"] == 1.0
    trained, start = load_file(final / "model.safetensors"), load_file(out / "round-1" / "final" / "model.safetensors")
    assert any(not torch.equal(trained[name], start[name]) for name in start), "round 2 trained from round 1's policy"
    assert {path: path.read_bytes() for path in source.rglob("*") if path.is_file()} == saved
    # A resumed run takes nothing again and trains nothing again.
    from pasta.training import pref

    monkeypatch.setattr(pref, "train_round", lambda *args, **kwargs: pytest.fail("a finished round trained again"))
    assert run_pref(rounds_cfg(tmp_path / "again", sft_folder, *again, "resume=true")) == final and not decoded

    other_model = source / "round-1" / "final"
    for model, overrides, message in (
        (sft_folder, [f"stage.candidates_from={tmp_path / 'none'}"], "no such folder"),
        (other_model, [f"stage.candidates_from={source}"],
         f"started from model {sft_folder}, this run from {other_model} \\(model.path\\)"),
        (sft_folder, [f"stage.candidates_from={source}", "stage.keep_rounds=2", "stage.rounds=3"],
         "round-3/scores.jsonl is missing: that run saved no candidates for round 3"),
        (sft_folder, [f"stage.candidates_from={out / 'round-1'}"], "not a preference run's output_dir"),
    ):
        with pytest.raises(PastaError, match=message):
            run_pref(rounds_cfg(tmp_path / "refused", model, *overrides))
        assert not any((tmp_path / "refused" / "pref").glob("*"))


class ShortJudge(LengthJudge):
    """Another judge than LengthJudge: shorter plain text scores higher."""

    name = "fake:short"

    def score(self, items):
        return [1.0 - quality for quality in super().score(items)]


def test_the_held_out_check_counts_its_prompts_that_a_round_samples_too(tmp_path):
    from pasta.parallel import Processes
    from pasta.training.heldout import HeldoutCheck, heldout_records

    check_file = tmp_path / "check.jsonl"
    check_file.write_text("".join(json.dumps({"instruction": i, "output": "Yes."}) + "\n"
                                  for i in ("Name a colour.", "Name a fruit.")), encoding="utf-8")
    cfg = compose("train", ["stage=pref", f"stage.heldout_path={check_file}", "stage.heldout_limit=2"])
    check = HeldoutCheck(cfg, settings_from_cfg(cfg.stage), heldout_records(str(check_file), 2, 0), judge=None,
                         policy=None, processes=Processes())
    assert check.num_sampled([Record("name a  COLOUR.", "Red."), Record("Name a colour twice.", "Red.")]) == 1
    assert check.num_sampled([Record("Name a fruit.", "Pear.", input="A red one.")]) == 0


def test_a_held_out_check_file_that_is_not_there_stops_the_stage_before_it_reads_its_data(tmp_path, monkeypatch):
    """Named by its key, at the start: it failed after Baseline-SFT's references were decoded (minutes), naming
    data.path."""
    import pasta.training.pref as pref

    def read_data(*args, **kwargs):
        raise AssertionError("the training data was read before the check file was")

    monkeypatch.setattr(pref, "load_training_records", read_data)
    for path in (tmp_path / "absent.jsonl", tmp_path):
        with pytest.raises(PastaError, match=rf"^stage\.heldout_path={path}: no such file"):
            run_pref(pref_cfg(tmp_path / "run", "model=tiny", f"data.path={ANNOTATED}", f"stage.heldout_path={path}"))
    assert not (tmp_path / "run").exists()


def test_another_runs_candidates_are_judged_again_by_this_runs_judge_without_sampling(sft_folder, tmp_path, monkeypatch):
    """stage.candidates_from with another judge: the same candidates, this run's judge's scores on each (the pairs
    follow them), and the starting policy's held-out check taken and judged again, never read back with the other
    judge's scores; the source run is left as it was, and a resume judges nothing again."""
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: LengthJudge())
    heldout = [f"stage.heldout_path={ANNOTATED}", "stage.heldout_limit=1"]
    run_pref(rounds_cfg(tmp_path, sft_folder, "stage.rounds=1", *heldout))
    source = tmp_path / "pref"
    saved = {path: path.read_bytes() for path in source.rglob("*") if path.is_file()}
    decoded, judged = [], []
    monkeypatch.setattr("pasta.decoding.decode_async", lambda *args, **kwargs: decoded.append(1))

    class CountingShortJudge(ShortJudge):
        def score(self, items):
            judged.extend(items)
            return super().score(items)

    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: CountingShortJudge())
    again = ["stage.rounds=1", f"stage.candidates_from={source}", *heldout]
    run_pref(rounds_cfg(tmp_path / "again", sft_folder, *again))
    before = read_jsonl(source / "round-1" / "scores.jsonl")
    after = read_jsonl(tmp_path / "again" / "pref" / "round-1" / "scores.jsonl")
    # 9 candidates, the starting policy's held-out answer judged again, the trained policy's new one
    assert not decoded and len(judged) == sum(len(entry["candidates"]) for entry in before) + 2 == 11
    checks = [json.loads((run / "round-0" / "heldout.json").read_text()) for run in (source, tmp_path / "again" / "pref")]
    assert [check["judge"] for check in checks] == ["fake:length", "fake:short"]
    assert checks[1]["quality_proxy"] == pytest.approx(1.0 - checks[0]["quality_proxy"])
    assert [[c["text"] for c in e["candidates"]] for e in after] == [[c["text"] for c in e["candidates"]] for e in before]
    for entry_before, entry_after in zip(before, after, strict=True):
        assert entry_after["judge"] == "fake:short" and entry_after["sampling"] == entry_before["sampling"]
        for c_before, c_after in zip(entry_before["candidates"], entry_after["candidates"], strict=True):
            assert c_after["judge"] == "fake:short" and c_after["quality"] == pytest.approx(1.0 - c_before["quality"])
    pairs = read_jsonl(tmp_path / "again" / "pref" / "round-1" / "pairs.jsonl")
    assert pairs and all(p["chosen"]["judge"] == "fake:short" for p in pairs)
    assert {path: path.read_bytes() for path in source.rglob("*") if path.is_file()} == saved
    judged.clear()
    run_pref(rounds_cfg(tmp_path / "again", sft_folder, *again, "resume=true"))
    assert not judged and not decoded


def test_keep_rounds_needs_a_run_to_keep_them_from_and_a_round_left_to_pair():
    for overrides, message in (
        (["stage.keep_rounds=1"], "above 0 only with stage.candidates_from"),
        (["stage.candidates_from=/runs/a", "stage.keep_rounds=2", "stage.rounds=2"],
         "raise stage.rounds to at least 3"),
        (["stage.candidates_from=/runs/a", "stage.keep_rounds=-1"], "must be >= 0"),
    ):
        with pytest.raises(PastaError, match=message):
            settings_from_cfg(compose("train", ["stage=pref", *overrides]).stage)


def test_a_baseline_model_that_does_not_load_is_named_by_its_setting(sft_folder, tmp_path, tiny_model_and_tokenizer):
    from pasta.training import sampling

    records = [Record.from_dict(r) for r in read_jsonl(ANNOTATED)[:1]]
    cut = cut_checkpoint(*tiny_model_and_tokenizer, tmp_path / "cut", 0)
    for folder, says in ((tmp_path / "nowhere", " is not a folder"),
                         (cut, f": {cut / 'model.safetensors'} is incomplete (0 bytes)")):
        cfg = rounds_cfg(tmp_path, sft_folder, "stage.reference=baseline", f"stage.baseline_model={folder}")
        out = tmp_path / f"refs-{folder.name}"
        out.mkdir()
        with pytest.raises(PastaError) as info:
            sampling.reference_answers(records, Reference.baseline, settings_from_cfg(cfg.stage), cfg, out)
        assert str(info.value).startswith(f"stage.baseline_model={folder}{says}")


class DownJudge:
    """A judge whose endpoint is down: it never scores anything."""

    name = "fake:down"

    def score(self, items):
        return [None] * len(items)


def test_a_round_whose_judge_fails_on_every_prompt_stops_with_one_error_and_keeps_its_samples(
    sft_folder, tmp_path, monkeypatch
):
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: DownJudge())
    with pytest.raises(PastaError, match=r"round 1: no pairs from 3 prompts \(\{'judge_failed': 3\}\)"):
        run_pref(rounds_cfg(tmp_path, sft_folder, "stage.judge_retries=1"))
    round_dir = tmp_path / "pref" / "round-1"
    scores = read_jsonl(round_dir / "scores.jsonl")
    assert [e["status"] for e in scores] == ["judge_failed"] * 3
    candidates = [c for e in scores for c in e["candidates"]]
    assert len(candidates) == 9 and all(c["quality"] is None and c["num_tokens"] > 0 for c in candidates)
    assert not (round_dir / "final").exists() and not (round_dir / "metrics.json").exists()


def test_baseline_reference_is_decoded_once_and_reused(sft_folder, tmp_path, monkeypatch):
    from pasta.training import sampling

    cfg = rounds_cfg(tmp_path, sft_folder, "stage.reference=baseline", f"stage.baseline_model={sft_folder}")
    settings = settings_from_cfg(cfg.stage)
    records = [Record.from_dict(r) for r in read_jsonl(ANNOTATED)[:3]]
    out = tmp_path / "refs"
    out.mkdir()
    answers = sampling.reference_answers(records, Reference.baseline, settings, cfg, out)
    assert sorted(answers) == sorted(r.id for r in records)
    assert all(isinstance(text, str) for text in answers.values())
    assert len(read_jsonl(out / "baseline_answers.jsonl")) == 3

    def no_model(*args, **kwargs):
        raise AssertionError("the baseline is decoded once")

    monkeypatch.setattr(sampling, "load_model", no_model)
    assert sampling.reference_answers(records, Reference.baseline, settings, cfg, out) == answers


def test_the_judge_reads_the_record_s_answer_while_the_speed_reward_times_against_baseline_sft(
    sft_folder, tmp_path, tiny_model_and_tokenizer
):
    from pasta.training import sampling

    cfg = rounds_cfg(tmp_path, sft_folder, "stage.speed_reference=baseline", f"stage.baseline_model={sft_folder}")
    settings = settings_from_cfg(cfg.stage)
    records = [Record.from_dict(r) for r in read_jsonl(ANNOTATED)[:2]]
    out = tmp_path / "refs"
    out.mkdir()
    references = sampling.round_references(records, settings, cfg, out)
    assert references.quality == {r.id: r.output for r in records}
    assert references.speed == {a["id"]: a["text"] for a in read_jsonl(out / "baseline_answers.jsonl")}
    # The scored prompt keeps the judge's reference and counts the speed reference's tokens.
    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    record = records[0]
    split = sampling.References(quality={record.id: "short"}, speed={record.id: "a much longer answer than that"})
    (scored,) = sampling.sample_and_score(model, tokenizer, [record], split, ConstantJudge(), settings,
                                          ReservationPolicy(), tmp_path / "scores.jsonl", seed=0)
    assert scored.reference == "short"
    assert scored.reference_num_tokens == len(encode_text(tokenizer, "a much longer answer than that")) + 1
    with pytest.raises(PastaError, match="stage.speed_reference=baseline needs stage.baseline_model="):
        settings_from_cfg(rounds_cfg(tmp_path, sft_folder, "stage.speed_reference=baseline").stage)


def test_a_resumed_round_refuses_candidates_scored_under_other_settings_and_keeps_them(
    tiny_model_and_tokenizer, tmp_path
):
    """A round's saved candidates are reused only under the settings that drew and scored them: another judge,
    reference answer, speed reference or sampling setting is one error naming it, and the file is left as it was.
    The pairing settings (lambda, speed reward) may differ: the study shares one round's candidates across lambdas."""
    from pasta.training import sampling

    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    record = Record.from_dict({"instruction": "Name a colour", "input": "", "output": "red"})
    path = tmp_path / "scores.jsonl"

    def sample(*overrides, quality="red", speed="red", judge=None):
        settings = settings_from_cfg(pref_cfg(tmp_path, "stage.num_samples=2", "stage.max_new_tokens=8",
                                              *overrides).stage)
        references = sampling.References(quality={record.id: quality}, speed={record.id: speed})
        return sampling.sample_and_score(model, tokenizer, [record], references, judge or ConstantJudge(),
                                         settings, ReservationPolicy(), path, seed=0)

    (first,) = sample()
    saved = path.read_text()
    assert first.sampling["num_samples"] == 2 and first.sampling["max_new_tokens"] == 8
    assert sample("stage.quality_weight=inf", "stage.speed_reward=theoretical") == [first]
    for kwargs, overrides, setting in (
        ({}, ("stage.temperature=0.5",), r"sampled with stage.temperature=1.0, this run asks 0.5"),
        ({}, ("stage.max_new_tokens=9",), r"sampled with stage.max_new_tokens=8, this run asks 9"),
        ({"judge": LengthJudge()}, (), r"judged by fake:constant, this run's judge is fake:length"),
        ({"quality": "blue"}, (), r"judged against another reference answer of prompt .* \(stage.reference\)"),
        ({"speed": "a much longer answer than red"}, (), r"timed against a .*\(stage.speed_reference\)"),
    ):
        with pytest.raises(PastaError, match=f"holds candidates {setting}"):
            sample(*overrides, **kwargs)
        assert path.read_text() == saved
    # A decoder default the stage does not set (here the free tag allowance of candidates drawn before it existed)
    # counts as well: the saved record says what decoded it.
    drawn_before = json.loads(saved) | {"sampling": first.sampling | {
        "decoding": first.sampling["decoding"] | {"free_tag_tokens": 0}}}
    path.write_text(json.dumps(drawn_before) + "\n")
    with pytest.raises(PastaError, match="holds candidates sampled with decode.free_tag_tokens=0, this run asks 64"):
        sample()
    assert json.loads(path.read_text()) == drawn_before


def test_the_candidates_are_sampled_with_the_stage_repetition_guard(tiny_model_and_tokenizer, tmp_path):
    """stage.no_repeat_ngram_size reaches the candidates' decoder: a model scripted to loop ("red green blue red
    ...") samples looping candidates without it and none that repeats a 3-gram with it."""
    from pasta.models import encode_prompt
    from pasta.training import sampling

    record = Record.from_dict({"instruction": "Say it again", "input": "", "output": "red"})
    prompt_ids = encode_prompt(tiny_model_and_tokenizer[1], record.instruction)
    looping, tokenizer, (a, b, c) = looping_model(tiny_model_and_tokenizer[1], prompt_ids[-1])

    def candidates(n: int) -> list[list[int]]:
        settings = settings_from_cfg(pref_cfg(tmp_path, "stage.num_samples=2", "stage.max_new_tokens=20",
                                              f"stage.no_repeat_ngram_size={n}").stage)
        references = sampling.References(quality={record.id: "red"}, speed={record.id: "red"})
        scored = sampling.sample_and_score(looping, tokenizer, [record], references, ConstantJudge(), settings,
                                           ReservationPolicy(), tmp_path / f"scores-{n}.jsonl", seed=0)
        return [cand.tokens["main_ids"] for cand in scored[0].candidates]

    assert all(ids[:6] == [a, b, c, a, b, c] for ids in candidates(0))
    for ids in candidates(3):
        trigrams = [tuple(ids[i : i + 3]) for i in range(len(ids) - 2)]
        assert ids[:3] == [a, b, c] and len(set(trigrams)) == len(trigrams)
    with pytest.raises(PastaError, match=r"stage.no_repeat_ngram_size: must be >= 0 \(0 = off\), got -1"):
        settings_from_cfg(pref_cfg(tmp_path, "stage.no_repeat_ngram_size=-1").stage)


def test_candidates_sampled_with_the_skeleton_draft_score_the_steps_it_saves(tiny_model_and_tokenizer, tmp_path):
    """stage.draft_skeleton reaches the candidates' decoder: a model scripted to write a numbered promise list samples
    the same candidate either way, in fewer steps with the draft, so its speed reward counts those steps; the saved
    candidates record it, and a resume under the other setting is refused."""
    from pasta.training import sampling

    tokenizer, _, main, scripted = scripted_list(*lively_model(tiny_model_and_tokenizer[1]))
    record = Record.from_dict({"instruction": "List some food.", "input": "", "output": "food"})
    references = sampling.References(quality={record.id: "food"}, speed={record.id: "apples and bread " * 20})

    def candidate(draft: bool, path: Path) -> Candidate:
        settings = settings_from_cfg(pref_cfg(tmp_path, "stage.num_samples=2", "stage.max_new_tokens=64",
                                              f"stage.draft_skeleton={draft}").stage)
        scored = sampling.sample_and_score(scripted(), tokenizer, [record], references, ConstantJudge(), settings,
                                           ReservationPolicy(), path, seed=0)
        return scored[0].candidates[0]

    plain, drafted = candidate(False, tmp_path / "plain.jsonl"), candidate(True, tmp_path / "drafted.jsonl")
    assert plain.tokens["main_ids"] == drafted.tokens["main_ids"] == main
    assert drafted.num_steps < plain.num_steps and drafted.speedup > plain.speedup
    with pytest.raises(PastaError, match="sampled with decode.draft_skeleton=True, this run asks False"):
        candidate(False, tmp_path / "drafted.jsonl")


# --- the stage optimises its reward ---------------------------------------------------------------------------


TIPS_ANNOTATED = (
    'Tips: <promise topic="water"/><promise topic="sleep"/><async topic="water">Drink water.</async>'
    '<async topic="sleep">Sleep well.</async><sync/> Done.'
)


@pytest.fixture
def sometimes_forking(tagged, tmp_path) -> tuple[Path, Path]:
    """A tiny model taught one prompt answered once with promises and twice without (a data file of the three),
    so its greedy answer is plain while about one sample in five forks: what a speed reward can act on."""
    from pasta.lang import parse, plain_text
    from pasta.training.collator import LayoutCollator

    model, tokenizer = tagged
    model = copy.deepcopy(model)
    plain = plain_text(parse(TIPS_ANNOTATED))
    records = [
        {"instruction": "Two tips?", "input": "", "output": plain, "annotated": answer}
        for answer in (TIPS_ANNOTATED, plain, plain)
    ]
    data = tmp_path / "tips.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    examples, _ = build_sft_examples(
        list(map(Record.from_dict, records)), tokenizer, strip_annotations=False, max_length=256, too_long="skip"
    )
    collator = LayoutCollator(
        tag_ids=add_tag_tokens(tokenizer), pad_id=tokenizer.pad_token_id, policy=ReservationPolicy(), max_length=256
    )
    batch = collator(examples)
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}
    # A plain loop rather than the SFT stage: the fixture needs the model in this state, quickly (the stage's
    # own tests cover the stage).
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    model.train()
    for _ in range(80):
        logits = model(**inputs).logits  # [B, S, V]
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["shift_labels"].flatten(), ignore_index=IGNORE_INDEX
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder = tmp_path / "sometimes-forking"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, data


class ConstantJudge:
    name = "fake:constant"

    def score(self, items):
        return [0.5] * len(items)


def num_text_tokens(candidate: dict, tokenizer) -> int:
    """A candidate's sampled tokens that spend its budget, by the evaluation's split of an answer's tokens: the text
    of every thread, and eos."""
    tokens = answer_tokens(parse(candidate["annotated"]), token_doc_of(candidate["tokens"], TagIds.from_tokenizer(
        tokenizer)), tokenizer.eos_token_id)
    return tokens.num_main_text + tokens.num_chunk_text + tokens.num_eos


@pytest.mark.slow
def test_a_speed_only_round_makes_the_greedy_answer_fork(sometimes_forking, tmp_path, monkeypatch):
    # lambda = 0, a constant judge and speed_reward=theoretical: the reward is the theoretical speedup alone, so
    # the round's chosen answer is a (well-formed, constrained) fork faster than the rejected one, and the held-out
    # check must see the greedy answer
    # of the trained policy fork where the starting policy's did not: the reward went up, not only the weights.
    folder, data = sometimes_forking
    monkeypatch.setattr("pasta.judges.build_judge", lambda cfg: ConstantJudge())
    cfg = pref_cfg(
        tmp_path / "pref",
        f"model.path={folder}",
        "model.random_init=null",
        f"data.path={data}",
        f"stage.heldout_path={data}",
        "stage.heldout_limit=1",
        "stage.quality_weight=0",
        "stage.speed_reward=theoretical",
        "stage.prompts_per_round=1",
        "stage.num_samples=16",
        "stage.max_new_tokens=40",
        "stage.finetune=full",
        "stage.per_device_train_batch_size=1",
        "stage.max_steps=12",
        "stage.learning_rate=1e-3",
    )
    run_pref(cfg)
    out = tmp_path / "pref"
    (pair,) = read_jsonl(out / "round-1" / "pairs.jsonl")
    assert pair["chosen"]["speedup"] > max(1.0, pair["rejected"]["speedup"])
    # A candidate's budget is its threads' text together, as a sequential answer's is its own; its tags come on top.
    (scored,) = read_jsonl(out / "round-1" / "scores.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert all(num_text_tokens(c, tokenizer) <= 40 for c in scored["candidates"])
    assert all(c["num_tokens"] <= 40 + DecodeConfig().free_tag_tokens for c in scored["candidates"])
    assert pair["chosen"]["num_malformed"] == 0
    before = json.loads((out / "round-0" / "heldout.json").read_text())
    after = json.loads((out / "round-1" / "heldout.json").read_text())
    assert before["fork_share"] == 0.0 and before["mean_speedup"] == 1.0
    assert after["fork_share"] == 1.0 and after["mean_speedup"] > 1.0
    (answer,) = read_jsonl(out / "round-1" / "heldout.jsonl")
    assert "<promise" in answer["annotated"] and answer["num_malformed"] == 0
    info = json.loads((out / "train_info.json").read_text())
    assert info["heldout_start"] == before and info["rounds"][0]["heldout"] == after
    assert info["heldout_check_sampled"] == 1  # checked on the prompt it trained on, on purpose: the stage says so
    assert info["rounds"][0]["train"]["margin_history"][-1] > 0
    # The round's best well-formed fork that ended by itself (not cut at the token limit) goes to forking.jsonl as
    # an SFT record: the chosen side, when it ended (a constant judge: every candidate is at the median).
    forking = read_jsonl(out / "round-1" / "forking.jsonl")
    ended = [c for c in scored["candidates"] if usable_promises(Candidate.from_json(c)) and not c["malformed"]
             and c["finish_reason"] in ("eos", "stop_string")]
    assert len(forking) == (1 if ended else 0) and all("<promise" in r["annotated"] for r in forking)
    if scored["candidates"][pair["chosen"]["index"]] in ended:
        assert forking[0]["annotated"] == pair["chosen"]["annotated"]
    assert info["rounds"][0]["num_forking_records"] == len(forking)


def test_a_heldout_check_another_judge_scored_is_judged_again_not_decoded_again(tiny_model_and_tokenizer, tmp_path,
                                                                                  monkeypatch):
    """A run that takes another run's round-0 check under another judge: one summary never averages two judges."""
    from pasta.lang import ReservationPolicy
    from pasta.training import heldout

    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    records = [Record(instruction=f"Give {n} tips.", output="Sleep well.") for n in (2, 3)]

    def check(judge):
        return heldout.check_policy(model, tokenizer, records, judge, ReservationPolicy(), max_new_tokens=6,
                                    batch_size=1, out_dir=tmp_path)

    first = check(LengthJudge())
    monkeypatch.setattr(heldout, "decode_async", lambda *args, **kwargs: pytest.fail("decoded again"))
    again = check(ShortJudge())
    answers = read_jsonl(tmp_path / heldout.ANSWERS)
    assert [a["judge"] for a in answers] == ["fake:short"] * 2
    assert again.judge == "fake:short" and again.quality_proxy == pytest.approx(1.0 - first.quality_proxy)
    assert (again.mean_speedup, again.num_prompts) == (first.mean_speedup, first.num_prompts)


def test_under_a_launch_only_the_main_process_judges_a_heldout_check_again(tiny_model_and_tokenizer, tmp_path):
    """The other processes read the main one's scores back: each stale answer is judged once, not once per process,
    and every process's summary averages the same scores."""
    from pasta.lang import ReservationPolicy
    from pasta.parallel import Processes
    from pasta.training import heldout

    class Launch(Processes):
        def wait(self) -> None:  # one process after the other here: the main one, run first, wrote its scores
            pass

    class NeverAsked(ShortJudge):
        def score(self, items):
            pytest.fail("a process other than the main one judged")

    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    records = [Record(instruction=f"Give {n} tips.", output="Sleep well.") for n in (2, 3)]
    heldout.check_policy(model, tokenizer, records, LengthJudge(), ReservationPolicy(), max_new_tokens=6,
                         batch_size=1, out_dir=tmp_path)
    path = tmp_path / heldout.ANSWERS
    answers = read_jsonl(path)
    on_main, on_follower = copy.deepcopy(answers), copy.deepcopy(answers)
    heldout._judge_again(on_main, records, ShortJudge(), path, Launch(index=0, count=2))
    heldout._judge_again(on_follower, records, NeverAsked(), path, Launch(index=1, count=2))
    assert on_follower == on_main == read_jsonl(path)
    assert [a["judge"] for a in on_follower] == ["fake:short"] * 2
    assert [a["quality"] for a in on_follower] == pytest.approx([1.0 - a["quality"] for a in answers])


def test_a_heldout_check_resumed_under_other_decode_settings_stops_and_keeps_its_answers(tiny_model_and_tokenizer,
                                                                                        tmp_path):
    """Its summary compares policies: answers of two decoders in one summary would compare nothing."""
    from pasta.lang import ReservationPolicy
    from pasta.training.heldout import ANSWERS, check_policy

    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    records = [Record(instruction=f"Give {n} tips.", output="Sleep well.") for n in (2, 3)]

    def check(limit: int, max_new_tokens: int):
        return check_policy(model, tokenizer, records[:limit], ConstantJudge(), ReservationPolicy(),
                            max_new_tokens=max_new_tokens, batch_size=1, out_dir=tmp_path)

    check(1, 6)  # killed after its first prompt, say
    saved = (tmp_path / ANSWERS).read_text()
    with pytest.raises(PastaError, match=r"holds answers decoded with decode.max_new_tokens=6, this check asks 8"):
        check(2, 8)
    assert (tmp_path / ANSWERS).read_text() == saved
    older = [{key: value for key, value in answer.items() if key != "decoding"} for answer in read_jsonl(
        tmp_path / ANSWERS)]  # a check written before the settings were recorded resumes as it did
    (tmp_path / ANSWERS).write_text("".join(json.dumps(answer) + "\n" for answer in older))
    assert check(2, 8).num_prompts == 2
