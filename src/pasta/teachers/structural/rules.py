"""The independence rules: which candidate parts may be written in parallel, which blocks join into one group, and
whether a group saves decoding steps at all."""

from __future__ import annotations

import re
import statistics

from pasta.teachers.structural.cues import (
    ASKS_FOR_TIPS,
    ASKS_HOW_TO,
    BACK_REFERENCE,
    CONCLUSION_HEADING,
    CONCLUSION_START,
    DEPENDENT_START,
    IMPERATIVE,
    INTRODUCTION_HEADING,
    NAMES_STEPS,
    STARTS_SEQUENCE,
    STEP_HEADING,
    STEPS_HEADING,
    TIME_LABEL,
)
from pasta.teachers.structural.leads import find_lead, group_leads
from pasta.teachers.structural.lists import strip_marker
from pasta.teachers.structural.sections import heading_of
from pasta.teachers.structural.segments import Block, Chunk, split_lines, word_count
from pasta.teachers.structural.topics import MARKDOWN, label_of, topic_of

# <|promise|> <|promise_end|>: what a promise costs the main thread beyond its topic (the default reservation policy
# writes no count).
_PROMISE_TAG_TOKENS = 2


def parallel_chunks(block: Block, response: str, min_item_words: int, instruction: str = "") -> list[Chunk] | None:
    """The block's chunks that can be written in parallel, or None when the block stays sequential.

    A last chunk that sums up the others is left out (it stays in the main text, after `<sync/>`). The block stays
    sequential when most of its chunks are short, when a later one continues from or points back at an earlier one,
    when the last one introduces what follows or the first starts a procedure ("1. Start with ..."), when the text
    around them calls them steps, when a label repeats or places the parts in a sequence ("Morning:"), or when they
    are the numbered imperative items of an answer to "how do I ..." (steps, whatever the text calls them).
    """
    chunks = list(block.chunks)
    if len(chunks) >= 2 and CONCLUSION_START.match(_opening(chunks[-1].text(response))):
        chunks.pop()
    texts = [c.text(response) for c in chunks]
    if not texts or statistics.median(map(word_count, texts)) < min_item_words:
        return None  # most parts too short to be worth a promise ("- Pencil")
    items = [strip_marker(t) for t in texts]
    if not block.is_sentences and any(DEPENDENT_START.match(_opening(t)) or BACK_REFERENCE.search(t)
                                      for t in items[1:]):
        return None  # (sentence runs checked themselves, and may end with a "Finally" point)
    if not block.is_sentences and (texts[-1].rstrip().endswith(":") or (
            re.match(r"\s*1[.)]\s", texts[0]) and STARTS_SEQUENCE.match(MARKDOWN.sub("", items[0]).strip()))):
        return None  # the last item introduces what follows it; "1. Start with ...": a procedure
    if _calls_them_steps(response, chunks):
        return None
    labels = [label for label in map(label_of, items) if label]
    if len(labels) != len(set(labels)):
        return None  # a label said twice: turns of a dialogue ("Friend 1:"), questions and answers
    if any(STEP_HEADING.search(label) or TIME_LABEL.match(label) for label in labels):
        return None  # "Step 2:", "Morning:": parts of a sequence
    if _numbered_steps(texts, instruction):
        return None
    return chunks


def _opening(text: str) -> str:
    """An item's words without its marker or Markdown: "2. **Then** mix" opens with "Then"."""
    return MARKDOWN.sub("", strip_marker(text)).strip()


def _numbered_steps(texts: list[str], instruction: str) -> bool:
    """Numbered items of which at least half open with an imperative verb (their lead or their text), in answer to
    an instruction that asks how to do something and not for tips."""
    if not ASKS_HOW_TO.search(instruction) or ASKS_FOR_TIPS.search(instruction):
        return False
    if not all(re.match(r"\s*\d{1,3}[.)]\s", text) for text in texts):
        return False
    openings = [MARKDOWN.sub("", strip_marker(text.strip())).strip() for text in texts]
    return sum(bool(IMPERATIVE.match(opening)) for opening in openings) * 2 >= len(openings)


def can_join(response: str, group: list[Chunk], chunks: list[Chunk]) -> bool:
    """Whether `chunks` can join the group before them: only a heading line or a short `Label:` stands between them,
    it names no step of a sequence ("Day 2"), and no lead repeats across the two (a schedule's "Morning:" each day)."""
    between = response[group[-1].end : chunks[0].start]
    if not is_joining_heading(between) or STEP_HEADING.search(MARKDOWN.sub("", between)) or STEPS_HEADING.search(
            between):
        return False
    labels = [lead.label for lead in group_leads([c.text(response) for c in [*group, *chunks]]) if lead.label]
    return len(labels) == len(set(labels))


