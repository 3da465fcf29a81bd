"""Where a decode's time goes: one record per step (`StepTiming`), and each request's sums of them (`RequestClock`).

Every step of every decoder is timed by the step loop (pasta/decoding/runner.py) in the same phases, and every
reader takes its numbers from these two records: a request's `DecodeStats` (evaluation's per-prompt stats), the
server's step metrics, and both benchmarks. The definitions, written once:

- a step is plan -> pack -> forward -> choose -> commit; `step_s` is their sum;
- `host_s` is the step's host work, the decoder's bookkeeping: planning, packing and committing (not the forward,
  nor choosing the tokens, which runs the sampler on the device);
- a request's prefill is the step that feeds its prompt: `prefill_s` is that step's `step_s`, and `decode_s` is the
  `step_s` of every later step it takes part in (a step is shared by every request in it, so each of them counts
  all of it); `wall_s` is their sum, and `host_s`, `forward_s` and `choose_s` split it by phase.

On CUDA the loop synchronizes after the forward, so `forward_s` holds the device's work rather than the time to
queue it (the choice right after reads the logits on the host anyway).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepTiming:
    """One step: seconds of each phase, and what the forward fed."""

    plan_s: float
    pack_s: float
    forward_s: float
    choose_s: float
    commit_s: float
    num_rows: int  # rows the requests fed (a compiled step's padding rows not counted)
    num_requests: int  # requests in the forward
    num_slots: int  # cache slots attended, every request's own summed (its cache length after the step)
    prefill: bool  # a request's prompt was among the rows

    @property
    def step_s(self) -> float:
        return self.plan_s + self.pack_s + self.forward_s + self.choose_s + self.commit_s

    @property
    def host_s(self) -> float:
        """The decoder's bookkeeping: planning, packing and committing."""
        return self.plan_s + self.pack_s + self.commit_s


@dataclass
class RequestClock:
    """One request's share of the steps it took part in (the module docstring's definitions)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    host_s: float = 0.0
    forward_s: float = 0.0
    choose_s: float = 0.0

    def add(self, timing: StepTiming, *, prefill: bool) -> None:
        """A step this request took part in; `prefill`: the step fed its prompt."""
        if prefill:
            self.prefill_s += timing.step_s
        else:
            self.decode_s += timing.step_s
        self.host_s += timing.host_s
        self.forward_s += timing.forward_s
        self.choose_s += timing.choose_s

    @property
    def wall_s(self) -> float:
        return self.prefill_s + self.decode_s
