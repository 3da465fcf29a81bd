"""Ids to text for both decoders: decoding, end-of-sequence ids, stop strings, and streaming what became final."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# (request index, a new piece of final plain text)
TextCallback = Callable[[int, str], None]


def text_decoder(tokenizer) -> Callable[[list[int]], str]:
    """ids -> text as a reader sees it: special tokens (tags, eos) dropped, spaces exactly as tokenized."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) if ids else ""

    return decode


def eos_token_ids(model, tokenizer) -> set[int]:
    """The ids that end an answer: the model's generation config's (as `generate` uses), else the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    ids = configured if isinstance(configured, list | tuple) else [configured]
    return {int(i) for i in ids if i is not None}


def pad_token_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def find_stop(text: str, stop_strings: tuple[str, ...], checked_len: int) -> int | None:
    """Where the earliest stop string that ends after `checked_len` characters starts in `text`, or None.

    Called after each new token with the text's previous length, this stops as transformers' StopStringCriteria
    does: when a stop string ends inside the newest token (which may run past it).
    """
    found = None
    for stop in stop_strings:
        index = text.find(stop, max(0, checked_len - len(stop) + 1))
        if index != -1 and (found is None or index < found):
            found = index
    return found


@dataclass
class SampledAnswer:
    """One sequentially decoded answer: its sampled tokens and why it stopped ("" while it runs). The stopping
    rules of `decode_sequential` and of the plain step request (pasta/decoding/plain.py), written once."""

    limit: int  # tokens it may sample: max_new_tokens, or the forced response's length
    forced: bool = False  # a replayed response: eos does not end it, its length does
    token_ids: list[int] = field(default_factory=list)
    stop_at: int | None = None  # character offset where a stop string starts
    checked_len: int = 0  # characters already searched for stop strings
    finish_reason: str = ""

    def take(self, token_id: int, eos_ids: set[int], stop_strings: tuple[str, ...],
             decode: Callable[[list[int]], str]) -> None:
        """Append a sampled token; stop at eos, at a stop string ending in it, or at the limit."""
        self.token_ids.append(token_id)
        if token_id in eos_ids:
            if not self.forced:
                self.finish_reason = "eos"
        elif stop_strings:
            text = decode(self.token_ids)
            self.stop_at = find_stop(text, stop_strings, self.checked_len)
            self.checked_len = len(text)
            self.finish_reason = "stop_string" if self.stop_at is not None else ""
        if not self.finish_reason and len(self.token_ids) >= self.limit:
            self.finish_reason = "max_new_tokens"

    def text(self, decode: Callable[[list[int]], str]) -> str:
        """The answer's text, cut where a stop string starts."""
        text = decode(self.token_ids)
        return text[: self.stop_at] if self.stop_at is not None else text


def settled(text: str, max_stop_len: int) -> str:
    """The part of a still-growing text that later tokens cannot change: not a trailing partial character
    (decoded as U+FFFD), nor the last `max_stop_len - 1` characters, which a stop string could still claim."""
    text = text.rstrip("\ufffd")
    return text[: max(0, len(text) - max_stop_len + 1)] if max_stop_len else text


class TextStream:
    """Calls `callback(request, piece)` with the new part of each request's final text."""

    def __init__(self, callback: TextCallback, num_requests: int):
        self.callback = callback
        self.emitted = [""] * num_requests

    def update(self, request: int, final_text: str) -> None:
        done = self.emitted[request]
        if len(final_text) > len(done) and final_text.startswith(done):
            self.callback(request, final_text[len(done) :])
            self.emitted[request] = final_text
