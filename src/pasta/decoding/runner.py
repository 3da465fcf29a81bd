"""The step loop of the asynchronous decoder: one forward per step for every live thread of every request.

Each step: every unfinished request's interpreter plans what it feeds (`Interpreter.plan`); the runner pads the
plans to one [B, q] block, places request b's rows at its own next cache slots (`SlotCache.begin_step`), builds
the additive mask [B, 1, q, used] from the interpreters' visibility rows and runs the model once, keeping logits
only for the rows that choose a token. A chooser (sampling, or teacher forcing) picks the tokens and the
interpreters commit them. Finished requests leave the batch, so their rows stop costing compute.

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
from pasta.decoding.interpreter import PAD_ROW, Interpreter, StepPlan
from pasta.decoding.linears import multirow_linears

# (request index, logits [n, V] of its choosing rows, the thread of each row) -> the n chosen token ids
Chooser = Callable[[int, torch.Tensor, list[int]], list[int]]


@dataclass
class RequestClock:
    """Timings of one request inside a batch run."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    bookkeeping_s: float = 0.0


def step_inputs(plans: list[StepPlan], interpreters: list[Interpreter], pad_id: int, used_length: int,
                dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The forward's inputs for one step: input_ids, position_ids [B, q], attention_mask [B, 1, q, used] and
    logits_to_keep [B, q] (bool: the rows that choose a token)."""
    num_new = max(len(p.token_ids) for p in plans)
    token_rows, position_rows, keep_rows, visible_rows = [], [], [], []
    for plan, interpreter in zip(plans, interpreters, strict=True):
        num_pad = num_new - len(plan.token_ids)
        token_rows.append(plan.token_ids + [pad_id] * num_pad)
        position_rows.append(plan.positions + [0] * num_pad)
        keep = [False] * num_new
        for index in plan.sample_feeds:
            keep[index] = True
        keep_rows.append(keep)
        rows = torch.tensor(plan.rows + [PAD_ROW] * num_pad, device=interpreter.vis.device)
        visible_rows.append(interpreter.vis[rows, :used_length])  # [q, used]
    visible = torch.stack(visible_rows).to(device)  # [B, q, used]
    # Row i of request b sees its thread's slots up to its own: the causal order among one step's new rows.
    starts = torch.tensor([p.start_slot for p in plans], device=device)
    last_visible = starts[:, None] + torch.arange(num_new, device=device)  # [B, q]
    visible &= torch.arange(used_length, device=device) <= last_visible[..., None]  # [B, q, used]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return {
        "input_ids": torch.tensor(token_rows, device=device),  # [B, q]
        "position_ids": torch.tensor(position_rows, device=device),  # [B, q]
        "attention_mask": mask.unsqueeze(1),  # [B, 1, q, used]
        "logits_to_keep": torch.tensor(keep_rows, device=device),  # [B, q]
    }


@torch.inference_mode()
def run_steps(model, interpreters: list[Interpreter], choose: Chooser, pad_id: int,
              clocks: list[RequestClock]) -> Iterator[list[int]]:
    """Decode every request until its interpreter is done; yields the requests that took part in each step."""
    device = model.device
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    capacity = max(len(i.prompt_ids) for i in interpreters) + interpreters[0].config.max_new_tokens + 64
    cache = SlotCache.for_model(model, capacity)
    active = list(range(len(interpreters)))
    first = True
    with grouped_query_sdpa(model), ExitStack() as decode_kernels:
        while active:
            started = time.perf_counter()
            members = [interpreters[r] for r in active]
            plans = [interpreter.plan() for interpreter in members]
            num_new = max(len(p.token_ids) for p in plans)
            cache.begin_step([p.start_slot for p in plans], num_new, device)
            for interpreter in members:
                interpreter.ensure_capacity(cache.capacity)
            inputs = step_inputs(plans, members, pad_id, cache.used_length, dtype, device)
            planned = time.perf_counter()

            logits = model(**inputs, past_key_values=cache, use_cache=True).logits  # [num kept rows, V]
            offset = 0
            chosen = []
            for r, plan in zip(active, plans, strict=True):
                num_rows = len(plan.sample_feeds)
                chosen.append(choose(r, logits[offset : offset + num_rows], plan.sample_threads))
                offset += num_rows
            sampled = time.perf_counter()

            for interpreter, plan, token_ids in zip(members, plans, chosen, strict=True):
                interpreter.commit(plan, token_ids)
            finished = time.perf_counter()

            bookkeeping = (planned - started) + (finished - sampled)
            for r in active:
                clock = clocks[r]
                clock.bookkeeping_s += bookkeeping
                if first:
                    clock.prefill_s = finished - started
                else:
                    clock.decode_s += finished - started
            if first:  # the prompt's prefill ran on transformers' own linears, as generate's does
                decode_kernels.enter_context(
                    multirow_linears(model, enabled=interpreters[0].config.cpu_multirow_linears))
            first = False
            stepped = active
            keep = [b for b, r in enumerate(active) if not interpreters[r].done]
            if len(keep) < len(active):
                active = [active[b] for b in keep]
                if keep:
                    cache.keep(keep)
            yield stepped
