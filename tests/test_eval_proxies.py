"""The offline quality guards on known texts: distinct-n, length ratio, and embedding similarity to the reference."""

from __future__ import annotations

import pytest

from pasta.evaluation.proxies import distinct_n, length_ratio, quality_proxies


def test_distinct_n_is_the_share_of_distinct_word_ngrams_averaged_over_answers():
    # "a b a b": bigrams ab, ba, ab -> 2/3; trigrams aba, bab -> 1. "x x x x": bigrams 1/3, trigrams 1/2.
    texts = ["a b a b", "x x x x"]
    assert distinct_n(texts, 2) == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert distinct_n(texts, 3) == pytest.approx((1 + 1 / 2) / 2)


def test_distinct_n_ignores_case_and_punctuation_and_leaves_out_answers_too_short():
    assert distinct_n(["The cat. the CAT!"], 2) == pytest.approx(2 / 3)  # the cat, cat the, the cat
    assert distinct_n(["Yes.", "one two"], 3) is None
    assert distinct_n(["Yes.", "one two three"], 2) == pytest.approx(1.0)


def test_length_ratio_compares_total_characters_on_the_prompts_both_runs_answer():
    answers = {"q1": "aaaa", "q2": "bb"}
    assert length_ratio(answers, {"q1": "aa", "q2": "aa", "q3": "a much longer answer"}) == pytest.approx(1.5)
    assert length_ratio(answers, {"q3": "other prompt"}) is None


def test_proxies_of_a_run_against_references_and_baseline(embedding_judge):
    references = {
        "How can I stay healthy?": "Drink water regularly, sleep seven to eight hours, and walk every day.",
        "When did the French Revolution begin?": "It began in 1789 with the storming of the Bastille.",
    }
    answers = dict(references)
    answers["When did the French Revolution begin?"] = "Walk daily, drink water and sleep well to stay healthy."
    baseline = ({question: answer + answer for question, answer in answers.items()}, "baseline-sft")
    proxies = quality_proxies(answers, references, "gpt4_turbo", baseline, judge=embedding_judge)
    # One identical answer (similarity 1) and one about another question (clearly lower).
    assert 0.5 < proxies.embedding_similarity < 0.75
    assert (proxies.embedding_model, proxies.reference) == ("embedding:all-MiniLM-L6-v2", "gpt4_turbo")
    assert (proxies.length_ratio, proxies.baseline) == (pytest.approx(0.5), "baseline-sft")
    assert proxies.distinct_2 == pytest.approx(1.0) and proxies.num_answers == 2
    assert quality_proxies(answers, references, "gpt4_turbo", judge=embedding_judge).length_ratio is None
