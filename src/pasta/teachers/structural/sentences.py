"""Runs of points inside one paragraph: after an intro sentence, sentences that open with ordinals in order
("First, ... Second, ..."), as examples ("For example, ... Another example ...") or with additive openers
("Additionally", "Another ..."), each point running to the next opener."""

from __future__ import annotations

from pasta.teachers.structural.cues import (
    ADDITIVE,
    ASKS_FOR_TIPS,
    BACK_REFERENCE,
    DEPENDENT_START,
    EXAMPLE_FIRST,
    EXAMPLE_NEXT,
    IMPERATIVE,
    LAST_POINT,
    ORDINAL,
    ORDINAL_NUMBERS,
    POINTS_BACK,
    SUMMING_UP,
    point_body,
)
from pasta.teachers.structural.segments import (
    Block,
    Chunk,
    Line,
    paragraph_chunk,
    split_paragraphs,
    split_sentences,
)


def _point_starts(sentences: list[str]) -> list[int]:
    """Indices of the sentences that open the points of a run: numbered (First, Second, ... in order), examples
    (For example ... Another example) or added (Additionally, Another ...); `Finally` opens the last one."""
    numbered: list[int] = []
    for index, sentence in enumerate(sentences):
        match = ORDINAL.match(sentence)
        if match and ORDINAL_NUMBERS[match.group("ordinal").lower()] == len(numbered) + 1:
            numbered.append(index)
    if len(numbered) < 2:
        first = next((i for i, t in enumerate(sentences) if EXAMPLE_FIRST.match(t)), None)
        following = [i for i, t in enumerate(sentences) if EXAMPLE_NEXT.match(t) and first is not None and i > first]
        numbered = [first, *following] if following else [i for i, t in enumerate(sentences) if ADDITIVE.match(t)]
    if not numbered:
        return []
    last = next((i for i, t in enumerate(sentences) if i > numbered[-1] and LAST_POINT.match(t)), None)
    return numbered + ([last] if last is not None else [])


def find_sentence_runs(instruction: str, response: str, lines: list[Line], taken: set[int]) -> list[Block]:
    """Points made by runs of sentences inside a paragraph ("First, ... Second, ...", "Additionally, ...").

    The points follow an intro sentence, which stays in the main text, and end where a sentence sums them up. A run
    is left sequential when a point opens by pointing back ("Second, this ..."), when a sentence reads as a next
    step ("Then", "Once ..."), or when its points are imperative and the instruction did not ask for tips or ways.
    """
    blocks: list[Block] = []
    for first, last, eligible in split_paragraphs(lines, taken):
        if not eligible:
            continue
        paragraph = paragraph_chunk(lines, first, last)
        sentences = split_sentences(paragraph.text(response), paragraph.start)
        texts = [sentence.text(response) for sentence in sentences]
        starts = _point_starts(texts)
        if len(starts) < 2 or starts[0] == 0:
            continue
        # The last point ends where a sentence sums the points up or points back at them ("Both ...", "This ..."):
        # that sentence stays in the main thread, after them.
        end = next((i for i in range(starts[-1] + 1, len(texts)) if SUMMING_UP.match(texts[i])
                    or POINTS_BACK.match(texts[i])), len(texts))
        bounds = list(zip(starts, [*starts[1:], end], strict=True))
        bodies = [point_body(texts[start]) or "" for start in starts]  # every start opens with a point marker
        if any(POINTS_BACK.match(body) for body in bodies[1:]):
            continue
        if any(DEPENDENT_START.match(texts[i]) and not LAST_POINT.match(texts[i]) for a, b in bounds
               for i in range(a, b)):  # fmt: skip
            continue
        chunks = [Chunk(sentences[a].start, sentences[b - 1].end) for a, b in bounds]
        if any(BACK_REFERENCE.search(chunk.text(response)) for chunk in chunks):
            continue
        if not ASKS_FOR_TIPS.search(instruction) and any(IMPERATIVE.match(body) for body in bodies):
            continue
        blocks.append(Block(chunks, is_sentences=True))
    return blocks
