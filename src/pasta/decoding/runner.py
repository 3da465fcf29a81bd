"""The step loop of the asynchronous decoder: one forward per step for every live thread of every request.

Each step: every unfinished request's interpreter plans what it feeds (`Interpreter.plan`); the runner pads the
plans to one [B, q] block, places request b's rows at its own next cache slots (`SlotCache.begin_step`), builds
the additive mask [B, 1, q, kv] from the interpreters' visibility rows and runs the model once. A chooser
(sampling, or teacher forcing) picks the tokens from the logits of the rows that choose one and the interpreters
commit them. Finished requests leave the batch, so their rows stop costing compute.

Decode steps take the shapes of pasta/decoding/step.py's buckets (q padded, kv the used slots rounded up), so a
compiled step (`decode.compile`) reuses its graph; a step that feeds a prompt runs eagerly at its own length.

`StepBatch` holds those pieces, so that requests can also join and leave between steps (continuous batching, as
a server does); `run_steps` is the batch decoder's loop over it.

Padding rows see slot 0 only (a query that sees nothing turns softmax into NaN) and write beyond their request's
slot counter, where nothing real looks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from pasta.decoding.attention import grouped_query_sdpa
from pasta.decoding.cache import SlotCache
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.linears import multirow_linears
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward, bucket_rows, bucket_slots
from pasta.decoding.visibility import PAD_ROW

# (request index, logits [n, V] of its choosing rows, the thread of each row) -> the n chosen token ids
Chooser = Callable[[int, torch.Tensor, list[int]], list[int]]


@dataclass
class RequestClock:
    """Timings of one request inside a batch run."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    bookkeeping_s: float = 0.0

    def add_step(self, step_s: float, bookkeeping_s: float, *, prefill: bool) -> None:
        """A step this request took part in: its prefill (the first one) or a decode step."""
        if prefill:
            self.prefill_s += step_s
        else:
            self.decode_s += step_s
        self.bookkeeping_s += bookkeeping_s


