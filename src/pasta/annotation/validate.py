"""Validation of a teacher's annotation against the original response, with a reason for every rejection.

An answer is accepted when it parses as PASTA-LANG (topics present and valid, no empty chunks: the parser checks
both) and its plain text is the original response. When the two match only after normalising whitespace, the
annotation's whitespace is re-aligned to the original (`realign_whitespace`), so the stored plain text is always
exactly the original. A reason is `code: detail`; the code is what the run summary counts.

    doc = validate_annotation(original, teacher_text)     # raises Rejected("text_changed: ...")
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, replace

from pasta.lang import (
    Document,
    LangError,
    Promise,
    Sync,
    Text,
    normalize_whitespace,
    parse,
    plain_text,
    topic_words,
)
from pasta.teachers.base import EMPTY_REPLY, REFUSED, TRUNCATED

# Reason codes. Records the stage cannot use whatever the teacher says:
EMPTY_RESPONSE = "empty_response"
INVALID_UNICODE = "invalid_unicode"
CONTAINS_TAGS = "contains_tags"
# The teacher is not asked, but the record can still be kept unannotated:
TOO_LONG = "too_long"
# The teacher's answer (EMPTY_REPLY, REFUSED and TRUNCATED come from pasta.teachers.base, and):
PARSE_ERROR = "parse_error"
EXTRA_TEXT = "extra_text"
TEXT_CHANGED = "text_changed"
WHITESPACE_CHUNK = "whitespace_chunk"
DUPLICATE_TOPIC = "duplicate_topic"

UNUSABLE_CODES = frozenset({EMPTY_RESPONSE, INVALID_UNICODE, CONTAINS_TAGS})

# A teacher's reply that opens like this, where the response does not, is a refusal rather than an annotation.
_REFUSAL = re.compile(
    r"\s*(i'?m sorry|i am sorry|sorry,|i can(no|')t|i cannot|i'?m unable|i am unable|as an ai|unfortunately, i)",
    re.IGNORECASE,
)
# One code fence around the whole answer, which chat models add despite the prompt: ```text\n...\n```
_ENCLOSING_FENCE = re.compile(
    r"\s*(?P<fence>`{3,}|~{3,})[\w+-]*[ \t]*\n(?P<body>.*)\n[ \t]*(?P=fence)\s*", re.DOTALL
)
_SHOW_CHARS = 40


class Rejected(Exception):  # noqa: N818 (a verdict, not an error: every rejection is expected and recorded)
    """The answer cannot be used; `reason` is `code: detail`."""

    def __init__(self, code: str, detail: str):
        self.code = code
        self.reason = f"{code}: {detail}"
        super().__init__(self.reason)


def reason_code(reason: str) -> str:
    return reason.split(":", 1)[0]


def has_lone_surrogates(text: str) -> bool:
    """True for text that cannot be written as UTF-8 (lone surrogates, e.g. from non-UTF-8 bytes or bad escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_original(instruction: str, input: str, response: str, max_response_chars: int | None) -> None:
    """Raise `Rejected` when a record cannot be annotated at all, before any teacher sees it."""
    if any(has_lone_surrogates(text) for text in (instruction, input, response)):
        raise Rejected(INVALID_UNICODE, "the record holds text that is not valid Unicode (lone surrogates)")
    if not response.strip():
        raise Rejected(EMPTY_RESPONSE, "the record's output is empty")
    try:
        tagged = parse(response).is_annotated
    except LangError as exc:
        raise Rejected(CONTAINS_TAGS, f"the original response holds PASTA-LANG-like tags ({exc})") from None
    if tagged:
        raise Rejected(CONTAINS_TAGS, "the original response already holds PASTA-LANG tags")
    if max_response_chars is not None and len(response) > max_response_chars:
        raise Rejected(TOO_LONG, f"{len(response)} characters > max_response_chars={max_response_chars}")


def validate_annotation(original: str, answer: str | None) -> Document:
    """The teacher's annotation as a Document whose plain text is exactly `original`, or raise `Rejected`."""
    if answer is None or not answer.strip():
        raise Rejected(EMPTY_REPLY, "the teacher returned no text")
    fenced = _ENCLOSING_FENCE.fullmatch(answer)
    if fenced and not _ENCLOSING_FENCE.fullmatch(original):
        answer = fenced.group("body")
    try:
        doc = parse(answer)
    except LangError as exc:
        if _is_refusal(answer, original):
            raise Rejected(REFUSED, _show(answer)) from None
        raise Rejected(PARSE_ERROR, str(exc)) from None
    _check_topics_differ(doc)
    plain = plain_text(doc)
    if plain == original:
        return doc
    if normalize_whitespace(plain) == normalize_whitespace(original):
        return realign_whitespace(doc, original)
    raise Rejected(*_explain_difference(original, plain, answer))


def _check_topics_differ(doc: Document) -> None:
    """No two promises of the answer name the same words: the parser refuses a repeat within a group, the decoder's
    grammar anywhere in an answer (a model trained on one would learn what it can never write)."""
    promised: set[tuple[str, ...]] = set()
    for item in doc.items:
        if isinstance(item, Promise):
            words = topic_words(item.topic)
            if words and words in promised:  # a topic of no words names none (the grammar's rule too)
                raise Rejected(DUPLICATE_TOPIC, f"topic {item.topic!r} repeats an earlier promise's words")
            promised.add(words)


def _is_refusal(answer: str, original: str) -> bool:
    return bool(_REFUSAL.match(answer)) and not _REFUSAL.match(original)


def _show(text: str, start: int = 0) -> str:
    shown = text[start : start + _SHOW_CHARS]
    return repr(shown + ("..." if len(text) > start + _SHOW_CHARS else ""))


def _explain_difference(original: str, plain: str, answer: str) -> tuple[str, str]:
    expected, got = normalize_whitespace(original), normalize_whitespace(plain)
    if _is_refusal(answer, original):
        return REFUSED, _show(answer)
    if got and expected.startswith(got):
        return TRUNCATED, f"the answer stops after {len(got)} of {len(expected)} characters of the response"
    if expected and expected in got:
        before = got[: got.index(expected)]
        after = got[got.index(expected) + len(expected) :]
        where = " and ".join(
            f"{side} {_show(text.strip())}"
            for side, text in (("before:", before), ("after:", after))
            if text.strip()
        )
        return EXTRA_TEXT, f"the teacher added text around the response ({where})"
    first = next(
        (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
        min(len(expected), len(got)),
    )
    return TEXT_CHANGED, (
        f"plain text differs from the response at normalised char {first}: "
        f"expected {_show(expected, first)}, got {_show(got, first)}"
    )


@dataclass(frozen=True)
class _Runs:
    """A text as whitespace runs and words: ws[0] word[0] ws[1] ... word[n-1] ws[n] (ws[0], ws[n] may be empty)."""

    ws: list[tuple[int, int]]
    words: list[tuple[int, int]]

    @classmethod
    def of(cls, text: str) -> _Runs:
        ws: list[tuple[int, int]] = []
        words: list[tuple[int, int]] = []
        # str.split() (and so normalize_whitespace) splits on str.isspace(); the runs must agree with it.
        position = 0
        while True:
            start = position
            while position < len(text) and text[position].isspace():
                position += 1
            ws.append((start, position))
            if position == len(text):
                return cls(ws, words)
            start = position
            while position < len(text) and not text[position].isspace():
                position += 1
            words.append((start, position))


_OPEN, _CLOSE, _SYNC = "open", "close", "sync"


def realign_whitespace(doc: Document, original: str) -> Document:
    """The same annotation with its whitespace taken from `original`, whose words equal the doc's plain text's.

    Every tag keeps its place among the words; inside a whitespace run it keeps its side: a tag at the start of a
    run stays at the start, at the end stays at the end, and a tag in the middle keeps as many whitespace
    characters before it as the original run allows. Where the annotation has no whitespace but the original has
    some (leading or trailing), a chunk opens after it and closes before it, so the extra whitespace is main text.
    """
    plain = plain_text(doc)
    markers: list[tuple[int, str]] = []  # (position in plain, kind), in document order
    position = 0
    for item in doc.items:
        if isinstance(item, Text):
            position += len(item.text)
        elif isinstance(item, Promise):
            markers.append((position, _OPEN))
            position += len(item.content)
            markers.append((position, _CLOSE))
        else:
            markers.append((position, _SYNC))
    ours, theirs = _Runs.of(plain), _Runs.of(original)
    if len(ours.words) != len(theirs.words):  # callers compare normalised texts first; this is a safety net
        raise Rejected(TEXT_CHANGED, "the answer's words differ from the response's")
    word_starts = [start for start, _ in ours.words]
    mapped: list[int] = []
    for position, kind in markers:
        index = bisect.bisect_right(word_starts, position) - 1
        if index >= 0 and ours.words[index][0] < position < ours.words[index][1]:  # inside a word
            target = theirs.words[index][0] + position - ours.words[index][0]
        else:
            # ws[i] is the run before word i: a tag at a word's start ends the run before it, else it is in the
            # run after the last word that starts before it.
            run = index if index >= 0 and position == ours.words[index][0] else index + 1
            (start, end), (their_start, their_end) = ours.ws[run], theirs.ws[run]
            offset, length, their_length = position - start, end - start, their_end - their_start
            if length == 0:
                shift = their_length if kind == _OPEN else 0
            elif offset == 0:
                shift = 0
            elif offset == length:
                shift = their_length
            else:
                shift = min(offset, their_length)
            target = their_start + shift
        mapped.append(max(target, mapped[-1]) if mapped else target)
    return _rebuild(doc, original, mapped)


def _rebuild(doc: Document, original: str, mapped: list[int]) -> Document:
    items: list[Text | Promise | Sync] = []
    cursor = 0
    positions = iter(mapped)
    for item in doc.items:
        if isinstance(item, Text):
            continue  # main text is whatever lies between the tags
        start = next(positions)
        if start > cursor:
            items.append(Text(original[cursor:start]))
        if isinstance(item, Promise):
            end = next(positions)
            content = original[start:end]
            if not content.strip():
                raise Rejected(
                    WHITESPACE_CHUNK, f'chunk "{item.topic}" holds only whitespace after re-alignment'
                )
            items.append(replace(item, content=content))
            cursor = end
        else:
            items.append(item)
            cursor = start
    if cursor < len(original):
        items.append(Text(original[cursor:]))
    realigned = Document(tuple(items))
    if plain_text(realigned) != original:  # by construction it is; never store data that is not
        raise Rejected(TEXT_CHANGED, "whitespace re-alignment failed")
    return realigned
