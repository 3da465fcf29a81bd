"""Numbered and bulleted lists in a response: where each list starts and ends, and the span of each item."""

from __future__ import annotations

import re

from pasta.teachers.structural.segments import Block, Chunk, Line, content_end, next_nonblank

# A list item's first line: indentation, marker, at least one space, text.
_ITEM = re.compile(r"(?P<indent>[ \t]*)(?P<marker>(?P<number>\d{1,3})[.)]|[-*•+])[ \t]+\S")
_MARKER_PREFIX = re.compile(r"^([-*•+]|\d{1,3}[.)])\s+")


def strip_marker(text: str) -> str:
    """The text without the list marker it opens with (`1.`, `-`), if any."""
    return _MARKER_PREFIX.sub("", text)


def item_marker(line: Line) -> re.Match[str] | None:
    return None if line.in_code else _ITEM.match(line.text)


def same_list(first: re.Match[str], other: re.Match[str], expected_number: int | None) -> bool:
    if len(first.group("indent")) != len(other.group("indent")):
        return False
    if first.group("number") is None:
        return other.group("marker") == first.group("marker")
    number = other.group("number")
    return (
        number is not None
        and int(number) == expected_number
        and other.group("marker")[-1] == first.group("marker")[-1]
    )


def find_lists(lines: list[Line]) -> list[tuple[Block, int, int]]:
    """Lists as (block, first line, last line).

    An item runs over the lines indented deeper than its marker (sub-bullets, continued paragraphs), and over
    unindented lines right after its text ("1. Which river?" then "A) Seine") when the list goes on after them, or
    when every earlier item had such lines too. Other text at the marker's indentation ends the list.
    """
    found: list[tuple[Block, int, int]] = []
    index = 0
    while index < len(lines):
        first = item_marker(lines[index])
        if first is None:
            index += 1
            continue
        block, last = _list_from(lines, index, first)
        found.append((block, index, last))
        index = last + 1
    return found


def _list_from(lines: list[Line], start_line: int, first: re.Match[str]) -> tuple[Block, int]:
    """The list whose first item's marker is `first`, on line `start_line`, and the list's last line."""
    indent = len(first.group("indent"))
    number = None if first.group("number") is None else int(first.group("number"))
    chunks: list[Chunk] = []
    had_lazy_lines: list[bool] = []
    current = start_line
    while True:
        expected_next = None if number is None else number + len(chunks) + 1
        last, lazy = _item_end(lines, current, first, expected_next, had_lazy_lines)
        chunks.append(Chunk(lines[current].start + indent, content_end(lines[last])))
        had_lazy_lines.append(lazy)
        following = next_nonblank(lines, last + 1)
        marker = None if following is None else item_marker(lines[following])
        if marker is None or not same_list(first, marker, expected_next):
            return Block(chunks), last
        current = following


def _item_end(
    lines: list[Line], current: int, first: re.Match[str], expected_next: int | None, had_lazy_lines: list[bool]
) -> tuple[int, bool]:
    """The last line of the item that opens on line `current`, and whether it took unindented lines after its text.

    `expected_next` is the number the list's next item would carry (None for bullets); `had_lazy_lines` says, for
    each earlier item, whether it took such lines.
    """
    indent = len(first.group("indent"))
    last = current
    lazy = False
    probe = current + 1
    while probe < len(lines):
        line = lines[probe]
        if line.blank:
            following = next_nonblank(lines, probe)
            if following is None or lines[following].indent <= indent:
                break
            probe = following
            continue
        if line.indent > indent:
            last = probe
            probe += 1
            continue
        if item_marker(line) is not None:  # the next item, or another list
            break
        lazy_end = _text_run_end(lines, probe)
        following = next_nonblank(lines, lazy_end + 1)
        marker = None if following is None else item_marker(lines[following])
        goes_on = marker is not None and same_list(first, marker, expected_next)
        if not goes_on and not (had_lazy_lines and all(had_lazy_lines)):
            break  # main text after the list
        last, lazy, probe = lazy_end, True, lazy_end + 1
    return last, lazy


def _text_run_end(lines: list[Line], index: int) -> int:
    """The last line of the run of non-blank lines without a list marker that starts at line `index`."""
    while index + 1 < len(lines) and not lines[index + 1].blank and item_marker(lines[index + 1]) is None:
        index += 1
    return index
