"""Where an answer's tokens and steps go: hand-built answers whose split is known token by token."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.fake_vocab import AE, EOS, PE, SY, TAGS, P, promise
from pasta.evaluation.length import answer_tokens, length_row, repeated_words
from pasta.lang import Document, Promise, Sync, Text, TokenChunk, TokenDoc

# "Tips:" then two counted promises (topics " sleep", " early walk"), a sync, " one", eos; chunks of 3 and 5 content
# tokens, the first promised 2 (1 token over), the second 5.
MAIN = [1, 4, *promise([5], 2), 9, *promise([6, 7], 5), SY, 2, EOS]
CHUNKS = [TokenChunk([103, 5, 104], [2, 3, 2, AE], 2), TokenChunk([103, 6, 7, 104], [3, 2, 3, 2, 3, AE], 5)]
DOC = Document((Text("Tips:"), Promise(" sleep", "one two one", 2), Text("\n"),
                Promise(" early walk", "two one two one two", 5), Sync(), Text(" one")))


def test_an_answer_splits_into_content_tags_and_overrun_token_by_token():
    answer = answer_tokens(DOC, TokenDoc(MAIN, CHUNKS, TAGS), EOS)
    assert (answer.num_main_text, answer.num_chunk_text) == (4, 8)  # "Tips", ":", "\n", " one"; 3 + 5
    assert (answer.num_promise_tags, answer.num_topic, answer.num_count) == (6, 3, 2)
    assert (answer.num_async_end, answer.num_sync, answer.num_eos) == (2, 1, 1)
    assert answer.num_overrun == 1
    assert answer.num_tokens == len(MAIN) + sum(len(c.body_ids) for c in CHUNKS)
    assert answer.forked


def test_steps_split_into_main_text_tags_and_waiting_for_chunks():
    answer = answer_tokens(DOC, TokenDoc(MAIN, CHUNKS, TAGS), EOS)
    # The second promise ends at step 14 and its chunk samples 6 tokens in steps 15-20; the sync, sampled at step
    # 15, lets the main thread go on only at step 21: 5 steps of waiting. 17 main tokens in 22 steps.
    assert answer.num_main_text_steps == 5 and answer.num_main_tag_steps == 12  # tags, topics, counts, sync
    assert answer.num_wait_steps == 5 and answer.num_steps == 22


def test_an_uncounted_answer_spends_no_steps_on_counts():
    main = [1, 4, P, 5, PE, 9, P, 6, 7, PE, SY, 2, EOS]
    chunks = [TokenChunk([103, 5, 104], [2, 3, 2, AE], None), TokenChunk([103, 6, 7, 104], [3, 2, 3, 2, 3, AE], None)]
    answer = answer_tokens(DOC, TokenDoc(main, chunks, TAGS), EOS)
    assert (answer.num_promise_tags, answer.num_count, answer.num_overrun) == (4, 0, 0)
    counted = answer_tokens(DOC, TokenDoc(MAIN, CHUNKS, TAGS), EOS)
    assert counted.num_steps - answer.num_steps == 4  # <|promise_tokens|> and a digit, twice


def test_words_that_two_threads_both_write_count_as_repeated():
    assert repeated_words(["the cat sat on the mat", "a dog: the cat sat on a rug"]) == (14, 8)
    assert repeated_words(["one two three four", "five six seven eight"]) == (8, 0)


def test_a_row_compares_content_and_steps_with_baseline_sft_on_the_same_prompts():
    answer = answer_tokens(DOC, TokenDoc(MAIN, CHUNKS, TAGS), EOS)
    row = length_row("all", [answer, answer], [24, 16], num_hit_limit=1)
    assert row.content == 12 and row.baseline_tokens == 20
    assert row.content_over_baseline == pytest.approx(24 / 40)
    assert row.steps_over_baseline == pytest.approx(2 * answer.num_steps / 40)
    assert row.num_hit_limit == 1
    assert length_row("all", [answer], None, 0).content_over_baseline is None
    # A drafted decode's kept guesses (stats.num_draft_kept) are the steps it took fewer than the schedule's.
    drafted = dataclasses.replace(answer, num_draft_kept=3)
    assert length_row("all", [drafted, answer], None, 0).draft_kept == 1.5 and row.draft_kept == 0
