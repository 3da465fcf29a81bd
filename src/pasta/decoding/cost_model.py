"""The cost model: what one decoding step costs on the model at hand, by the rows it feeds, the requests they belong
to and the cache they attend. pasta.decoding.step_costs measures it by running the real step; this module prices
steps on it and imports the standard library only, so that a run's report and scoring read step_costs.json
without torch.

    costs = StepCosts.from_dict(json.loads(Path("step_costs.json").read_text()))
    costs.cost(num_rows=39, num_requests=32, num_slots=32 * 180)
    costs.answer_seconds(result.stats.step_rows)            # one request's answer, decoded alone

The model:

    c(N, R, S) = rows(N) + requests(R) + slot_s * (S - R * cache_len)

- rows(N): one request feeding N rows over a cache of `cache_len` slots (measured at the ladder
  `step_costs.ROWS`, linear between measured points, the last segment's slope beyond: a prompt's rows);
- requests(R): what it adds that the rows belong to R requests, each attending over its own cache row: a step of R
  requests feeding one row each, less rows(R) (the ladder `step_costs.REQUESTS`);
- slot_s: each cache slot a request attends beyond `cache_len`, fitted from the same R-request steps over twice the
  cache.

The terms add, so a run's steps can be priced from the distributions of their rows and of their requests and the
total of the slots attended (`steps_seconds`), which is what the server's metrics keep.

Its readers: evaluation's cost-model speedup (pasta.evaluation.speed prices both runs' answers, one request alone,
on the sequential run's curve), `scripts/bench_decode.py`'s bound (the same, for teacher-forced structures) and
`scripts/bench_serve.py`'s bound (each level's steps, from the servers' metrics). docs/results/benchmarks.md says
what the model predicts on a memory-bound GPU step.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

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
