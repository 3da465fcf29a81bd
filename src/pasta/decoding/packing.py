"""One ragged step: the rows every request feeds, packed into one [1, N] block, and how attention unpacks them.

A step feeds a different number of rows per request: one for a plain answer, one per live thread for a PASTA
answer (plus a promise's opener rows at a fork and the closing rows at a join), a whole prompt for a newcomer.
Padding every request to the widest one ([B, q]) made the linear layers, a step's dominant cost, run on B * q rows:
one request running 8 threads made 16 requests feed 128 rows instead of 23. Here the model runs on input_ids and
position_ids [1, N], N the rows the requests actually feed, one request after another: every linear layer, norm and
RoPE sees real rows only, each with its own position.

Attention is the one place that needs per-request structure, and the choice is where the keys live:

- one cache row per request (pasta/decoding/cache.py, [B, H_kv, C, D]), kept: the packed keys and values are
  written into their request's row at their slots (`row_ids`, `slot_ids` [1, N]), and pasta/decoding/attention.py's
  ragged attention gathers the packed queries into per-request blocks, attends each against its own request's row
  and scatters the outputs back;
- a pool of slots shared by every request (vLLM's paged layout) would put every request's keys in one row, so that
  each packed query attends over all of them, masked: B times the attention work and a [N, B * C] mask per step.
  A pool pays off with a paged-attention kernel that reads only a request's own blocks; PyTorch's SDPA has none.

So the cache keeps a row per request, and padding exists only inside attention, where the queries gather into
groups (`AttentionGroup`), one SDPA call each:

- the narrow group: every request's first `w` rows, against the cache rows as they lie (a view, no copy);
- the wide group: the rows beyond `w` of the requests that feed more (a fork's threads), against a gathered copy
  of those requests' cache rows;
- a prompt (a request's prefill, a length of its own) alone, against its own cache row, over its own slots,
  causal from its first slot: no mask (SDPA's `is_causal`).

A step of one request is one group of its rows as they lie (no gathering); when it feeds one row that sees every
slot of its request (`StepPlan.causal`: the sequential baseline, an answer that has not forked) it needs no mask
either. So the sequential baseline steps as `generate` attends. Every mask is `_visible`'s table (what each row
sees) through pasta/lang/mask.py's one conversion.

A model whose layers slide (`window`, pasta/decoding/attention.py's `attention_window`) gets one more mask per group
beside it, of the same shape: that table narrowed to the window over positions (`within_window`: a query's position
against each slot's, the request's `slot_positions`), which the sliding layers attend with, the mask-free groups
included. It is built only where the window hides something (some query of the group at a position >= the window);
elsewhere, and on every step of a model without a window, the groups are exactly the ones above.

`w` is chosen per step to minimise the padded query rows, counting each gathered cache row as GATHER_COST_ROWS query
rows: when one request feeds 8 rows and fifteen feed 1, the queries are 16 * 1 + 7 instead of 16 * 8.
Eager steps take every size exactly (N, w and the attended slots: the used ones). A compiled step (`decode.compile`,
pasta/decoding/step.py) takes the narrow group alone, its width, N and the attended slots padded to the buckets
below (`bucket_rows`, `bucket_slots`), so that its graphs serve step after step; its padding rows write the cache's
spare slot, which nothing reads, and their outputs are never read either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pasta.decoding.attention import AttentionGroup, RaggedAttention
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.visibility import PAD_ROW
from pasta.lang import additive_mask, within_window

MAX_EXACT_ROWS = 8
SLOT_BUCKET = 256

# A gathered cache row is a copy of a request's keys and values (read and written once), where one more query row
# of a view only reads them again: about as much memory traffic as two query rows' attention on CPU.
GATHER_COST_ROWS = 2


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def bucket_rows(num_rows: int) -> int:
    """The rows a compiled step feeds for `num_rows` real ones: the count itself up to MAX_EXACT_ROWS, then the
    next multiple of it (pasta/decoding/step.py says why)."""
    return num_rows if num_rows <= MAX_EXACT_ROWS else _round_up(num_rows, MAX_EXACT_ROWS)


def bucket_slots(num_slots: int) -> int:
    """The cache slots a compiled step that uses `num_slots` of them attends over: the next multiple of
    SLOT_BUCKET."""
    return _round_up(num_slots, SLOT_BUCKET)


@dataclass(frozen=True)
class PackedStep:
    """The forward's inputs for one packed step, and where its rows go in the cache."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    row_ids: torch.Tensor  # [1, N]: the cache row of each packed row
    slot_ids: torch.Tensor  # [1, N]: its slot in that row
    kv_length: int  # cache slots attention reads (every group covers at most these)
    seq_length: int  # the largest first slot among the requests (transformers' `get_seq_length`)
    ragged: RaggedAttention
    sample_rows: list[int]  # the packed rows whose logits choose a token, in request order
    bucketed: bool  # a compiled step's shapes: every row's logits are computed, `sample_rows` picks them
    num_rows: int  # rows the requests feed (N less a compiled step's padding)
    num_slots: int  # slots attended, every request's own summed (its plan's start slot + rows)
    prefill: bool  # a request's prompt is among the rows

    @property
    def logits_to_keep(self) -> int | torch.Tensor:
        """The rows an eager forward computes logits for (only those go through the lm_head): the last n rows when
        those are the choosing ones (a step of one thread), else a bool mask [1, N] of the choosing rows."""
        num_rows, sample_rows = self.input_ids.shape[1], self.sample_rows
        if sample_rows and sample_rows == list(range(num_rows - len(sample_rows), num_rows)):
            return len(sample_rows)
        keep = torch.zeros(self.input_ids.shape, dtype=torch.bool, device=self.input_ids.device)  # [1, N]
        keep[0, sample_rows] = True
        return keep


