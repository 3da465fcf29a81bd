"""Sections: runs of parts under headings of one kind, where GPT-4-style answers keep their independent parts.

A heading is a line of its own: a Markdown heading (`## Sleep`, `### 2. Diet`), a bold line (`**Sleep**`,
`**Sleep:**`) or a short label line (`Movies:`). A run is two or more headings of the same kind (the same level for
Markdown) with what follows each: a section runs to the next heading of its run, and a stronger heading (a lower
Markdown level, or Markdown over bold over label lines) ends the run. The last section has no next heading to end
it, so it takes, for Markdown headings, the paragraphs up to a closing one ("In summary, ...", "Remember ...", a
`---` rule), and for bold and label lines as many blocks (paragraphs, or a whole list) as the longest section
before it. The heading stays in the main thread (pasta.teachers.structural.leads); the chunk writes the body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pasta.teachers.structural.cues import CLOSING_START
from pasta.teachers.structural.lists import item_marker
from pasta.teachers.structural.segments import Block, Chunk, Line, content_end

_MARKDOWN = re.compile(r"(?P<hashes>#{1,6})[ \t]+(?P<label>\S[^\n]*?)[ \t#]*$")
_BOLD_LINE = re.compile(r"(?P<mark>\*\*|__)(?P<label>[^*_\n]{1,80}?)(?P=mark)[ \t]*:?[ \t]*$")
_LABEL_LINE = re.compile(r"(?P<label>[A-Z][^:.!?\n*#]{0,40}):[ \t]*$")
# A label line that introduces what follows ("Here are some tips:") rather than naming a section.
_INTRODUCES = re.compile(
    r"\b(here|are|is|was|were|include|includes|including|following|below|these|this|consider|you|your|we|our|i|"
    r"example|examples|such as|note|let|let's|denote|given|where|solution|answer)\b", re.IGNORECASE)
_RULE = re.compile(r"[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$")
_KIND_STRENGTH = {**{f"#{n}": n for n in range(1, 7)}, "bold": 7, "label": 8}


@dataclass(frozen=True)
class Heading:
    line: int  # index in the response's lines
    kind: str  # "#1".."#6", "bold" or "label"
    label: str


def heading_of(line: Line) -> tuple[str, str] | None:
    """(kind, label) when the line is a heading, else None."""
    if line.in_code or line.indent > 3 or item_marker(line) is not None:
        return None
    text = line.text.strip()
    if match := _MARKDOWN.match(text):
        return f"#{len(match.group('hashes'))}", match.group("label")
    if match := _BOLD_LINE.match(text):
        return "bold", match.group("label").strip().rstrip(":")
    match = _LABEL_LINE.match(text)
    if match and len(match.group("label").split()) <= 4 and not _INTRODUCES.search(match.group("label")):
        return "label", match.group("label")
    return None


def find_sections(lines: list[Line]) -> list[Block]:
    """Runs of two or more sections (see the module docstring), each section one chunk from its heading line."""
    headings = [Heading(i, *found) for i, line in enumerate(lines) if (found := heading_of(line)) is not None]
    blocks: list[Block] = []
    for kind in dict.fromkeys(h.kind for h in headings):
        run: list[Heading] = []
        for heading in headings:
            if heading.kind == kind:
                run.append(heading)
            elif _KIND_STRENGTH[heading.kind] < _KIND_STRENGTH[kind] and run:
                blocks += _run_block(lines, run, end=heading.line)
                run = []
        if run:
            blocks += _run_block(lines, run, end=len(lines))
    return sorted(blocks, key=lambda b: b.chunks[0].start)


def _run_block(lines: list[Line], run: list[Heading], end: int) -> list[Block]:
    """The run's sections as one block (empty when fewer than two have a body); `end` is the line the run stops at."""
    chunks: list[Chunk] = []
    num_blocks: list[int] = []
    for index, heading in enumerate(run):
        last_line = run[index + 1].line if index + 1 < len(run) else end
        body = list(range(heading.line + 1, last_line))
        if index + 1 == len(run):
            body = _last_body(lines, body, heading.kind, max(num_blocks, default=1))
        body_lines = [i for i in body if not lines[i].blank]
        if not body_lines:
            return [] if len(chunks) < 2 else [Block(chunks)]
        num_blocks.append(len(_blocks(lines, body)))
        chunks.append(Chunk(lines[heading.line].start + lines[heading.line].indent, content_end(lines[body_lines[-1]])))
    return [Block(chunks)] if len(chunks) >= 2 else []


def _blocks(lines: list[Line], body: list[int]) -> list[list[int]]:
    """The body's blocks: paragraphs split at blank lines, a list (with blank lines between its items) one block."""
    blocks: list[list[int]] = []
    current: list[int] = []
    for index in body:
        line = lines[index]
        if line.blank:
            continue
        joins = current and (index == current[-1] + 1 or (item_marker(line) and item_marker(lines[current[0]]))
                             or line.indent > 0)
        if current and not joins:
            blocks.append(current)
            current = []
        current.append(index)
    if current:
        blocks.append(current)
    return blocks


def _last_body(lines: list[Line], body: list[int], kind: str, max_blocks: int) -> list[int]:
    """The last section's lines: up to a closing paragraph or rule (Markdown), or `max_blocks` blocks."""
    kept: list[int] = []
    for number, block in enumerate(_blocks(lines, body)):
        first = lines[block[0]].text.strip()
        if _RULE.match(first) or (number and CLOSING_START.match(first)):
            break
        if not kind.startswith("#") and number >= max_blocks:
            break
        kept += block
    return kept
