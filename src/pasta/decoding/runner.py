"""The step loop of the asynchronous decoder: one forward per step for every live thread of every request.

Each step: every unfinished request's interpreter plans what it feeds (`Interpreter.plan`); the runner packs the
plans into one ragged block (pasta/decoding/packing.py: input_ids and position_ids [1, N], N the rows the requests
actually feed, each row written at its own request's next cache slot and attending through the ragged attention of
pasta/decoding/attention.py with its request's visibility rows) and runs the model once. A chooser (sampling, or
teacher forcing) picks the tokens from the logits of the rows that choose one and the interpreters commit them.
Finished requests leave the batch, so their rows stop costing compute.

Compiled decode steps (`decode.compile`) take the shapes of pasta/decoding/step.py's buckets, so that they reuse
their graph; eager steps, and every step that feeds a prompt, take their exact sizes.

`StepBatch` holds those pieces, so that requests can also join and leave between steps (continuous batching, as a
server does: a newcomer's prompt rides in the same forward as the others' decode rows); `run_steps` is the batch
decoder's loop over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from pasta.decoding.attention import ragged_attention
from pasta.decoding.cache import SlotCache
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.linears import multirow_linears
from pasta.decoding.packing import PackedStep, pack_step
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward, bucket_slots

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


class StepBatch:
    """Requests decoded together: one SlotCache (a cache row per request), one packed forward per step.

    A step: the caller plans every member (`Interpreter.plan`, or `PlainInterpreter.plan` for the sequential
    baseline), `prepare`s the packed inputs, runs `forward` for each member's logits, chooses tokens and commits
    them. Between steps members `join` (a new cache row; their prompt's prefill then rides in the same forward as the
    others' decode rows) and leave (`keep`, in order; `remove`, reordering), which is what continuous batching
    needs. An empty batch drops its cache. The model must attend with pasta/decoding/attention.py's
    `ragged_attention` while it steps.
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

    def remove(self, indices: list[int]) -> list[int]:
        """Drop these members; the last members move into the holes (one cache row copied per removal, where
        `keep` copies every row). Returns the new order: the old index of the member now at each position."""
        order = self.cache.remove(indices) if indices else list(range(len(self.members)))
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

    def prepare(self, plans: list[StepPlan]) -> PackedStep:
        """Pack the members' planned rows (pasta/decoding/packing.py) and place each at its request's next cache
        slots. A compiled decode step takes step.py's buckets; every other step its exact sizes."""
        bucketed = self.step.compiled and not any(p.prefill for p in plans)
        used = max(p.start_slot + len(p.token_ids) for p in plans)
        self.cache.reserve(bucket_slots(used) if bucketed else used)
        for interpreter in self.members:
            interpreter.ensure_capacity(self.cache.capacity)
        packed = pack_step(plans, [i.vis for i in self.members], self.pad_id, capacity=self.cache.capacity,
                           bucketed=bucketed, dtype=self.dtype, device=self.device)
        self.cache.place(packed.row_ids, packed.slot_ids, packed.kv_length, packed.seq_length)
        return packed

    @torch.inference_mode()
    def forward(self, packed: PackedStep, plans: list[StepPlan]) -> list[torch.Tensor]:
        """One forward for every member; member b's logits [len(plans[b].sample_feeds), V]."""
        sample_rows = torch.tensor(packed.sample_rows, device=self.device)  # [n]
        if packed.bucketed:  # a compiled step computes every row's logits: its graph does not depend on which
            logits = self.step.decode(self.cache, packed.input_ids, packed.position_ids, None, packed.ragged)
            logits = logits[0].index_select(0, sample_rows)  # [n, V]
        else:
            keep = torch.zeros(packed.input_ids.shape, dtype=torch.bool, device=self.device)  # [1, N]
            keep[0, sample_rows] = True  # only the choosing rows go through the lm_head
            logits = self.step.eager(self.cache, packed.input_ids, packed.position_ids, None, keep,
                                     packed.ragged)  # [n, V]
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
    with ragged_attention(model), ExitStack() as decode_kernels:
        while active:
            started = time.perf_counter()
            plans = [interpreter.plan() for interpreter in batch.members]
            packed = batch.prepare(plans)
            planned = time.perf_counter()

            logits = batch.forward(packed, plans)
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
