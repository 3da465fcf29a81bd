"""PASTA-LANG inline form: parse, validate, serialize, and read the plain text of an annotated response.

The inline form is what teachers write and data files store:

    Tips:\\n<promise topic="routine" tokens="9"/>\\n<promise topic="room" tokens="8"/>
    <async topic="routine">1. Keep a fixed bedtime.</async><async topic="room">2. Keep it dark.</async><sync/>
    Sleep well.

A `Document` is the main thread as a sequence of `Text`, `Promise` and `Sync` items; each `Promise` carries the
chunk its asynchronous thread writes, so the plain text is the concatenation of the main items with every promise
replaced by its chunk. Everything outside an async block is main-thread text and is kept exactly as written;
angle brackets that do not start a PASTA tag (`3 < 4`, HTML, code) are plain text.

Run `python -m pasta.lang --help` for the command-line checker built on this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pasta.errors import PastaError

MAX_TOPIC_CHARS = 100

# A PASTA tag attempt starts with one of these names followed by a non-word character; `<promises>` or `<synced>`
# are ordinary text.
_TAG_START = re.compile(r"<(/?)(promise|async|sync)(?![\w-])")
_PROMISE = re.compile(r'<promise topic="([^"<>]*)"(?: tokens="([^"<>]*)")?\s*/>')
_ASYNC_OPEN = re.compile(r'<async topic="([^"<>]*)">')
_WORD = re.compile(r"\w+")  # what topic_words counts as a word
_ASYNC_CLOSE = re.compile(r"</async>")
_SYNC = re.compile(r"<sync\s*/>")
# Everything that looks like a PASTA tag, complete or half-written, for stripping from text shown to a reader.
_ANY_TAG = re.compile(r"</?(?:promise|async|sync)(?![\w-])[^<>]*>?")

_EXPECTED = {
    ("", "promise"): '<promise topic="..." tokens="N"/>',
    ("", "async"): '<async topic="...">',
    ("/", "async"): "</async>",
    ("", "sync"): "<sync/>",
}


class LangError(PastaError, ValueError):
    """An annotation that is not valid PASTA-LANG; `offset` is the character offset of the problem."""

    def __init__(self, message: str, offset: int | None = None):
        self.message = message
        self.offset = offset
        super().__init__(message if offset is None else f"at char {offset}: {message}")


@dataclass(frozen=True)
class Text:
    """Main-thread text, kept exactly as written (whitespace included)."""

    text: str


@dataclass(frozen=True)
class Promise:
    """A promise in the main thread and the chunk its asynchronous thread writes."""

    topic: str
    content: str
    num_tokens: int | None = None  # the `tokens="N"` attribute; None until measured with a tokenizer


@dataclass(frozen=True)
class Sync:
    """`<sync/>`: the main thread waits for every outstanding chunk."""


Item = Text | Promise | Sync


@dataclass(frozen=True)
class Document:
    """An annotated response: the main thread's items in order."""

    items: tuple[Item, ...]

    @classmethod
    def plain(cls, text: str) -> Document:
        """A response of one piece of text: no tags (how an unannotated answer is trained and measured)."""
        return cls((Text(text),))

    @property
    def promises(self) -> list[Promise]:
        return [item for item in self.items if isinstance(item, Promise)]

    @property
    def groups(self) -> list[list[Promise]]:
        """Promises between consecutive syncs (the end is an implicit sync); empty groups are left out."""
        groups: list[list[Promise]] = [[]]
        for item in self.items:
            if isinstance(item, Promise):
                groups[-1].append(item)
            elif isinstance(item, Sync):
                groups.append([])
        return [group for group in groups if group]

    @property
    def is_annotated(self) -> bool:
        return any(not isinstance(item, Text) for item in self.items)

    @property
    def num_lead_words(self) -> int | None:
        """Words of the main thread's text before its first promise (a list marker such as `1.` is one); None
        without a promise."""
        lead = []
        for item in self.items:
            if isinstance(item, Promise):
                return len(" ".join(lead).split())
            if isinstance(item, Text):
                lead.append(item.text)
        return None