@dataclass(frozen=True)
class _Request:
    """Where one request's plan lies in the packed block."""

    index: int  # its cache row, its position in the batch
    plan: StepPlan
    visible: torch.Tensor  # [R, C] its visibility table
    first_row: int  # its first packed row
    positions: torch.Tensor | None  # [C] the position of each of its slots (a model whose layers slide), or None

    @property
    def num_rows(self) -> int:
        return len(self.plan.token_ids)

    @property
    def used_slots(self) -> int:
        return self.plan.start_slot + self.num_rows


def narrow_width(row_counts: list[int], num_cache_rows: int) -> int:
    """The narrow group's width for requests feeding these numbers of rows (every cache row takes part in the
    narrow group, `num_cache_rows` of them): the width with the fewest query rows, the wide group's included."""
    widest = max(row_counts)

    def cost(width: int) -> int:
        num_wide = sum(1 for count in row_counts if count > width)
        return num_cache_rows * width + num_wide * (widest - width + GATHER_COST_ROWS)

    return min(sorted({count for count in row_counts if count > 0}) or [1], key=cost)


def _visible(requests: list[tuple[_Request, list[int]]], width: int, kv_length: int,
             device: torch.device) -> torch.Tensor:
    """What each query of a group sees, bool [G, w, kv]: request g's query j is its row rows_g[j] (padding beyond
    them). A row sees its thread's slots up to its own (the causal order among one step's rows of a thread); a
    padding row sees slot 0 only (PAD_ROW)."""
    blocks = []
    for request, rows in requests:
        plan = request.plan
        num_pad = width - len(rows)
        table_rows = torch.tensor([plan.rows[i] for i in rows] + [PAD_ROW] * num_pad, device=request.visible.device)
        # The last slot each query may see: its own; padding rows are cut by their table row already.
        limits = torch.tensor([plan.start_slot + i for i in rows] + [kv_length] * num_pad, device=device)
        blocks.append(request.visible[table_rows, :kv_length]
                      & (torch.arange(kv_length, device=device) <= limits[:, None]))  # [w, kv]
    return torch.stack(blocks)


def _window_cuts(requests: list[tuple[_Request, list[int]]], window: int | None) -> bool:
    """Whether the window hides any slot from a query of the group: only a query at a position >= the window can
    lose one (positions start at 0)."""
    return window is not None and any(r.plan.positions[i] >= window for r, rows in requests for i in rows)


def _within(requests: list[tuple[_Request, list[int]]], width: int, kv_length: int, window: int,
            device: torch.device) -> torch.Tensor:
    """Which slots each query of a group keeps under the window, bool [G, w, kv] (pasta/lang/mask.py's rule over
    the queries' positions and the slots'); a padding query sits at position 0, keeping its slot 0."""
    blocks = []
    for request, rows in requests:
        query_positions = [request.plan.positions[i] for i in rows] + [0] * (width - len(rows))
        blocks.append(within_window(torch.tensor(query_positions, device=device), request.positions[:kv_length],
                                    window))  # [w, kv]
    return torch.stack(blocks)


