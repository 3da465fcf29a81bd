"""The response cut into lines, paragraphs and sentences, each kept as a character span of the response.

Every part the structural teacher finds is a span, never a copy: the annotation built from spans has the response
as its plain text exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"[ \t]*(```|~~~)")
# A sentence starts after . ! or ? (and a closing quote or bracket) and a space, with a capital, digit or quote.
_SENTENCE_START = re.compile(r"(?<=[.!?])[\"'”’)\]]*[ \t]+(?=[\"“(]?[A-Z0-9])")


@dataclass
class Line:
    start: int  # offset of the line's first character in the response
    text: str  # without its newline
    in_code: bool  # inside a fenced code block, fences included

    @property
    def blank(self) -> bool:
        return not self.text.strip()

    @property
    def indent(self) -> int:
        return len(self.text) - len(self.text.lstrip(" \t"))


@dataclass(frozen=True)
class Chunk:
    start: int  # character span of the chunk in the response
    end: int

    def text(self, response: str) -> str:
        return response[self.start : self.end]


@dataclass
class Block:
    """A run of parallel candidates: one list, one run of paragraphs, or one run of points inside a paragraph."""

    chunks: list[Chunk]
    is_sentences: bool = False  # points made by sentences inside one paragraph (`find_sentence_runs`)


def split_lines(response: str) -> list[Line]:
    lines: list[Line] = []
    in_code = False
    for match in re.finditer(r"[^\n]*\n?", response):
        if not match.group():
            continue
        text = match.group().rstrip("\n")
        fence = bool(_FENCE.match(text))
        lines.append(Line(match.start(), text, in_code or fence))
        if fence:
            in_code = not in_code
    return lines


def content_end(line: Line) -> int:
    return line.start + len(line.text.rstrip())


def next_nonblank(lines: list[Line], index: int) -> int | None:
    while index < len(lines) and lines[index].blank:
        index += 1
    return index if index < len(lines) else None


def split_paragraphs(lines: list[Line], taken: set[int]) -> list[tuple[int, int, bool]]:
    """(first line, last line, eligible) of each blank-line-separated paragraph; eligible = no list or code."""
    paragraphs = []
    index = 0
    while index < len(lines):
        if lines[index].blank:
            index += 1
            continue
        end = index
        while end + 1 < len(lines) and not lines[end + 1].blank:
            end += 1
        span = range(index, end + 1)
        eligible = not any(i in taken or lines[i].in_code for i in span)
        paragraphs.append((index, end, eligible))
        index = end + 1
    return paragraphs


def paragraph_chunk(lines: list[Line], first: int, last: int) -> Chunk:
    return Chunk(lines[first].start + lines[first].indent, content_end(lines[last]))


def split_sentences(text: str, start: int) -> list[Chunk]:
    """The sentences of a paragraph `text` that starts at offset `start` of the response."""
    spans = []
    position = 0
    for match in _SENTENCE_START.finditer(text):
        spans.append(Chunk(start + position, start + match.start()))
        position = match.end()
    spans.append(Chunk(start + position, start + len(text.rstrip())))
    return spans


def word_count(text: str) -> int:
    return len(text.split())
