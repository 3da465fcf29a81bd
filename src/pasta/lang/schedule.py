"""The ideal interpreter's schedule of a response, and its theoretical speedup.

Every live thread samples one token per forward step (the prefill is step 1 and samples the main thread's first
token). A promise completed at step s forks a chunk whose i-th token is sampled at step s + i (its decoder-supplied
opener rides along in that first forward). A `<|sync|>` sampled at step t lets the main thread sample its next
token at step max(t, last step of every outstanding chunk) + 1. The response is done when the main thread and every
chunk are. Theoretical speedup = tokens sampled by all threads / steps; a sequential decode has speedup 1.

The asynchronous decoder counts its steps the same way, so its stats equal `schedule(token_doc)` for the same
structure (tested in tests/test_decoding*). `num_tag_steps` counts the main thread's steps that sample the language
rather than the answer: the promise skeleton, topics, counts and syncs (what a fork costs the main thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from pasta.lang.tokens import TokenDoc


@dataclass(frozen=True)
class Schedule:
    num_tokens: int  # sampled by all threads
    num_steps: int  # forward passes, prefill included
    num_tag_steps: int = 0  # main-thread steps on <|promise|> topic [<|promise_tokens|> N] <|promise_end|> and <|sync|>

    @property
    def theoretical_speedup(self) -> float:
        return self.num_tokens / self.num_steps if self.num_steps else 1.0


def schedule(doc: TokenDoc) -> Schedule:
    step = 0
    outstanding_ends: list[int] = []
    forks = iter(doc.chunks)
    num_tag_steps = 0
    in_promise = False  # between <|promise|> and <|promise_end|>: topic and count tokens
    for token_id in doc.main_ids:
        step += 1
        if token_id == doc.tag_ids.promise:
            in_promise = True
        num_tag_steps += in_promise or token_id == doc.tag_ids.sync
        if token_id == doc.tag_ids.promise_end:
            in_promise = False
            num_body = len(next(forks).body_ids)
            outstanding_ends.append(step + num_body)
        elif token_id == doc.tag_ids.sync:
            step = max([step, *outstanding_ends])
            outstanding_ends.clear()
    num_steps = max([step, *outstanding_ends])
    return Schedule(doc.num_tokens, num_steps, num_tag_steps)
