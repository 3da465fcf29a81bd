"""Runs of paragraphs outside lists that read as parallel parts: labelled paragraphs in a row (`**Solids**`,
`Solids:`, `## Solids`), and the paragraphs after an intro that announces how many follow ("three states")."""

from __future__ import annotations

import re

from pasta.teachers.structural.cues import CONCLUSION_START
from pasta.teachers.structural.segments import Block, Line, paragraph_chunk, split_paragraphs
from pasta.teachers.structural.topics import label_of

_COUNT_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    **{str(n): n for n in range(2, 11)},
}  # fmt: skip


_COUNTED = re.compile(
    r"(?<![\w.,])(?P<count>" + "|".join(_COUNT_WORDS) + r")(?![\w.,])[ \t]+(?:[\w-]+[ \t]+){0,2}?[a-z]+s\b",
    re.IGNORECASE,
)


def _announced_count(text: str) -> set[int]:
    """The counts the paragraph's last sentence gives of a plural noun ("three popular ways", "2 main types"): the
    paragraphs it announces. A count elsewhere ("the two soon parted", "13.2 degrees") announces nothing."""
    last = re.split(r"(?<=[.!?])\s+", text.strip())[-1]
    return {_COUNT_WORDS[m.group("count").lower()] for m in _COUNTED.finditer(last)}


def find_paragraph_runs(response: str, lines: list[Line], taken: set[int]) -> list[Block]:
    """Labelled and announced paragraph runs among the paragraphs that use no line of `taken` (lists) or code."""
    blocks: list[Block] = []
    paragraphs = split_paragraphs(lines, taken)
    index = 0
    while index < len(paragraphs):
        run_end = index
        while run_end < len(paragraphs) and paragraphs[run_end][2]:
            run_end += 1
        run = paragraphs[index:run_end]
        chunks = [paragraph_chunk(lines, first, last) for first, last, _ in run]
        labelled = [label_of(c.text(response)) is not None for c in chunks]
        position = 0
        while position < len(run):
            # Labelled paragraphs in a row.
            end = position
            while end < len(run) and labelled[end]:
                end += 1
            if end - position >= 2:
                blocks.append(Block(chunks[position:end]))
                position = end
                continue
            # An intro that announces how many paragraphs follow.
            following = chunks[position + 1 :]
            counts = _announced_count(chunks[position].text(response))
            if len(following) in counts:
                blocks.append(Block(following))
                break
            if len(following) - 1 in counts and CONCLUSION_START.match(following[-1].text(response)):
                blocks.append(Block(following[:-1]))
                break
            position += 1
        index = run_end + 1
    return blocks
