"""The PASTA-LANG training layout: one sequence holding every thread, with the mask, positions and targets that
make a single forward pass see exactly what the asynchronous decoder will see.

Rows follow the canonical inline order: the prompt, the main thread, and each group's chunks (opener, then body)
right before the group's `<|sync|>` (or after the last main token). The rules, from the language definition:
- visibility: a main-thread token sees the prompt, the main thread up to itself, and every chunk joined by a sync
  at or before it; a chunk token sees what its promise's `<|promise_end|>` sees, that token, and its own chunk up
  to itself. So main tokens between a promise and the next sync see no chunk, and chunks never see each other
  unless an earlier sync joined them into the main thread;
- positions: the main thread counts on from the prompt; a chunk starts right after its `<|promise_end|>`; after a
  promise the main thread skips the positions reserved for that chunk (`ReservationPolicy`);
- targets: `target_ids[i]` is the token row i's logits must predict (its successor in its own thread), or -100.
  Trained: the main thread (tags and eos included) and each chunk's body (content and `<|async_end|>`); not
  trained: the prompt and the decoder-supplied opener. The first response token is predicted from the last prompt
  row, a chunk's first content token from its opener's last row.

Targets are already aligned to their rows: the usual "labels shifted by one" convention cannot express a layout
whose threads interleave. Pass them to a transformers causal LM as `shift_labels` (or compute the loss directly).

The mask is every layer's. A layer with a sliding window narrows it to the window over the layout's positions
(pasta/lang/mask.py's `windowed_mask`), as the decoder does: training does it in the attention function it installs
on a model some layer of which slides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pasta.lang.mask import additive_mask
from pasta.lang.reservation import ReservationPolicy
from pasta.lang.tokens import TokenChunk, TokenDoc

IGNORE_INDEX = -100
PROMPT_THREAD = -1
MAIN_THREAD = 0  # chunk k (0-based, in promise order) is thread k + 1


@dataclass(frozen=True)
class Layout:
    input_ids: list[int]  # [S]
    position_ids: list[int]  # [S]
    target_ids: list[int]  # [S] the token each row predicts, or IGNORE_INDEX
    thread_ids: list[int]  # [S] PROMPT_THREAD, MAIN_THREAD, or chunk index + 1
    visible: torch.Tensor  # [S, S] bool: row i may attend to column j
    num_prompt: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def attention_bias(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Additive float mask [S, S] (pasta/lang/mask.py)."""
        return additive_mask(self.visible, dtype)


class _LayoutFull(Exception):
    """Raised inside `build_layout` when the row limit is reached."""


def num_layout_rows(num_prompt_ids: int, doc: TokenDoc) -> int:
    """Rows of the whole layout: prompt, main thread, and every chunk's opener and body."""
    return num_prompt_ids + len(doc.main_ids) + sum(len(c.opener_ids) + len(c.body_ids) for c in doc.chunks)


def build_layout(
    prompt_ids: list[int], doc: TokenDoc, policy: ReservationPolicy, max_rows: int | None = None
) -> Layout:
    """The training layout of one example: prompt ids, then the response's threads.

    With `max_rows`, only the first `max_rows` rows are built (memory stays bounded by the limit, however long the
    response): exactly the first rows of the whole layout, a valid layout since a row sees only earlier rows. A
    kept row whose successor in its thread is cut keeps that successor as its target.
    """
    num_rows = num_layout_rows(len(prompt_ids), doc)
    if max_rows is not None:
        num_rows = min(num_rows, max_rows)
    builder = _LayoutBuilder(doc, num_rows)
    try:
        builder.add_prompt(prompt_ids)
        builder.add_response(len(prompt_ids), policy)
    except _LayoutFull:
        pass
    return builder.layout(min(len(prompt_ids), num_rows))


@dataclass(frozen=True)
class _Fork:
    """A chunk forked and not yet joined."""

    index: int  # the chunk's index in doc.chunks
    context: torch.Tensor  # [S] bool: what its promise_end row sees
    start: int  # the chunk's first position


