"""Measuring the cost model (pasta.decoding.cost_model: a step's cost by the rows it feeds, the requests they belong
to and the cache they attend) by running the real step (`runner.StepBatch.step`).

    costs = measure_step_costs(model)                       # a cost_model.StepCosts
    costs.answer_seconds(result.stats.step_rows)            # one request's answer, decoded alone

Every term is measured through the decoder's own step (its packing, ragged attention, cache, linears, and the
compiled step's buckets when `forward` compiles), timed as StepTiming.step_s of requests that plan and commit
nothing, so what is left out is the decoder's own bookkeeping: a bound's efficiency (measured / priced) says what
that bookkeeping, the sampler's work beyond a greedy argmax, and the machine's noise cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pasta.decoding.cost_model import CACHE_LEN, StepCosts
from pasta.decoding.runner import StepBatch
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import MAIN_THREAD

# Every count up to 10: on CPU the cost jumps past pasta/decoding/linears.py's MAX_ROWS, which interpolation would
# smooth over.
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32, 48, 64, 96, 128, 256)
REQUESTS = (1, 2, 4, 8, 16, 32)


class _Probe:
    """A request the cost model times: `num_rows` rows fed at slots [start_slot, start_slot + num_rows) of its own
    cache row, every step at the same slots (rewritten: the cache never grows); it plans and commits nothing
    else. The slots before them are whatever the cache holds, which costs attention what a prompt would. Its
    first step is a one-token prompt: a step with a prompt runs eagerly, so the cache allocates its stores there
    and not inside a compiled step."""

    prompt_ids = [0]
    done = False

    def __init__(self, vocab_size: int, capacity: int, device: torch.device, generator: torch.Generator):
        self.visibility = VisibilityTable(0, capacity, device)
        self.visibility.rows[MAIN_ROW] = True
        self.vocab_size, self.generator = vocab_size, generator
        self.start_slot, self.num_rows = CACHE_LEN, 1
        self.prefilled = False

    @property
    def vis(self) -> torch.Tensor:
        return self.visibility.rows

    def ensure_capacity(self, capacity: int) -> None:
        if capacity > self.visibility.rows.shape[1]:
            self.visibility.ensure_capacity(capacity)
            self.visibility.rows[MAIN_ROW] = True

    def slot_positions(self) -> torch.Tensor:
        """The position of each cache slot [C] (what a sliding window reads)."""
        return self.visibility.slot_positions()

    def plan(self) -> StepPlan:
        if not self.prefilled:
            self.prefilled = True
            plan = StepPlan(0, prefill=True, causal=True)
            plan.feed(0, 0, MAIN_ROW, MAIN_THREAD)
            plan.sample(MAIN_THREAD)
            return plan
        plan = StepPlan(self.start_slot, causal=self.num_rows == 1)
        token_ids = torch.randint(0, self.vocab_size, (self.num_rows,), generator=self.generator).tolist()
        for i, token_id in enumerate(token_ids):
            plan.feed(token_id, self.start_slot + i, MAIN_ROW, MAIN_THREAD)
            plan.sample(MAIN_THREAD)  # every row chooses, as every live thread's row does
        return plan

    def commit(self, plan: StepPlan, token_ids: list[int]) -> None:
        pass


def _greedy(logits: torch.Tensor, plan: StepPlan) -> list[int]:
    return logits.argmax(dim=-1).tolist()


def _non_decreasing(seconds: list[float]) -> list[float]:
    """A step that feeds less is not slower: a spike that survives the minimum cannot invert the curve."""
    for index in range(len(seconds) - 2, -1, -1):
        seconds[index] = min(seconds[index], seconds[index + 1])
    return seconds


@torch.inference_mode()
def measure_step_costs(model, *, rows: Sequence[int] = ROWS, requests: Sequence[int] = REQUESTS,
                       cache_len: int = CACHE_LEN, repeats: int = 3, forward: StepForward | None = None,
                       multirow: bool = True) -> StepCosts:
    """The cost model of `model` as the decoder steps it here (`forward`: eager by default, or a compiled one;
    `multirow`: the CPU multi-row linears). Each term is the fastest of `repeats` rounds after a warm-up round
    (which compiles what a compiled `forward` needs); rounds go over every configuration, so that a slow spell of
    the machine falls on every point of a round rather than on every sample of one."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    generator = torch.Generator().manual_seed(0)
    long_len = 2 * cache_len
    capacity = long_len + max(max(rows), 1) + 1
    probes = [_Probe(config.vocab_size, capacity, model.device, generator) for _ in range(max(requests))]
    by_rows = [float("inf")] * len(rows)
    by_requests = {length: [float("inf")] * len(requests) for length in (cache_len, long_len)}
    with StepBatch(model, 0, forward or StepForward(model), multirow=multirow) as batch:
        for probe in probes:
            batch.join(probe, _greedy, capacity)
        batch.step()  # every probe's one-token prompt
        for round_index in range(repeats + 1):  # the first round is a warm-up
            for length, fastest in by_requests.items():
                batch.leave(batch.members[1:])
                for index, num_requests in enumerate(requests):
                    while len(batch.members) < num_requests:
                        batch.join(probes[len(batch.members)], _greedy, capacity)
                    for member in batch.members:
                        member.request.start_slot, member.request.num_rows = length, 1
                    seconds = batch.step().timing.step_s
                    if round_index:
                        fastest[index] = min(fastest[index], seconds)
            batch.leave(batch.members[1:])
            probe = batch.members[0].request
            probe.start_slot = cache_len
            for index, num_rows in enumerate(rows):
                probe.num_rows = num_rows
                seconds = batch.step().timing.step_s
                if round_index:
                    by_rows[index] = min(by_rows[index], seconds)
    short, long = (_non_decreasing(by_requests[length]) for length in (cache_len, long_len))
    attended = [r * (long_len - cache_len) for r in requests]
    slot_seconds = sum((b - a) * n for a, b, n in zip(short, long, attended, strict=True)) / sum(n * n for n in attended)
    return StepCosts(rows=list(rows), seconds=_non_decreasing(by_rows), requests=list(requests),
                     request_seconds=short, slot_seconds=max(0.0, slot_seconds), cache_len=cache_len)
