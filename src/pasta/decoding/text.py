"""Ids to text for both decoders: decoding, end-of-sequence ids, stop strings, and streaming what became final."""

from __future__ import annotations

from collections.abc import Callable

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
