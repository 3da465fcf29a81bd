"""The skeleton draft (`decode.draft_skeleton`): the main thread's next tokens, guessed from the promise list itself.

A forked answer's main thread writes its list one token a step: `\\n2.` `<|promise|>` `Set` `<|promise_end|>`,
`\\n3.` `<|promise|>` ... Most of those tokens follow from the list: after a topic token the promise may end, and
after a promise_end the next item's marker is the previous item's with its number one higher, then `<|promise|>`.
The asynchronous decoder feeds this guess as extra rows of the main thread's step, and the chooser keeps the guessed
tokens the model chooses anyway, then one more (speculative decoding with the grammar as the draft): a greedy answer
is the same token for token, in fewer steps, and a sampled one is distributed as without the draft (each main-thread
row draws from its own distribution, and a guess is kept when the draw is the guess). `scripts/skeleton_draft.py`
estimates what it saves on saved answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pasta.lang import TagIds

MAX_MARKER_TOKENS = 8  # a list's marker between two promises ("\n\n12. "); anything longer is text, not a skeleton


class SkeletonDraft:
    """The guess after the main thread's last token: `<|promise_end|>` after a topic token, and after a promise_end
    the marker that came before the promise just closed, its first number one higher, then `<|promise|>`."""

    def __init__(self, tag_ids: TagIds, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]]):
        self.tag_ids = tag_ids
        self.decode = decode
        self.encode = encode

    def __call__(self, main_ids: list[int], in_topic: bool) -> list[int]:
        """The draft after `main_ids` (the main thread's tokens so far, its last one to be fed next); `in_topic`:
        they end inside a promise's topic, with at least one topic token."""
        tags = self.tag_ids
        opened = max((i for i, t in enumerate(main_ids) if t == tags.promise), default=-1)
        if in_topic:
            return [tags.promise_end, *self._next_marker(main_ids, opened)]
        if main_ids and main_ids[-1] == tags.promise_end:
            return self._next_marker(main_ids, opened)
        return []

    def _next_marker(self, main_ids: list[int], opened: int) -> list[int]:
        """The marker between the promise opened at `opened` and the promise_end before it, its first number one
        higher, then `<|promise|>`; nothing when no promise_end comes before it or the gap is not a short marker."""
        tags = self.tag_ids
        ends = [i for i in range(opened) if main_ids[i] == tags.promise_end]
        gap = main_ids[ends[-1] + 1 : opened] if ends else []
        if not gap or len(gap) > MAX_MARKER_TOKENS or any(t in tags.all for t in gap):
            return []
        marker = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), self.decode(gap), count=1)
        return [*self.encode(marker), tags.promise]
