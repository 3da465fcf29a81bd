"""The cost model: what one decoding step costs on the model at hand, by the rows it feeds, the requests they belong
to and the cache they attend, measured by running the real step (`runner.StepBatch.step`).

    costs = measure_step_costs(model)
    costs.cost(num_rows=39, num_requests=32, num_slots=32 * 180)
    costs.answer_seconds(result.stats.step_rows)            # one request's answer, decoded alone

The model:

    c(N, R, S) = rows(N) + requests(R) + slot_s * (S - R * cache_len)

- rows(N): one request feeding N rows over a cache of `cache_len` slots (the ladder ROWS, linear between measured
  points, the last segment's slope beyond: a prompt's rows);
- requests(R): what it adds that the rows belong to R requests, each attending over its own cache row: a step of R
  requests feeding one row each, less rows(R) (the ladder REQUESTS);
- slot_s: each cache slot a request attends beyond `cache_len`, fitted from the same R-request steps over twice the
  cache.

Every term is measured through the decoder's own step (its packing, ragged attention, cache, linears, and the
compiled step's buckets when `forward` compiles), timed as StepTiming.step_s of requests that plan and commit
nothing, so what is left out is the decoder's own bookkeeping: a bound's efficiency (measured / priced) says what
that bookkeeping, the sampler's work beyond a greedy argmax, and the machine's noise cost. The terms add, so a run's
steps can be priced from the distributions of their rows and of their requests and the total of the slots attended
(`steps_seconds`), which is what the server's metrics keep.

Its readers: evaluation's cost-model speedup (pasta.evaluation.speed prices both runs' answers, one request alone,
on the sequential run's curve), `scripts/bench_decode.py`'s bound (the same, for teacher-forced structures) and
`scripts/bench_serve.py`'s bound (each level's steps, from the servers' metrics). docs/results/benchmarks.md says
what the model predicts on a memory-bound GPU step.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from pasta.decoding.runner import StepBatch
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import MAIN_THREAD

# Every count up to 10: on CPU the cost jumps past pasta/decoding/linears.py's MAX_ROWS, which interpolation would
# smooth over.
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32, 48, 64, 96, 128, 256)
REQUESTS = (1, 2, 4, 8, 16, 32)
# Under the first slot bucket of a compiled step (256) with the rows of a few threads, as a short answer's cache is.
CACHE_LEN = 240
VERSION = 2  # 1: rows alone (`prefix_len`), measured on another forward than the decoder's step


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Linear between measured points, the last segment's slope beyond, the first point's value below."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    index = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    (x0, x1), (y0, y1) = xs[index - 1 : index + 1], ys[index - 1 : index + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class StepCosts:
    """A measured cost model (the module docstring's c(N, R, S)); seconds."""

    rows: list[int]
    seconds: list[float]  # rows(N) at each N of `rows`: one request, `cache_len` slots
    requests: list[int] = field(default_factory=lambda: [1])
    request_seconds: list[float] = field(default_factory=list)  # R requests, one row each, `cache_len` slots each
    slot_seconds: float = 0.0  # per attended slot beyond `cache_len`, per request
    cache_len: int = CACHE_LEN
    version: int = VERSION

    @classmethod
    def from_dict(cls, record: dict) -> StepCosts:
        """A step_costs.json record; one of version 1 (rows alone) prices every step as rows(N)."""
        if "prefix_len" in record:
            return cls(rows=list(record["rows"]), seconds=list(record["seconds"]), cache_len=record["prefix_len"],
                       version=1)
        return cls(**record)

    def to_dict(self) -> dict:
        return asdict(self)

    def rows_cost(self, num_rows: float) -> float:
        return _interpolate(self.rows, self.seconds, num_rows)

    def requests_cost(self, num_requests: float) -> float:
        """What R requests add over one request feeding as many rows (0 for one request)."""
        if num_requests <= 1 or len(self.requests) < 2:
            return 0.0
        return max(0.0, _interpolate(self.requests, self.request_seconds, num_requests)
                   - self.rows_cost(num_requests))

    def cost(self, num_rows: int, num_requests: int = 1, num_slots: int | None = None) -> float:
        """c(N, R, S): a step feeding `num_rows` rows of `num_requests` requests that attend `num_slots` cache
        slots together (None: `cache_len` each)."""
        beyond = 0.0 if num_slots is None else num_slots - num_requests * self.cache_len
        return max(0.0, self.rows_cost(num_rows) + self.requests_cost(num_requests) + self.slot_seconds * beyond)

    def answer_seconds(self, step_rows: Sequence[int], *, prefill: bool = True) -> float:
        """One request decoded alone: its steps' rows (DecodeStats.step_rows, the prompt's first), each step
        attending every slot fed so far; `prefill=False` leaves out the prompt's step."""
        total, num_slots = 0.0, 0
        for index, num_rows in enumerate(step_rows):
            num_slots += num_rows
            if index or prefill:
                total += self.cost(num_rows, 1, num_slots)
        return total

    def steps_seconds(self, row_counts: Iterable[tuple[int, int]], request_counts: Iterable[tuple[int, int]],
                      num_slots: int) -> float:
        """Steps priced from their distributions: (rows, number of steps) and (requests, number of steps) pairs,
        and the slots all of them attended together (the terms of c add, so their sums need nothing more)."""
        request_counts = list(request_counts)
        total_requests = sum(r * n for r, n in request_counts)
        return (sum(n * self.rows_cost(r) for r, n in row_counts)
                + sum(n * self.requests_cost(r) for r, n in request_counts)
                + self.slot_seconds * (num_slots - total_requests * self.cache_len))


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