class _LayoutBuilder:
    """The rows of one layout, added in the canonical inline order up to `num_rows` (then `_LayoutFull`)."""

    def __init__(self, doc: TokenDoc, num_rows: int):
        self.doc = doc
        self.num_rows = num_rows
        self.visible = torch.zeros(num_rows, num_rows, dtype=torch.bool)  # [S, S]
        self.input_ids: list[int] = []
        self.position_ids: list[int] = []
        self.target_ids: list[int] = []
        self.thread_ids: list[int] = []
        self.main_context = torch.zeros(num_rows, dtype=torch.bool)  # [S] what the next main-thread token sees
        self.outstanding: list[_Fork] = []
        self.last_main_row = -1  # the row whose logits predict the next main-thread token

    def add_row(self, token_id: int, position: int, thread: int, context: torch.Tensor) -> int:
        row = len(self.input_ids)
        if row == self.num_rows:
            raise _LayoutFull
        self.input_ids.append(token_id)
        self.position_ids.append(position)
        self.target_ids.append(IGNORE_INDEX)
        self.thread_ids.append(thread)
        self.visible[row] = context
        self.visible[row, row] = True
        return row

    def add_prompt(self, prompt_ids: list[int]) -> None:
        for position, token_id in enumerate(prompt_ids):
            self.main_context[self.add_row(token_id, position, PROMPT_THREAD, self.main_context)] = True
        self.last_main_row = len(prompt_ids) - 1

    def add_response(self, position: int, policy: ReservationPolicy) -> None:
        """The main thread from `position` on, each group's chunks emitted at its sync (or at the end)."""
        fork_order = iter(range(len(self.doc.chunks)))
        for token_id in self.doc.main_ids:
            if self.last_main_row >= 0:
                self.target_ids[self.last_main_row] = token_id
            if token_id == self.doc.tag_ids.sync:
                self.emit_chunks()
            row = self.add_row(token_id, position, MAIN_THREAD, self.main_context)
            self.main_context[row] = True
            self.last_main_row = row
            position += 1
            if token_id == self.doc.tag_ids.promise_end:
                index = next(fork_order)
                chunk = self.doc.chunks[index]
                self.outstanding.append(_Fork(index, self.visible[row].clone(), position))
                position += policy.span(len(chunk.opener_ids), chunk.num_predicted)
        self.emit_chunks()

    def emit_chunks(self) -> None:
        """The rows of every outstanding chunk, which the main thread then sees (joined)."""
        for fork in self.outstanding:
            chunk: TokenChunk = self.doc.chunks[fork.index]
            context = fork.context.clone()
            previous = -1
            for offset, token_id in enumerate(chunk.opener_ids + chunk.body_ids):
                if offset >= len(chunk.opener_ids):
                    self.target_ids[previous] = token_id  # body tokens are trained; opener tokens are given
                row = self.add_row(token_id, fork.start + offset, fork.index + 1, context)
                context[row] = True
                self.main_context[row] = True  # joined: the main thread goes on after these rows only at a sync
                previous = row
        self.outstanding.clear()

    def layout(self, num_prompt: int) -> Layout:
        return Layout(
            self.input_ids, self.position_ids, self.target_ids, self.thread_ids, self.visible, num_prompt
        )


def row_targets(num_prompt_ids: int, doc: TokenDoc) -> list[int]:
    """`build_layout(...).target_ids` of the whole layout, without building its mask: what a cut at some row
    leaves out of training can be counted for any length of response."""
    targets = [IGNORE_INDEX] * num_prompt_ids
    pending: list[TokenChunk] = []

    def emit_chunks() -> None:
        for chunk in pending:
            # A chunk's rows predict its body: the opener's last row the first body token, and so on.
            targets.extend([IGNORE_INDEX] * (len(chunk.opener_ids) - 1))
            targets.extend(chunk.body_ids)
            targets.append(IGNORE_INDEX)  # the body's last token (<|async_end|>) ends the thread
        pending.clear()

    last_main_row = num_prompt_ids - 1
    chunks = iter(doc.chunks)
    for token_id in doc.main_ids:
        if last_main_row >= 0:
            targets[last_main_row] = token_id
        if token_id == doc.tag_ids.sync:
            emit_chunks()
        last_main_row = len(targets)
        targets.append(IGNORE_INDEX)
        if token_id == doc.tag_ids.promise_end:
            pending.append(next(chunks))
    emit_chunks()
    return targets


def collate_layouts(
    layouts: list[Layout], pad_id: int, dtype: torch.dtype = torch.float32, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad a batch. Returns input_ids, position_ids, target_ids, thread_ids [B, S] and the additive
    attention_mask [B, 1, S, S]. A padded row sees only itself (a row that sees nothing turns softmax into NaN) and
    no real row sees a pad."""
    num_rows = max([len(layout) for layout in layouts] + [pad_to or 0])
    batch = len(layouts)
    input_ids = torch.full((batch, num_rows), pad_id, dtype=torch.long)
    position_ids = torch.zeros((batch, num_rows), dtype=torch.long)
    target_ids = torch.full((batch, num_rows), IGNORE_INDEX, dtype=torch.long)
    thread_ids = torch.full((batch, num_rows), PROMPT_THREAD, dtype=torch.long)
    visible = torch.eye(num_rows, dtype=torch.bool).repeat(batch, 1, 1)  # [B, S, S]
    for b, layout in enumerate(layouts):
        n = len(layout)
        input_ids[b, :n] = torch.tensor(layout.input_ids)
        position_ids[b, :n] = torch.tensor(layout.position_ids)
        target_ids[b, :n] = torch.tensor(layout.target_ids)
        thread_ids[b, :n] = torch.tensor(layout.thread_ids)
        visible[b, :n, :n] = layout.visible
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "target_ids": target_ids,
        "thread_ids": thread_ids,
        "attention_mask": additive_mask(visible, dtype).unsqueeze(1),  # [B, 1, S, S]
    }


def sequence_logprobs(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Per-row log-probability of each row's target [B, S] (0 where the target is IGNORE_INDEX)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, S, V]
    safe_targets = target_ids.clamp(min=0)
    picked = logprobs.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)  # [B, S]
    return picked.masked_fill(target_ids == IGNORE_INDEX, 0.0)
