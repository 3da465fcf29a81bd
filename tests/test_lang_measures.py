"""What a fork costs and wastes, measured on the language: the main thread's tag steps, and cross-thread repetition."""

from __future__ import annotations

import pytest

from pasta.lang import (
    TagIds,
    TokenChunk,
    TokenDoc,
    content_words,
    cross_thread_repetition,
    parse,
    schedule,
)

TAGS = TagIds(promise=901, promise_tokens=902, promise_end=903, async_start=904, async_body=905, async_end=906,
              sync=907)


def chunk(num_body: int) -> TokenChunk:
    return TokenChunk(opener_ids=[904, 1, 905], body_ids=[5] * num_body + [906], num_predicted=None)


def test_tag_steps_count_the_promise_skeleton_topics_counts_and_syncs_not_the_text():
    # text text <promise> t t <promise_end> text <promise> t <promise_tokens> 7 <promise_end> <sync> text eos
    main = [1, 2, 901, 3, 3, 903, 4, 901, 3, 902, 7, 903, 907, 4, 0]
    plan = schedule(TokenDoc(main_ids=main, chunks=[chunk(3), chunk(2)], tag_ids=TAGS))
    assert plan.num_tag_steps == 4 + 5 + 1
    assert schedule(TokenDoc(main_ids=[1, 2, 0], chunks=[], tag_ids=TAGS)).num_tag_steps == 0


def test_content_words_leave_out_function_words_numbers_and_short_words():
    assert content_words("1. The Sun is a star: it shines on 8 planets, and it is hot.") == [
        "sun", "star", "shines", "planets", "hot"]


def test_repetition_counts_chunk_words_another_thread_writes():
    doc = parse(
        'Coffee tips:\n1. **Grind**:<promise topic="grind"/>\n2. **Water**:<promise topic="water"/>'
        '<async topic="grind"> Grind fresh beans right before brewing.</async>'
        '<async topic="water"> Filtered water tastes cleaner than tap water in coffee.</async>'
    )
    repetition = cross_thread_repetition(doc)
    # chunk 1: grind fresh beans right brewing (grind: the topic and lead); chunk 2: filtered water tastes cleaner
    # tap water coffee (water twice: the topic; coffee: the intro)
    assert (repetition.num_chunk_words, repetition.num_repeated_words) == (5 + 7, 1 + 3)
    assert repetition.share == pytest.approx(4 / 12)


def test_a_word_that_two_sibling_chunks_write_is_repeated_in_both():
    doc = parse('Two:<promise topic="a"/><promise topic="b"/><async topic="a">Bright garden.</async>'
                '<async topic="b">Quiet garden.</async>')
    assert cross_thread_repetition(doc).num_repeated_words == 2


def test_an_answer_without_chunks_has_no_share():
    assert cross_thread_repetition(parse("Just text, no fork.")).share is None
