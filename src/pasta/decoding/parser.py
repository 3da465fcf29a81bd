"""The main thread's promise parser: its sampled token ids in, typed events out; no model, no scheduling.

A promise is `<|promise|> topic <|promise_tokens|> N <|promise_end|>`, or `<|promise|> topic <|promise_end|>`
uncounted; it completes (`PromiseClosed`) when the topic passes `pasta.lang.syntax.validate_topic`, N (when
written) is a positive integer (`pasta.lang.syntax.num_tokens_value`) and the topic is new in its group (the
promises since the last `<|sync|>`). Anything else falls back to literal
text (`FallBack`): the promise's topic and count tokens become plain text, its tags are dropped, and the reason is
the malformed event the decoder counts (unclosed_promise, bad_topic, bad_count, duplicate_topic). A tag that
interrupts a promise ends it as unclosed_promise and is then read as if no promise were open. Stray tags outside
a promise (`StrayTag`) are counted and dropped. Ending the main thread inside a promise is `abandon()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pasta.decoding.threads import PromiseMode
from pasta.lang import TagIds
from pasta.lang.syntax import MAX_TOPIC_CHARS, num_tokens_value, validate_topic

MAX_COUNT_TOKENS = 8  # longer than any sensible tokens="N"; the parser falls back beyond it


@dataclass(frozen=True)
class TextToken:
    """A token of plain main-thread text."""

    token_id: int


@dataclass(frozen=True)
class PromiseOpened:
    """A `<|promise|>`: the tokens that follow are its topic."""


@dataclass(frozen=True)
class PromiseClosed:
    """A valid promise's `<|promise_end|>`: the chunk it announces may fork."""

    topic: str
    topic_ids: list[int]
    count_ids: list[int]  # the count as sampled; empty when uncounted
    num_predicted: int | None  # the count's value; None when uncounted


@dataclass(frozen=True)
class FallBack:
    """The promise being written is not valid: `text_ids` (its topic and count tokens) are plain text."""

    reason: str  # the malformed event, as `stats.malformed` counts it
    text_ids: list[int]


@dataclass(frozen=True)
class SyncTag:
    """A `<|sync|>`: the main thread waits for its group's chunks."""


@dataclass(frozen=True)
class StrayTag:
    """A tag that has no place in the main thread here; dropped."""

    kind: str  # async_tag_in_main | stray_promise_tag


MainEvent = TextToken | PromiseOpened | PromiseClosed | FallBack | SyncTag | StrayTag


class PromiseParser:
    """Reads the main thread token by token; `feed` returns what each token means, in order."""

    def __init__(self, tag_ids: TagIds, decode: Callable[[list[int]], str]):
        self.tag_ids = tag_ids
        self.decode = decode
        self.mode = PromiseMode.TEXT  # where the main thread is inside a promise tag
        self.topic_ids: list[int] = []
        self.count_ids: list[int] = []
        self.group_topics: set[str] = set()  # topics promised since the last sync: the language's duplicate rule
        # every topic of the answer: the grammar keeps them apart (a list that repeats an earlier list's topic loops)
        self.answer_topics: set[str] = set()

    def feed(self, token_id: int) -> list[MainEvent]:
        """The events of one main-thread token (a fallback before the tag that caused it)."""
        events: list[MainEvent] = []
        if self.mode == PromiseMode.TOPIC:
            if self._feed_topic(token_id, events):
                return events
        elif self.mode == PromiseMode.COUNT and self._feed_count(token_id, events):
            return events
        events.append(self._read_text(token_id))
        return events

    def abandon(self) -> list[MainEvent]:
        """The main thread ends here: a promise being written never closes."""
        return [self._fall_back("unclosed_promise")] if self.mode != PromiseMode.TEXT else []

    def _feed_topic(self, token_id: int, events: list[MainEvent]) -> bool:
        """A token inside the topic; False when it is a tag to read as text after the promise fell back."""
        tags = self.tag_ids
        if token_id in (tags.promise_tokens, tags.promise_end) and validate_topic(self.decode(self.topic_ids)):
            events.append(self._fall_back("bad_topic"))
        elif token_id == tags.promise_tokens:
            self.mode = PromiseMode.COUNT
        elif token_id == tags.promise_end:
            events.append(self._close())
        elif token_id not in tags.all:
            self.topic_ids.append(token_id)
            if len(self.topic_ids) > MAX_TOPIC_CHARS:
                events.append(self._fall_back("bad_topic"))
        else:
            events.append(self._fall_back("unclosed_promise"))  # another tag: the promise never closes
            return False
        return True

    def _feed_count(self, token_id: int, events: list[MainEvent]) -> bool:
        """A token inside the count; False when it is a tag to read as text after the promise fell back."""
        tags = self.tag_ids
        if token_id == tags.promise_end:
            events.append(self._close())
        elif token_id not in tags.all:
            self.count_ids.append(token_id)
            if len(self.count_ids) > MAX_COUNT_TOKENS:
                events.append(self._fall_back("bad_count"))
        else:
            events.append(self._fall_back("unclosed_promise"))
            return False
        return True

    def _read_text(self, token_id: int) -> MainEvent:
        """A token outside any promise."""
        tags = self.tag_ids
        if token_id == tags.promise:
            self.mode = PromiseMode.TOPIC
            self.topic_ids, self.count_ids = [], []
            return PromiseOpened()
        if token_id == tags.sync:
            self.group_topics.clear()
            return SyncTag()
        if token_id in (tags.async_start, tags.async_body, tags.async_end):
            return StrayTag("async_tag_in_main")
        if token_id in (tags.promise_tokens, tags.promise_end):
            return StrayTag("stray_promise_tag")
        return TextToken(token_id)

    def _close(self) -> MainEvent:
        """The promise_end: after the topic (uncounted) or after the count."""
        counted = self.mode == PromiseMode.COUNT
        num_predicted = num_tokens_value(self.decode(self.count_ids).strip()) if counted else None
        topic = self.decode(self.topic_ids)
        if counted and num_predicted is None:
            return self._fall_back("bad_count")
        if topic in self.group_topics:
            return self._fall_back("duplicate_topic")
        self.group_topics.add(topic)
        self.answer_topics.add(topic)
        self.mode = PromiseMode.TEXT
        return PromiseClosed(topic, self.topic_ids, self.count_ids, num_predicted)

    def _fall_back(self, reason: str) -> FallBack:
        event = FallBack(reason, self.topic_ids + self.count_ids)
        self.mode = PromiseMode.TEXT
        self.topic_ids, self.count_ids = [], []
        return event