def validate_topic(topic: str) -> str | None:
    """The reason a topic is not allowed, or None when it is fine."""
    if not topic.strip():
        return "empty topic"
    if len(topic) > MAX_TOPIC_CHARS:
        return f"topic longer than {MAX_TOPIC_CHARS} characters"
    if any(ch in topic for ch in '"<>'):
        return 'topic contains ", < or >'
    if any(ord(ch) < 32 for ch in topic):
        return "topic contains a control character (newline, tab)"
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in topic):
        return "topic is not valid Unicode (a lone surrogate)"
    return None


def topic_words(topic: str) -> tuple[str, ...]:
    """The words that name a topic, lowercased: two topics with the same words ('He wore' and 'he wore:') name the
    same part of an answer, whatever their case and punctuation (the decoder's grammar keeps a group's topics apart
    by them; the evaluation counts a list that repeats them as a topic loop)."""
    return tuple(_WORD.findall(topic.lower()))


def num_tokens_value(raw: str) -> int | None:
    """The value of a promise's tokens="N" written as `raw`: a positive ASCII integer, else None."""
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else None


def _parse_num_tokens(raw: str, offset: int) -> int:
    num_tokens = num_tokens_value(raw)
    if num_tokens is None:
        raise LangError(f'tokens="{raw}" is not a positive integer', offset)
    return num_tokens


def parse(text: str, *, require_tokens: bool = False) -> Document:
    """Parse the inline form. Raises `LangError` with the character offset of the first problem.

    Async blocks may stand anywhere after their promise and before the group's `<sync/>` (or the end), in promise
    order. With `require_tokens`, every promise must carry `tokens="N"` (training data); teachers leave it out.
    """
    return _Parser(text, require_tokens).parse()


class _Parser:
    """One pass over the inline form, tag by tag; the text between tags is main-thread text."""

    def __init__(self, text: str, require_tokens: bool):
        self.text = text
        self.require_tokens = require_tokens
        self.items: list[Item] = []
        # Promises of the current group still waiting for their async block: (index in items, offset in text).
        self.pending: list[tuple[int, int]] = []
        self.group_topics: set[str] = set()

    def parse(self) -> Document:
        pos = 0
        for match in _TAG_START.finditer(self.text):
            start = match.start()
            if start < pos:  # inside an async block already consumed
                continue
            slash, name = match.groups()
            self._add_text(self.text[pos:start])
            pos = self._tag(slash, name, start)
        self._add_text(self.text[pos:])
        self._close_group("the end of the response")
        return Document(tuple(_merge_texts(self.items)))

    def _tag(self, slash: str, name: str, start: int) -> int:
        """Read the tag at `start`; returns the offset right after it (after `</async>` for an async block)."""
        if slash == "" and name == "promise":
            return self._promise(start)
        if slash == "" and name == "async":
            return self._async_block(start)
        if slash == "/" and name == "async":
            raise LangError("</async> without an open async block", start)
        if slash == "" and name == "sync":
            tag = _SYNC.match(self.text, start)
            if not tag:
                raise LangError(f"malformed sync tag, expected {_EXPECTED[('', 'sync')]}", start)
            self._close_group("<sync/>")
            self.items.append(Sync())
            return tag.end()
        raise LangError(f"unknown closing tag </{name}>", start)

    def _promise(self, start: int) -> int:
        tag = _PROMISE.match(self.text, start)
        if not tag:
            raise LangError(f"malformed promise tag, expected {_EXPECTED[('', 'promise')]}", start)
        topic, raw_tokens = tag.groups()
        if reason := validate_topic(topic):
            raise LangError(reason, start)
        if topic in self.group_topics:
            raise LangError(f'duplicate topic "{topic}" in one group', start)
        if raw_tokens is None and self.require_tokens:
            raise LangError(f'promise "{topic}" has no tokens="N"', start)
        num_tokens = None if raw_tokens is None else _parse_num_tokens(raw_tokens, start)
        self.group_topics.add(topic)
        self.pending.append((len(self.items), start))
        self.items.append(Promise(topic=topic, content="", num_tokens=num_tokens))
        return tag.end()

    def _async_block(self, start: int) -> int:
        tag = _ASYNC_OPEN.match(self.text, start)
        if not tag:
            raise LangError(f"malformed async tag, expected {_EXPECTED[('', 'async')]}", start)
        topic = tag.group(1)
        if not self.pending:
            raise LangError(f'async block "{topic}" has no promise before it', start)
        index, _ = self.pending[0]
        expected = self.items[index].topic  # type: ignore[union-attr]
        if topic != expected:
            raise LangError(
                f'async block "{topic}" does not match the next waiting promise "{expected}" '
                "(async blocks follow their promises in promise order)",
                start,
            )
        close = _ASYNC_CLOSE.search(self.text, tag.end())
        if not close:
            raise LangError(f'async block "{topic}" is not closed with </async>', start)
        inner_tag = _TAG_START.search(self.text, tag.end(), close.start())
        if inner_tag:
            raise LangError("tags inside an async block are not allowed (no nesting)", inner_tag.start())
        content = self.text[tag.end() : close.start()]
        if not content.strip():
            raise LangError(f'async block "{topic}" is empty', start)
        self.items[index] = replace(self.items[index], content=content)  # type: ignore[type-var]
        self.pending.pop(0)
        return close.end()

    def _add_text(self, chunk: str) -> None:
        if chunk:
            self.items.append(Text(chunk))

    def _close_group(self, where: str) -> None:
        if self.pending:
            index, promise_offset = self.pending[0]
            topic = self.items[index].topic  # type: ignore[union-attr]
            raise LangError(f'promise "{topic}" has no async block before {where}', promise_offset)
        self.group_topics.clear()