def _mask(requests: list[tuple[_Request, list[int]]], width: int, kv_length: int, dtype: torch.dtype,
          device: torch.device, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The additive mask [G, 1, w, kv] of a group (`_visible`), and its window mask (None where the window hides
    nothing)."""
    visible = _visible(requests, width, kv_length, device)
    mask = additive_mask(visible, dtype).unsqueeze(1)  # [G, 1, w, kv]
    if not _window_cuts(requests, window):
        return mask, None
    return mask, additive_mask(visible & _within(requests, width, kv_length, window, device), dtype).unsqueeze(1)


def _window_mask(requests: list[tuple[_Request, list[int]]], width: int, kv_length: int, dtype: torch.dtype,
                 device: torch.device, window: int | None) -> torch.Tensor | None:
    """The window mask [G, 1, w, kv] of a group that needs no mask otherwise (a prompt, a lone row that sees every
    slot), or None where the window hides nothing (always, without a window)."""
    if not _window_cuts(requests, window):
        return None
    visible = _visible(requests, width, kv_length, device) & _within(requests, width, kv_length, window, device)
    return additive_mask(visible, dtype).unsqueeze(1)


class _Groups:
    """The groups of one step, built one after another, and each packed row's place in their outputs."""

    def __init__(self, num_packed_rows: int, device: torch.device, window: int | None):
        self.device = device
        self.window = window
        self.groups: list[AttentionGroup] = []
        self.output_index = [0] * num_packed_rows  # padding rows of a bucketed step keep 0: never read
        self.num_outputs = 0

    def add(self, requests: list[tuple[_Request, list[int]]], width: int, kv_length: int, cache_rows,
            dtype: torch.dtype) -> None:
        """A group of these requests' rows (request, its row indices), `width` query rows each."""
        query_index = []
        for g, (request, rows) in enumerate(requests):
            packed = [request.first_row + i for i in rows]
            for j, row in enumerate(packed):
                self.output_index[row] = self.num_outputs + g * width + j
            query_index.append(packed + [0] * (width - len(packed)))
        mask, window_mask = _mask(requests, width, kv_length, dtype, self.device, self.window)  # [G, 1, w, kv]
        self.groups.append(AttentionGroup(
            query_index=torch.tensor(query_index, device=self.device),  # [G, w]
            mask=mask,
            num_slots=kv_length,
            cache_rows=cache_rows,
            window_mask=window_mask,
        ))
        self.num_outputs += len(requests) * width

    def add_prompt(self, request: _Request, dtype: torch.dtype) -> None:
        """A prompt's rows, alone against its own cache row: causal from its first slot, no mask (but the window's)."""
        assert request.plan.causal and request.plan.start_slot == 0, "a prompt is fed from its request's first slot"
        packed = list(range(request.first_row, request.first_row + request.num_rows))
        for j, row in enumerate(packed):
            self.output_index[row] = self.num_outputs + j
        rows = list(range(request.num_rows))
        self.groups.append(AttentionGroup(
            query_index=torch.tensor([packed], device=self.device),  # [1, S]
            mask=None, num_slots=request.used_slots, cache_rows=request.index, causal=request.num_rows > 1,
            window_mask=_window_mask([(request, rows)], request.num_rows, request.used_slots, dtype, self.device,
                                     self.window),
        ))
        self.num_outputs += request.num_rows

    def ragged(self) -> RaggedAttention:
        return RaggedAttention(self.groups, torch.tensor(self.output_index, device=self.device), self.window)


def _alone(request: _Request, dtype: torch.dtype, device: torch.device, window: int | None) -> RaggedAttention:
    """The attention of a step with one request (not compiled): its rows as they lie, one group, no gathering; no
    mask when its rows are causal from slot 0 (a prompt) or are one row that sees every slot (but the window's)."""
    plan = request.plan
    rows = list(range(request.num_rows))
    used = request.used_slots
    if plan.causal and (plan.start_slot == 0 or request.num_rows == 1):
        group = AttentionGroup(None, None, used, causal=plan.start_slot == 0 and request.num_rows > 1,
                               window_mask=_window_mask([(request, rows)], request.num_rows, used, dtype, device,
                                                        window))
    else:
        mask, window_mask = _mask([(request, rows)], request.num_rows, used, dtype, device, window)
        group = AttentionGroup(None, mask, used, window_mask=window_mask)
    return RaggedAttention([group], None, window)


def pack_step(plans: list[StepPlan], visibility: list[torch.Tensor], pad_id: int, *, capacity: int, bucketed: bool,
              dtype: torch.dtype, device: torch.device, window: int | None = None,
              slot_positions: list[torch.Tensor] | None = None) -> PackedStep:
    """Request b's plan (its cache row b, its visibility table `visibility[b]`) packed with the others'. `bucketed`
    (a compiled decode step, no prompt in it): one group, sizes in step.py's buckets, padding rows written at slot
    `capacity` (the cache's spare one). `window`: the model's sliding window (None: no layer slides), applied over
    request b's `slot_positions[b]` [C]."""
    if window is not None and slot_positions is None:
        raise ValueError("a step packed for a sliding window needs each request's slot positions")
    requests, first_row = [], 0
    for b, (plan, visible) in enumerate(zip(plans, visibility, strict=True)):
        requests.append(_Request(b, plan, visible, first_row, None if window is None else slot_positions[b]))
        first_row += len(plan.token_ids)
    num_rows = bucket_rows(first_row) if bucketed else first_row
    num_pad = num_rows - first_row
    token_ids = [t for r in requests for t in r.plan.token_ids] + [pad_id] * num_pad
    positions = [p for r in requests for p in r.plan.positions] + [0] * num_pad
    row_ids = [r.index for r in requests for _ in range(r.num_rows)] + [0] * num_pad
    slot_ids = [r.plan.start_slot + i for r in requests for i in range(r.num_rows)] + [capacity] * num_pad

    prompts = [r for r in requests if r.plan.prefill]
    others = [r for r in requests if not r.plan.prefill]
    kv_length = max(r.used_slots for r in requests)
    if len(requests) == 1 and not bucketed:
        ragged = _alone(requests[0], dtype, device, window)
    else:
        ragged = _grouped(requests, prompts, others, num_rows, kv_length, bucketed, dtype, device, window)
        if bucketed:
            kv_length = bucket_slots(kv_length)

    fed = torch.tensor([token_ids, positions, row_ids, slot_ids], device=device)  # [4, N]: one copy to the device
    return PackedStep(
        input_ids=fed[0:1],
        position_ids=fed[1:2],
        row_ids=fed[2:3],
        slot_ids=fed[3:4],
        kv_length=kv_length,
        seq_length=max(r.plan.start_slot for r in requests),
        ragged=ragged,
        sample_rows=[r.first_row + i for r in requests for i in r.plan.sample_feeds],
        bucketed=bucketed,
        num_rows=first_row,
        num_slots=sum(r.used_slots for r in requests),
        prefill=bool(prompts),
    )


def _grouped(requests: list[_Request], prompts: list[_Request], others: list[_Request], num_rows: int,
             kv_length: int, bucketed: bool, dtype: torch.dtype, device: torch.device,
             window: int | None) -> RaggedAttention:
    """The groups of a step with several requests, or of a compiled one: the narrow and wide groups of the decode
    rows, each prompt alone."""
    groups = _Groups(num_rows, device, window)
    if others:
        counts = [r.num_rows for r in others]
        if bucketed:
            width = bucket_rows(max(counts))
            kv_length = bucket_slots(kv_length)
        else:
            width = narrow_width(counts, len(requests))
        slots = kv_length if bucketed else max(r.used_slots for r in others)
        prompt_rows = {r.index for r in prompts}
        narrow = [(r, [] if r.index in prompt_rows else list(range(min(r.num_rows, width)))) for r in requests]
        groups.add(narrow, width, slots, None, dtype)
        wide = [(r, list(range(width, r.num_rows))) for r in others if r.num_rows > width]
        if wide:
            cache_rows = torch.tensor([r.index for r, _ in wide], device=device)
            groups.add(wide, max(len(rows) for _, rows in wide), slots, cache_rows, dtype)
    for r in prompts:
        groups.add_prompt(r, dtype)
    return groups.ragged()
