"""Rendering one request's main-thread items: the plain text (whole, or the part no later step can change), the
annotated document, and the cleaned structure as ids (TokenDoc). Malformed parts are left out: a chunk counts only
when it closed with text in it, and tags the model wrote out of place were never kept as items."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pasta.decoding.text import settled
from pasta.decoding.threads import Chunk, ChunkState, MainItem, PromiseItem, TextRun
from pasta.lang import Document, Promise, Sync, TagIds, Text, TokenChunk, TokenDoc


class Renderer:
    """Turns main-thread items into text and structure, decoding ids with `decode`."""

    def __init__(self, decode: Callable[[list[int]], str], tag_ids: TagIds):
        self.decode, self.tag_ids = decode, tag_ids

    def kept(self, chunk: Chunk) -> bool:
        return chunk.state == ChunkState.CLOSED and bool(self.decode(chunk.body_ids[:-1]).strip())

    def item_text(self, item: MainItem) -> str:
        if isinstance(item, TextRun):
            text = self.decode(item.ids)
            return text if item.stop_at is None else text[: item.stop_at]
        if isinstance(item, PromiseItem):
            return self.decode(item.chunk.body_ids[:-1]) if self.kept(item.chunk) else ""
        return ""

    def text(self, items: Sequence[MainItem]) -> str:
        """The plain text: main-thread text with each chunk spliced in at its promise."""
        return "".join(self.item_text(item) for item in items)


    def document(self, items: Sequence[MainItem]) -> Document:
        parts = []
        for item in items:
            if isinstance(item, TextRun):
                if text := self.item_text(item):
                    parts.append(Text(text))
            elif isinstance(item, PromiseItem):
                if self.kept(item.chunk):
                    content = self.item_text(item)
                    parts.append(Promise(self.decode(item.chunk.topic_ids), content, item.chunk.num_predicted))
            else:
                parts.append(Sync())
        return Document(tuple(parts))

    def token_doc(self, items: Sequence[MainItem], eos_id: int | None) -> TokenDoc:
        """The cleaned structure as ids: a valid TokenDoc (stray tags and dropped promises left out); `eos_id` ends
        the main thread when the model stopped it."""
        tags = self.tag_ids
        main_ids: list[int] = []
        chunks: list[TokenChunk] = []
        for item in items:
            if isinstance(item, TextRun):
                main_ids += item.ids
            elif isinstance(item, PromiseItem):
                chunk = item.chunk
                if self.kept(chunk):
                    main_ids += [tags.promise, *chunk.topic_ids]
                    if chunk.num_predicted is not None:
                        main_ids += [tags.promise_tokens, *item.count_ids]
                    main_ids.append(tags.promise_end)
                    chunks.append(TokenChunk(chunk.opener_ids, chunk.body_ids, chunk.num_predicted))
            else:
                main_ids.append(tags.sync)
        if eos_id is not None:
            main_ids.append(eos_id)
        return TokenDoc(main_ids=main_ids, chunks=chunks, tag_ids=tags)


class SettledText:
    """The prefix of a request's plain text that later steps cannot change (for streaming), kept incrementally.

    Items only ever append, and an item is final once another follows it (a text run) or its chunk has closed or
    been dropped (a promise); final items are rendered once, into `prefix`. A call renders only the open text run
    at the end (one decode of its ids), so a step's streaming costs what the step added, not the whole answer.
    """

    def __init__(self, renderer: Renderer, max_stop_len: int):
        self.renderer, self.max_stop_len = renderer, max_stop_len
        self.num_items = 0  # items rendered into `prefix`
        self.prefix = ""

    def text(self, items: Sequence[MainItem]) -> str:
        """The settled text of a request not done, whose main-thread items are `items` (the same list, grown)."""
        while self.num_items < len(items):
            item = items[self.num_items]
            if isinstance(item, PromiseItem) and item.chunk.state not in (ChunkState.CLOSED, ChunkState.DROPPED):
                return self.prefix  # its chunk still writes: nothing after it is final
            if self.num_items == len(items) - 1 and isinstance(item, TextRun):
                # Still open: later tokens may complete a character, a stop string, or fall back into it.
                return self.prefix + settled(self.renderer.item_text(item), self.max_stop_len)
            self.prefix += self.renderer.item_text(item)
            self.num_items += 1
        return self.prefix
