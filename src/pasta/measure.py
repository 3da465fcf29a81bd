"""The timing harness and summary statistics that every speed figure uses: the benchmarks under scripts/ and the
evaluation's speed metrics import them from here, so a ratio, a geometric mean or a percentile means one thing.

It imports numpy and the standard library only (no stage), and torch where a device is synchronized: the GPU
machines run `scripts/bench_decode.py` with pasta's src/ on the path and nothing installed beyond torch and
transformers (which bring numpy), and an evaluation's report reads its statistics without torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA); nothing elsewhere."""
    import torch  # here: the statistics below serve the evaluation's report, which imports no torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_call(device: torch.device | str, call: Callable[[], T]) -> tuple[float, T]:
    """(seconds, value) of `call()`, the device's queued work included: teacher forcing reads no token back to the
    host, so on CUDA nothing inside the decoder would wait for its kernels."""
    synchronize(device)
    start = time.perf_counter()
    value = call()
    synchronize(device)
    return time.perf_counter() - start, value


def median_ratio(run_a: Callable[[], float], run_b: Callable[[], float],
                 repeats: int) -> tuple[float, list[float], list[float]]:
    """Median of run_a() / run_b() over interleaved repeats (each returns seconds), and the raw times of each.

    Interleaving puts a slow spell of a shared machine on both sides; `ratio_of_fastest` of the raw times is the
    ratio of the runs least disturbed by other processes."""
    times_a, times_b = [], []
    for _ in range(repeats):
        times_a.append(run_a())
        times_b.append(run_b())
    ratios = [a / b for a, b in zip(times_a, times_b, strict=True)]
    return statistics.median(ratios), times_a, times_b


def ratio_of_fastest(times_a: Sequence[float], times_b: Sequence[float]) -> float:
    return min(times_a) / min(times_b)


def geometric_mean(values: np.ndarray | Sequence[float], axis: int = -1) -> np.ndarray | float:
    """exp(mean(log x)) along `axis` (a float for one dimension, as a bootstrap's [resamples, n] gives an array);
    every value must be positive."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("geometric mean of no values")
    if np.any(array <= 0):
        raise ValueError("geometric mean needs positive values")
    result = np.exp(np.log(array).mean(axis=axis))
    return float(result) if np.ndim(result) == 0 else result


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of the values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
