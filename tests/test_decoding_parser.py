"""The main thread's promise parser alone: token ids in, typed events out (no scheduling, no model)."""

from __future__ import annotations

import pytest

from helpers.fake_vocab import AB, AE, AS, EOS, PE, PT, SY, TAGS, P, decode, promise
from pasta.decoding.parser import (
    FallBack,
    PromiseClosed,
    PromiseOpened,
    PromiseParser,
    StrayTag,
    SyncTag,
    TextToken,
)
from pasta.decoding.threads import PromiseMode


def events_of(token_ids, parser=None):
    """Every event of these main-thread tokens, in order (eos, as the interpreter does, abandons the promise)."""
    parser = parser or PromiseParser(TAGS, decode)
    events = []
    for token_id in token_ids:
        events += parser.abandon() if token_id == EOS else parser.feed(token_id)
    return events


def test_a_valid_promise_opens_then_closes_with_its_topic_and_count():
    parser = PromiseParser(TAGS, decode)
    assert events_of([1], parser) == [TextToken(1)]
    assert events_of([P, 5, PT, 11], parser) == [PromiseOpened()]
    assert parser.mode == PromiseMode.COUNT and (parser.topic_ids, parser.count_ids) == ([5], [11])
    assert events_of([12, PE], parser) == [PromiseClosed(" sleep", [5], [11, 12], 12)]
    assert parser.mode == PromiseMode.TEXT and parser.group_topics == {" sleep"}


def test_a_promise_without_a_count_closes_at_its_promise_end():
    parser = PromiseParser(TAGS, decode)
    assert events_of([P, 5, PE], parser) == [PromiseOpened(), PromiseClosed(" sleep", [5], [], None)]
    assert parser.mode == PromiseMode.TEXT and parser.group_topics == {" sleep"}
    assert events_of([P, 5, PE], parser)[-1] == FallBack("duplicate_topic", [5])


@pytest.mark.parametrize(
    ("main", "reason", "text_ids"),
    [
        ([P, 5, 6, EOS], "unclosed_promise", [5, 6]),  # the answer ends inside the topic
        ([P, 5, PT, 12, EOS], "unclosed_promise", [5, 12]),  # ... inside the count
        ([P, 5, 8, PT], "bad_topic", [5, 8]),  # a quote in the topic
        ([P, PT], "bad_topic", []),  # an empty topic
        ([P, *[5] * 101], "bad_topic", [5] * 101),  # longer than MAX_TOPIC_CHARS
        ([P, PE], "bad_topic", []),  # an empty topic, uncounted
        ([P, 8, PE], "bad_topic", [8]),  # a quote in an uncounted topic
        ([P, 5, PT, PE], "bad_count", [5]),  # no count
        ([P, 5, PT, 1, PE], "bad_count", [5, 1]),  # a word as the count
        ([P, 5, PT, 10, PE], "bad_count", [5, 10]),  # zero
        ([P, 5, PT, *[11] * 9], "bad_count", [5, *[11] * 9]),  # more than MAX_COUNT_TOKENS
    ],
)
def test_each_invalid_promise_falls_back_to_its_topic_and_count_as_text(main, reason, text_ids):
    parser = PromiseParser(TAGS, decode)
    events = events_of(main, parser)
    assert events[0] == PromiseOpened()
    assert events[1:] == [FallBack(reason, text_ids)]
    assert parser.mode == PromiseMode.TEXT and not parser.group_topics


def test_a_tag_inside_a_promise_ends_it_and_is_then_read_on_its_own():
    assert events_of([P, 5, SY]) == [PromiseOpened(), FallBack("unclosed_promise", [5]), SyncTag()]
    assert events_of([P, 5, PT, 12, P]) == [PromiseOpened(), FallBack("unclosed_promise", [5, 12]), PromiseOpened()]
    assert events_of([P, 5, PT, AS]) == [PromiseOpened(), FallBack("unclosed_promise", [5]),
                                         StrayTag("async_tag_in_main")]


def test_a_duplicated_topic_falls_back_until_a_sync_ends_the_group():
    parser = PromiseParser(TAGS, decode)
    first = events_of(promise([5], 1), parser)
    assert first[-1] == PromiseClosed(" sleep", [5], [11], 1)
    assert events_of(promise([5], 2), parser)[-1] == FallBack("duplicate_topic", [5, 12])
    assert events_of([SY], parser) == [SyncTag()]
    assert events_of(promise([5], 3), parser)[-1] == PromiseClosed(" sleep", [5], [13], 3)


def test_stray_tags_outside_a_promise_are_named_and_plain_tokens_are_text():
    assert events_of([1, AE, AB, PT, PE, 2]) == [TextToken(1), StrayTag("async_tag_in_main"),
                                                 StrayTag("async_tag_in_main"), StrayTag("stray_promise_tag"),
                                                 StrayTag("stray_promise_tag"), TextToken(2)]


def test_abandon_outside_a_promise_has_nothing_to_fall_back():
    parser = PromiseParser(TAGS, decode)
    events_of([1, *promise([5], 1)], parser)
    assert parser.abandon() == []
