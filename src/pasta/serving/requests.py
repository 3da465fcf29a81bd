"""What the API hands the engine (`EngineRequest`) and the events the engine sends back for it.

The engine calls `emit` from its own thread; the API turns that into an asyncio queue (`loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pasta.decoding import DecodeConfig, DecodeResult

_request_numbers = itertools.count()


@dataclass
class TextDelta:
    """A new piece of the request's plain text, final (no later step changes it)."""

    text: str


@dataclass
class Finished:
    """The request is done; `result.text` is the concatenation of every TextDelta."""

    result: DecodeResult


@dataclass
class Failed:
    """The request failed inside the engine (its slots are freed); the other requests go on."""

    reason: str


EngineEvent = TextDelta | Finished | Failed


@dataclass(eq=False)
class EngineRequest:
    """One sequence to decode: a prompt, its limits and sampling (`config`, the seed included), and where its
    events go. Compared by identity: the scheduler and the engine keep it in lists."""

    prompt_ids: list[int]
    config: DecodeConfig
    emit: Callable[[EngineEvent], None]
    request_id: int = field(default_factory=lambda: next(_request_numbers))
    arrived_s: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # set by the API (client gone); the engine drops the request before its next step

    @property
    def num_tokens(self) -> int:
        """What admission counts: the prompt and the tokens the request may sample (`max_total_tokens` when set,
        which caps every thread; else `max_new_tokens`, the main thread's, which chunk threads can exceed; and the
        free tags on top of either)."""
        return (len(self.prompt_ids) + (self.config.max_total_tokens or self.config.max_new_tokens)
                + self.config.free_tag_tokens)
