"""c(q): what one decoding forward costs when it feeds q rows, measured on the model at hand, and the latency of a
request modelled from it.

A decoding step's time grows with the rows it feeds (the asynchronous decoder feeds one per live thread, plus a
fork's opener), so steps alone do not price an answer. `measure_step_costs` times one forward appending q rows to a
cache of `prefix_len` tokens, with the decoder's attention and CPU linears, for a ladder of q; `modelled_seconds`
prices a request's `DecodeStats.step_rows` on that curve (linear between measured points, the last segment's slope
beyond). Priced on one curve, two runs' answers compare without the machine's noise in between: the evaluation's
cost-model speedup (pasta.evaluation.speed) uses the sequential run's curve for both sides.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from pasta.decoding.attention import grouped_query_sdpa
from pasta.decoding.linears import multirow_linears
from pasta.transformers_api import CACHE_ARGUMENT

ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class StepCosts:
    """Seconds of one forward for each measured row count (increasing), at `prefix_len` cached tokens."""

    rows: list[int]
    seconds: list[float]
    prefix_len: int

    def cost(self, num_rows: int) -> float:
        """c(num_rows): linear between measured points, the last segment's slope beyond (a prefill's rows)."""
        rows, seconds = self.rows, self.seconds
        if num_rows <= rows[0] or len(rows) == 1:
            return seconds[0]
        index = min(max(bisect.bisect_left(rows, num_rows), 1), len(rows) - 1)
        (r0, r1), (s0, s1) = rows[index - 1 : index + 1], seconds[index - 1 : index + 1]
        return s0 + (s1 - s0) * (num_rows - r0) / (r1 - r0)

    def to_dict(self) -> dict:
        return asdict(self)


def modelled_seconds(step_rows: Sequence[int], costs: StepCosts) -> float:
    """A request's latency at batch 1 on this curve: the sum of c(rows) over its steps."""
    return sum(costs.cost(num_rows) for num_rows in step_rows)


@torch.inference_mode()
def measure_step_costs(model, rows: Sequence[int] = ROWS, prefix_len: int = 256, repeats: int = 3,
                       multirow: bool = True) -> StepCosts:
    """c(q) for each q in `rows`: one forward appending q random tokens to a `prefix_len`-token cache, as the
    decoders run on this device; the fastest of `repeats` rounds over every q after a warm-up round.

    Rounds go over the whole ladder, so that a slow spell of the machine (other processes: seen here at 10x for
    minutes) falls on every q of a round rather than on every sample of one q; and c is made non-decreasing in q
    (a forward that feeds fewer rows is not slower), so a spike that survives the minimum cannot invert the curve.
    """
    from transformers import DynamicCache

    device = model.device
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    generator = torch.Generator().manual_seed(0)

    def tokens(num: int) -> torch.Tensor:
        return torch.randint(0, text_config.vocab_size, (1, num), generator=generator).to(device)  # [1, num]

    def one_forward(num_rows: int) -> float:
        mask = torch.zeros(1, 1, num_rows, prefix_len + num_rows, dtype=dtype, device=device)
        mask[0, 0, :, prefix_len:] = torch.full((num_rows, num_rows), torch.finfo(dtype).min).triu(1)
        positions = torch.arange(prefix_len, prefix_len + num_rows, device=device)[None]  # [1, q]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model(input_ids=tokens(num_rows), attention_mask=mask, position_ids=positions, use_cache=True,
              logits_to_keep=num_rows, **{CACHE_ARGUMENT: cache})
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        cache.crop(-num_rows)
        return seconds

    fastest = [float("inf")] * len(rows)
    with grouped_query_sdpa(model), multirow_linears(model, enabled=multirow):
        cache = DynamicCache()
        model(input_ids=tokens(prefix_len), use_cache=True, logits_to_keep=1, **{CACHE_ARGUMENT: cache})
        for round_index in range(repeats + 1):  # the first round is a warm-up
            for index, num_rows in enumerate(rows):
                seconds = one_forward(num_rows)
                if round_index:
                    fastest[index] = min(fastest[index], seconds)
    for index in range(len(rows) - 2, -1, -1):
        fastest[index] = min(fastest[index], fastest[index + 1])
    return StepCosts(rows=list(rows), seconds=fastest, prefix_len=prefix_len)
