"""The independence rules: which candidate parts may be written in parallel, which blocks join into one group, and
whether a group saves decoding steps at all."""

from __future__ import annotations

import re

from pasta.teachers.structural.cues import BACK_REFERENCE, CONCLUSION_START, DEPENDENT_START, NAMES_STEPS
from pasta.teachers.structural.lists import strip_marker
from pasta.teachers.structural.segments import Block, Chunk, word_count
from pasta.teachers.structural.topics import MARKDOWN, label_of, make_topic

# <|promise|> <|promise_tokens|> N <|promise_end|>: what a promise costs the main thread beyond its topic.
_PROMISE_TAG_TOKENS = 4


def parallel_chunks(block: Block, response: str, min_item_words: int) -> list[Chunk] | None:
    """The block's chunks that can be written in parallel, or None when the block stays sequential.

    A last chunk that sums up the others is left out (it stays in the main text, after `<sync/>`). The block stays
    sequential when its chunks are short on average, when a later one continues from or points back at an earlier
    one, when the text around them calls them steps, or when a label repeats.
    """
    chunks = list(block.chunks)
    if len(chunks) >= 2 and CONCLUSION_START.match(strip_marker(chunks[-1].text(response))):
        chunks.pop()
    texts = [c.text(response) for c in chunks]
    if not texts or sum(map(word_count, texts)) < min_item_words * len(texts):
        return None
    items = [strip_marker(t) for t in texts]
    if not block.is_sentences and any(DEPENDENT_START.match(t) or BACK_REFERENCE.search(t) for t in items[1:]):
        return None  # (sentence runs checked themselves, and may end with a "Finally" point)
    if _calls_them_steps(response, chunks):
        return None
    labels = [label for label in map(label_of, items) if label]
    if len(labels) != len(set(labels)):
        return None  # a label said twice: turns of a dialogue ("Friend 1:"), questions and answers
    return chunks


def _calls_them_steps(response: str, chunks: list[Chunk]) -> bool:
    """Whether the sentence right before or right after the parts calls them steps ("These steps will help ...")."""
    before = re.split(r"(?<=[.!?:])\s", response[: chunks[0].start].rstrip())[-1]
    after = re.split(r"(?<=[.!?])\s", response[chunks[-1].end :].lstrip(), maxsplit=1)[0]
    return bool(NAMES_STEPS.search(before) or NAMES_STEPS.search(after))


def is_joining_heading(between: str) -> bool:
    """Text between two blocks that only introduces the next one (`Cons:`), so both can be one group."""
    text = between.strip()
    if not text:
        return True
    if "\n" in text:
        return False
    text = MARKDOWN.sub("", text).strip()
    return text.endswith(":") and word_count(text) <= 8


def _estimated_tokens(text: str) -> float:
    """A tokenizer-free length estimate (about 1.3 tokens a word; a line break is a token)."""
    return max(word_count(text) * 1.3, 1.0 if text else 0.0)


def saves_steps(response: str, group: list[Chunk], topic_words: int) -> bool:
    """Whether the group's estimated critical path is shorter than writing it in order."""
    main_steps = 0.0
    chunk_ends = []
    sequential_steps = 0.0
    previous_end = group[0].start
    for chunk in group:
        gap = _estimated_tokens(response[previous_end : chunk.start])
        topic = make_topic(chunk.text(response), topic_words)
        content = _estimated_tokens(chunk.text(response))
        main_steps += gap + _estimated_tokens(topic) + _PROMISE_TAG_TOKENS
        chunk_ends.append(main_steps + content + 1)  # +1: </async>
        sequential_steps += gap + content
        previous_end = chunk.end
    return max(main_steps, *chunk_ends) < sequential_steps
