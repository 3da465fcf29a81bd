"""The sequential baseline, one request of it: the prompt, then one token per step, through the step loop.

The reference every speedup is measured against (Baseline-SFT). `decode_sequential` and the server's sequential
mode both step these requests through `runner.StepBatch`, like the asynchronous `Interpreter` (the same interface:
plan, commit, text, the stats fields). The stopping rules are text.SampledAnswer's: eos, stop strings,
max_new_tokens, or the end of a replayed response (`forced_ids`: teacher forcing, the benchmark's baseline decoding
exactly the tokens of the asynchronous run it is compared with). Tags a model writes are plain tokens here, dropped
from the text as special tokens.

With greedy sampling it produces `model.generate(do_sample=False)`'s tokens (tests/test_decoding.py checks it on the
tiny and the embedded model): its one thread sees every slot of its cache row, so its prompt attends causally and
each later row attends over every slot without a mask, as `generate`'s attention does (pasta/decoding/packing.py);
its decode steps run the CPU multi-row linears, whose float rounding may differ from generate's, never by a token in
the tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from pasta.decoding.config import DecodeConfig
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.text import SampledAnswer, settled
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import MAIN_THREAD


class PlainInterpreter:
    """One request of the sequential baseline: the prompt, then each chosen token fed at the next step."""

    num_threads = 0
    num_overruns = 0
    chunks = ()  # no chunk threads

    def __init__(self, prompt_ids: list[int], *, eos_ids: set[int], config: DecodeConfig,
                 decode: Callable[[list[int]], str], capacity: int, device: torch.device | str = "cpu",
                 forced_ids: list[int] | None = None):
        if not prompt_ids:
            raise ValueError("empty prompt")
        self.prompt_ids = list(prompt_ids)
        self.eos_ids = set(eos_ids)
        self.config = config
        self.decode = decode
        self.visibility = VisibilityTable(0, capacity, device)  # the pad row and the main row
        self.num_steps = 0
        self.step_rows: list[int] = []  # rows fed at each step, the prompt's prefill first (DecodeStats.step_rows)
        forced = forced_ids is not None
        self.answer = SampledAnswer(len(forced_ids) if forced else config.max_new_tokens, forced)
        self.malformed: Counter[str] = Counter()  # tags are plain tokens here: nothing is malformed
        self.masked: Counter[str] = Counter()  # and nothing is constrained
        self.num_forced = 0
        self.num_drafted = self.num_draft_kept = 0  # nothing to guess: no promise list
        self._max_stop_len = max((len(s) for s in config.stop_strings), default=0)

    @property
    def main_ids(self) -> list[int]:
        return self.answer.token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.answer.finish_reason or None

    @property
    def done(self) -> bool:
        return bool(self.answer.finish_reason)

    @property
    def num_sampled(self) -> int:
        return len(self.main_ids)

    @property
    def vis(self) -> torch.Tensor:
        """The visibility table [2, C]: the pad row, then the main row."""
        return self.visibility.rows

    def ensure_capacity(self, capacity: int) -> None:
        self.visibility.ensure_capacity(capacity)

    def slot_positions(self) -> torch.Tensor:
        """The position of each cache slot [C] (what a sliding window reads)."""
        return self.visibility.slot_positions()

    def plan(self) -> StepPlan:
        """The prompt at the first step, then the last chosen token; the last fed row chooses the next one."""
        self.num_steps += 1
        plan = StepPlan(self.visibility.num_slots, prefill=not self.main_ids, causal=True)
        for token_id in self.main_ids[-1:] if self.main_ids else self.prompt_ids:
            slot = self.visibility.take_slot(MAIN_ROW)
            plan.feed(token_id, slot, MAIN_ROW, MAIN_THREAD)  # one thread: positions are slots
        plan.sample(MAIN_THREAD)
        self.step_rows.append(len(plan.token_ids))
        return plan

    def commit(self, plan: StepPlan, token_ids: list[int]) -> None:
        (token_id,) = token_ids
        self.answer.take(token_id, self.eos_ids, self.config.stop_strings, self.decode)

    def text(self) -> str:
        return self.answer.text(self.decode)

    def final_text(self) -> str:
        """The prefix of the text that later steps cannot change (for streaming)."""
        return self.text() if self.done else settled(self.decode(self.main_ids), self._max_stop_len)

    def annotated(self) -> str:
        return self.text()

    def token_doc(self) -> None:
        return None