def parallel_sections(block: Block, response: str, min_item_words: int, instruction: str = "") -> list[Chunk] | None:
    """The sections of a run (pasta.teachers.structural.sections) that can be written in parallel, or None.

    A first section headed as an introduction ("Overview") and a last one headed as a conclusion ("Summary") are
    left out: they stay in the main thread. The run stays sequential when a heading names a step or a part of a
    sequence ("Step 2", "Chapter 1", "Instructions"), a heading repeats, a later section's body continues from or
    points back at an earlier one, the text around the run calls its parts steps, most bodies are short, or the
    headings of an answer to "how do I ..." are imperative ("### 1. Mix the dough").
    """
    chunks = list(block.chunks)
    labels = [_heading_label(c.text(response)) for c in chunks]
    if len(chunks) >= 2 and CONCLUSION_HEADING.match(labels[-1]):
        chunks, labels = chunks[:-1], labels[:-1]
    if len(chunks) >= 2 and INTRODUCTION_HEADING.match(labels[0]):
        chunks, labels = chunks[1:], labels[1:]
    if len(set(labels)) != len(labels) or any(STEP_HEADING.search(label) for label in labels):
        return None
    bodies = [_body(c.text(response)).strip() for c in chunks]
    if not bodies or statistics.median(map(word_count, bodies)) < min_item_words:
        return None
    if any(DEPENDENT_START.match(strip_marker(b)) or BACK_REFERENCE.search(b) for b in bodies[1:]):
        return None
    if _calls_them_steps(response, chunks):
        return None
    if ASKS_HOW_TO.search(instruction) and not ASKS_FOR_TIPS.search(instruction) and sum(
            bool(IMPERATIVE.match(re.sub(r"^\W*\d*\W*", "", label))) for label in labels) * 2 >= len(labels):
        return None  # "### 1. Mix the dough": the sections of a how-to are its steps
    return chunks


def _heading_label(text: str) -> str:
    found = heading_of(split_lines(text)[0])
    return MARKDOWN.sub("", found[1]).strip().rstrip(":").strip() if found else ""


def _body(text: str) -> str:
    return text[find_lead(text).length :]


def _calls_them_steps(response: str, chunks: list[Chunk]) -> bool:
    """Whether the text calls the parts steps: the paragraph that introduces them, a heading between it and them
    ("**Installation Steps:**"), the answer's opening paragraph ("Here's a step-by-step guide:" above a few lists
    under headings), or the sentence right after them ("These steps will help ...")."""
    lines = [line.text for line in split_lines(response[: chunks[0].start])]
    headings: list[str] = []
    while lines and (not lines[-1].strip() or heading_of(split_lines(lines[-1])[0]) is not None):
        headings.append(lines.pop())  # "**Exterior:**" between the intro and the list
    paragraph: list[str] = []
    while lines and lines[-1].strip():
        paragraph.insert(0, lines.pop())
    while lines and (not lines[-1].strip() or heading_of(split_lines(lines[-1])[0]) is not None):
        headings.append(lines.pop())  # "### Boiling Water Method" above the paragraph that introduces the list
    opening = response[: chunks[0].start].strip().split("\n\n", 1)[0]
    after = re.split(r"(?<=[.!?])\s", response[chunks[-1].end :].lstrip(), maxsplit=1)[0]
    return (any(STEPS_HEADING.search(heading) for heading in headings)
            or any(NAMES_STEPS.search(text) for text in (" ".join(paragraph), opening, after)))


def is_joining_heading(between: str) -> bool:
    """Text between two blocks that only introduces the next one (`Cons:`, a heading line), so both can be one group:
    the main thread writes it before the next promises without waiting for the chunks before it."""
    text = between.strip()
    if not text:
        return True
    if "\n" in text:
        return False
    if heading_of(split_lines(text)[0]) is not None:
        return word_count(MARKDOWN.sub("", text)) <= 8
    text = MARKDOWN.sub("", text).strip()
    return text.endswith(":") and word_count(text) <= 8


def estimated_tokens(text: str) -> float:
    """A tokenizer-free length estimate (about 1.3 tokens a word; a line break is a token)."""
    return max(word_count(text) * 1.3, 1.0 if text else 0.0)


def estimated_steps(response: str, groups: list[list[Chunk]], topic_words: int, start: int = 0,
                    end: int | None = None, lead_topic_words: int = 1, leads_in_main: bool = True) -> float:
    """The estimated forward steps of `response[start:end]` written with `groups` as chunks: the main thread writes
    the text and leads between chunks, and each promise's topic and tags; a sync before any text after a group
    waits for its chunks."""
    end = len(response) if end is None else end
    step = 0.0
    position = start
    for group in groups:
        chunk_ends = []
        for chunk, lead in zip(group, group_leads([c.text(response) for c in group], leads_in_main), strict=True):
            body = chunk.text(response)[lead.length :]
            step += estimated_tokens(response[position : chunk.start + lead.length])
            words = lead_topic_words if lead.label else topic_words
            step += estimated_tokens(topic_of(lead.label, body, words)) + _PROMISE_TAG_TOKENS
            chunk_ends.append(step + estimated_tokens(body) + 1)  # +1: </async>
            position = chunk.end
        step = max(step, *chunk_ends)
    return step + estimated_tokens(response[position:end])


def saves_steps(response: str, group: list[Chunk], topic_words: int, lead_topic_words: int = 1,
                leads_in_main: bool = True) -> bool:
    """Whether the group's estimated critical path is shorter than writing it in order."""
    start, end = group[0].start, group[-1].end
    steps = estimated_steps(response, [group], topic_words, start, end, lead_topic_words, leads_in_main)
    return steps < estimated_tokens(response[start:end])
