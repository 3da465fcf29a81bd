"""The records of one request's threads, as the interpreter keeps them: their states, the main thread and the
chunks (which pasta.decoding.scheduler feeds), and the items of the main thread (text runs, promises, syncs) that
pasta.decoding.render turns into text and structure."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ChunkState(str, Enum):
    """A chunk's life: FORKING (its promise is being fed) -> QUEUED (waiting for a free thread, at most
    `max_threads` run) -> OPENING (its forced opener is fed) -> RUNNING (sampling) -> CLOSED (complete, waiting
    for its join); DROPPED when it never started (max_total_tokens)."""

    FORKING = "forking"
    QUEUED = "queued"
    OPENING = "opening"
    RUNNING = "running"
    CLOSED = "closed"
    DROPPED = "dropped"


class MainState(str, Enum):
    """The main thread: RUNNING, WAITING at a `<|sync|>` for its group's chunks to close, or DONE."""

    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"


class PromiseMode(str, Enum):
    """Where the main thread's parser is: in TEXT, in a promise's TOPIC, or in its token COUNT."""

    TEXT = "text"
    TOPIC = "topic"
    COUNT = "count"


@dataclass
class MainThread:
    """The main thread's feeding state (what it sampled lives in the interpreter's items)."""

    position: int  # position of the next token it feeds
    state: MainState = MainState.RUNNING
    pending: int | None = None  # sampled, fed at the next step
    prefilled: bool = False


@dataclass
class Chunk:
    """An asynchronous thread, from its promise to its join."""

    index: int
    topic_ids: list[int]
    num_predicted: int | None  # the promise's count; None when uncounted
    opener_ids: list[int]
    state: ChunkState = ChunkState.FORKING
    row: int = -1
    position: int = 0  # position of the next token this chunk feeds
    num_reserved: int = 0  # positions the policy reserved for the content
    body_ids: list[int] = field(default_factory=list)  # cleaned content, closing <|async_end|> included
    pending: list[int] = field(default_factory=list)  # sampled, fed at the next step (closing ones at the join)
    joined: bool = False  # a sync made it visible to the main thread
    num_sampled: int = 0
    num_positions: int = 0  # body tokens that take a position (sampled ones, stray tags included)
    has_text: bool = False  # the body so far decodes to more than whitespace


@dataclass
class TextRun:
    """Main-thread text between tags, as sampled."""

    ids: list[int] = field(default_factory=list)
    stop_at: int | None = None  # character offset where a stop string starts


@dataclass
class PromiseItem:
    """A promise in the main thread: its chunk and the count's ids as sampled."""

    chunk: Chunk
    count_ids: list[int]


class SyncItem:
    """A `<|sync|>` in the main thread."""


MainItem = TextRun | PromiseItem | SyncItem