def step_inputs(plans: list[StepPlan], interpreters: list[Interpreter], pad_id: int, num_rows: int,
                kv_length: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The forward's inputs for one step, each request's plan padded to `num_rows` rows: input_ids, position_ids
    [B, q] and the additive attention_mask [B, 1, q, kv] over the first `kv_length` slots."""
    token_rows, position_rows, visible_rows = [], [], []
    for plan, interpreter in zip(plans, interpreters, strict=True):
        num_pad = num_rows - len(plan.token_ids)
        token_rows.append(plan.token_ids + [pad_id] * num_pad)
        position_rows.append(plan.positions + [0] * num_pad)
        rows = torch.tensor(plan.rows + [PAD_ROW] * num_pad, device=interpreter.vis.device)
        visible_rows.append(interpreter.vis[rows, :kv_length])  # [q, kv]
    visible = torch.stack(visible_rows).to(device)  # [B, q, kv]
    # Row i of request b sees its thread's slots up to its own: the causal order among one step's new rows.
    starts = torch.tensor([p.start_slot for p in plans], device=device)
    last_visible = starts[:, None] + torch.arange(num_rows, device=device)  # [B, q]
    visible &= torch.arange(kv_length, device=device) <= last_visible[..., None]  # [B, q, kv]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return {
        "input_ids": torch.tensor(token_rows, device=device),  # [B, q]
        "position_ids": torch.tensor(position_rows, device=device),  # [B, q]
        "attention_mask": mask.unsqueeze(1),  # [B, 1, q, kv]
    }


def choosing_rows(plans: list[StepPlan], num_rows: int, device: torch.device) -> torch.Tensor:
    """The rows whose logits choose a token, as indices into the step's [B * q] rows, in request order."""
    return torch.tensor([b * num_rows + i for b, plan in enumerate(plans) for i in plan.sample_feeds],
                        device=device)  # [n]


class StepBatch:
    """Requests decoded together: one SlotCache (a batch row per request), one forward per step.

    A step: the caller plans every member (`Interpreter.plan`, or `PlainInterpreter.plan` for the sequential
    baseline), `prepare`s the inputs, runs `forward` for each member's logits, chooses tokens and commits them.
    Between steps members `join` (a new cache row; their prompt's prefill then rides in the same forward as the
    others' decode rows), arrive with the rows of a batch that ran their prefill (`merge`), and leave (`keep`, in
    order; `remove`, reordering), which is what continuous batching needs. An empty batch drops its cache.
    """

    def __init__(self, model, pad_id: int, step: StepForward | None = None):
        self.model = model
        self.pad_id = pad_id
        self.step = step or StepForward(model)
        self.device = model.device
        self.dtype = model.dtype if model.dtype.is_floating_point else torch.float32
        self.members: list[Interpreter] = []
        self.cache: SlotCache | None = None

    def join(self, interpreter: Interpreter, capacity: int) -> None:
        """Add a request; `capacity` sizes the cache when this one starts it (it grows on demand anyway)."""
        if self.cache is None:
            self.cache = SlotCache.for_model(self.model, capacity)
        else:
            self.cache.add_rows(1)
        self.members.append(interpreter)

    def merge(self, other: StepBatch) -> None:
        """Take over `other`'s members and cache rows (requests that ran their prefill in a batch of their own, so
        that a long prompt does not pad every running request's decode rows to its length); `other` is emptied."""
        if not other.members:
            return
        if self.cache is None:
            self.cache = other.cache
        else:
            self.cache.merge(other.cache)
        self.members += other.members
        other.members, other.cache = [], None

    def remove(self, indices: list[int]) -> list[int]:
        """Drop these members; the last members move into the holes (one cache row copied per removal, where
        `keep` copies every row). Returns the new order: the old index of the member now at each position."""
        order = self.cache.remove(indices, len(self.members)) if indices else list(range(len(self.members)))
        self.members = [self.members[b] for b in order]
        if not self.members:
            self.cache = None
        return order

    def keep(self, indices: list[int]) -> None:
        """Keep these members (and their cache rows), in this order; the others leave."""
        self.members = [self.members[b] for b in indices]
        if not self.members:
            self.cache = None
        else:
            self.cache.keep(indices)

    def prepare(self, plans: list[StepPlan]) -> dict[str, torch.Tensor]:
        """Place each member's planned rows at its next cache slots; the forward's inputs. A step that feeds a
        prompt keeps its own shape; a decode step takes its row and slot buckets (pasta/decoding/step.py)."""
        prefill = any(p.prefill for p in plans)
        num_rows = max(len(p.token_ids) for p in plans)
        kv_length = max(p.start_slot for p in plans) + num_rows  # the slots used once this step's rows are in
        if not prefill:
            num_rows, kv_length = bucket_rows(num_rows), bucket_slots(kv_length)
        self.cache.begin_step([p.start_slot for p in plans], num_rows, kv_length, self.device)
        for interpreter in self.members:
            interpreter.ensure_capacity(self.cache.capacity)
        inputs = step_inputs(plans, self.members, self.pad_id, num_rows, kv_length, self.dtype, self.device)
        if prefill:
            keep = torch.zeros(len(plans), num_rows, dtype=torch.bool)
            for b, plan in enumerate(plans):
                keep[b, plan.sample_feeds] = True
            inputs["logits_to_keep"] = keep.to(self.device)  # [B, q]: the prompt's other rows need no logits
        else:
            inputs["choosing_rows"] = choosing_rows(plans, num_rows, self.device)
        return inputs

    @torch.inference_mode()
    def forward(self, inputs: dict[str, torch.Tensor], plans: list[StepPlan]) -> list[torch.Tensor]:
        """One forward for every member; member b's logits [len(plans[b].sample_feeds), V]."""
        rows = {name: inputs[name] for name in ("input_ids", "position_ids", "attention_mask")}
        if "logits_to_keep" in inputs:
            logits = self.step.prefill(self.cache, **rows, logits_to_keep=inputs["logits_to_keep"])  # [n, V]
        else:
            logits = self.step.decode(self.cache, **rows)  # [B, q, V]
            logits = logits.flatten(0, 1).index_select(0, inputs["choosing_rows"])  # [n, V]
        offsets = [0]
        for plan in plans:
            offsets.append(offsets[-1] + len(plan.sample_feeds))
        return [logits[offsets[b] : offsets[b + 1]] for b in range(len(plans))]


@torch.inference_mode()
def run_steps(model, interpreters: list[Interpreter], choose: Chooser, pad_id: int,
              clocks: list[RequestClock]) -> Iterator[list[int]]:
    """Decode every request until its interpreter is done; yields the requests that took part in each step."""
    config = interpreters[0].config
    capacity = max(len(i.prompt_ids) for i in interpreters) + config.max_new_tokens + 64
    batch = StepBatch(model, pad_id, StepForward(model, compile=config.compile, mode=config.compile_mode))
    for interpreter in interpreters:
        batch.join(interpreter, capacity)
    active = list(range(len(interpreters)))
    first = True
    with grouped_query_sdpa(model), ExitStack() as decode_kernels:
        while active:
            started = time.perf_counter()
            plans = [interpreter.plan() for interpreter in batch.members]
            inputs = batch.prepare(plans)
            planned = time.perf_counter()

            logits = batch.forward(inputs, plans)
            chosen = [choose(r, rows, plan.sample_threads)
                      for r, rows, plan in zip(active, logits, plans, strict=True)]
            sampled = time.perf_counter()

            for interpreter, plan, token_ids in zip(batch.members, plans, chosen, strict=True):
                interpreter.commit(plan, token_ids)
            finished = time.perf_counter()

            bookkeeping = (planned - started) + (finished - sampled)
            for r in active:
                clocks[r].add_step(finished - started, bookkeeping, prefill=first)
            if first:  # the prompt's prefill ran on transformers' own linears, as generate's does
                decode_kernels.enter_context(multirow_linears(model, enabled=config.cpu_multirow_linears))
            first = False
            stepped = active
            keep = [b for b, r in enumerate(active) if not interpreters[r].done]
            if len(keep) < len(active):
                active = [active[b] for b in keep]
                batch.keep(keep)
            yield stepped