def _merge_texts(items: list[Item]) -> list[Item]:
    """Adjacent Text items (text on both sides of an async block) are one main-thread run."""
    merged: list[Item] = []
    for item in items:
        if isinstance(item, Text) and merged and isinstance(merged[-1], Text):
            merged[-1] = Text(merged[-1].text + item.text)
        else:
            merged.append(item)
    return merged


def _promise_tag(promise: Promise) -> str:
    tokens = "" if promise.num_tokens is None else f' tokens="{promise.num_tokens}"'
    return f'<promise topic="{promise.topic}"{tokens}/>'


def serialize(doc: Document) -> str:
    """The canonical inline form: a group's async blocks stand right before its `<sync/>` (or the end)."""
    parts: list[str] = []
    waiting: list[Promise] = []

    def flush() -> None:
        parts.extend(f'<async topic="{p.topic}">{p.content}</async>' for p in waiting)
        waiting.clear()

    for item in doc.items:
        if isinstance(item, Text):
            parts.append(item.text)
        elif isinstance(item, Promise):
            parts.append(_promise_tag(item))
            waiting.append(item)
        else:
            flush()
            parts.append("<sync/>")
    flush()
    return "".join(parts)


def plain_text(doc: Document) -> str:
    """What a reader sees: tags removed, each chunk spliced in at its promise."""
    return "".join(
        item.text if isinstance(item, Text) else item.content if isinstance(item, Promise) else ""
        for item in doc.items
    )


def strip_annotations(text: str) -> str:
    """Plain text of an inline annotation; text that does not parse keeps its words with stray tags removed."""
    try:
        return plain_text(parse(text))
    except LangError:
        return strip_tags(text)


def strip_tags(text: str) -> str:
    """Remove anything that looks like a PASTA tag, complete or half-written, keeping the words around it."""
    return _ANY_TAG.sub("", text)


def normalize_whitespace(text: str) -> str:
    """Whitespace-insensitive form used to compare a teacher's plain text with the original response."""
    return " ".join(text.split())
