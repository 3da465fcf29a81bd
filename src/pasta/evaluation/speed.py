"""Speed of an evaluated run: per-prompt wall-clock speedup against a sequential run, and theoretical speedup.

The paper's speed number is the geometric mean over prompts of (sequential wall time / candidate wall time), both
decoded one request at a time on the same machine. This module joins a run's per-prompt stats (stats.jsonl, see
`pasta.evaluation.run_files`) with those of a sequential run by instruction, and reports:

- `wall_speedup_geomean`: geometric mean of the per-prompt wall-clock speedups, with a bootstrap interval, over
  the prompts both runs decoded one at a time (all of them under eval.timing=wall; eval.timed_prompts of a
  throughput run);
- `step_speedup_geomean`: the sequential run's steps (its tokens) over the run's steps, per prompt: the wall-clock
  speedup of a machine whose step costs the same whatever it feeds (a memory-bound GPU, roughly);
- `cost_speedup_geomean`: both runs' answers priced on one measured curve of cost per forward by rows fed (the
  sequential run's step_costs.json, pasta.decoding.step_costs): this machine's batch-1 wall-clock speedup as the
  cost model predicts it, for every prompt, batched or not, without timing noise between the runs;
- `theoretical_speedup_geomean`: geometric mean of tokens / forward steps (what an ideal interpreter would gain);
- `ms_per_token_*`: median latency per decoded token of each run (wall time / tokens, all threads counted).

Bootstrap intervals resample prompts with replacement (percentile method, seeded), so the same files always give
the same interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pasta.decoding.step_costs import StepCosts
from pasta.errors import PastaError
from pasta.measure import geometric_mean


@dataclass
class BootstrapConfig:
    """How confidence intervals are resampled."""

    num_resamples: int = field(default=10_000, metadata={"help": "bootstrap resamples of the prompts"})
    confidence: float = field(default=0.95, metadata={"help": "coverage of the percentile interval"})
    seed: int = field(default=0, metadata={"help": "seed of the resampling"})


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    config: BootstrapConfig = BootstrapConfig(),
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `values`.

    `statistic` reduces the last axis of a [num_resamples, n] array of resampled values to [num_resamples].
    """
    array = np.asarray(values, dtype=np.float64)  # [n]
    if array.size == 0:
        raise ValueError("bootstrap of no values")
    if not 0 < config.confidence < 1:
        raise PastaError(f"bootstrap confidence must be in (0, 1), got {config.confidence}")
    rng = np.random.default_rng(config.seed)
    indices = rng.integers(0, array.size, size=(config.num_resamples, array.size))  # [R, n]
    resampled = statistic(array[indices])  # [R]
    tail = (1.0 - config.confidence) / 2.0
    low, high = np.quantile(resampled, [tail, 1.0 - tail])
    return float(low), float(high)


def _mean(samples: np.ndarray) -> np.ndarray:
    return samples.mean(axis=-1)


def _summary(values: np.ndarray, statistic: Callable, bootstrap: BootstrapConfig) -> dict[str, float]:
    low, high = bootstrap_ci(values, statistic, bootstrap)
    return {"value": float(statistic(values[None, :])[0]), "ci_low": low, "ci_high": high}


def _positive(record: dict[str, Any], key: str, where: str) -> float:
    value = record.get(key)
    if not isinstance(value, (int, float)) or value <= 0:
        raise PastaError(f"{where}: '{key}' must be a positive number, got {value!r}")
    return float(value)


def join_by_instruction(
    candidate: list[dict[str, Any]], sequential: list[dict[str, Any]], sequential_name: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pair each candidate record with the sequential record of the same instruction.

    Raises PastaError naming the sequential run and how many (and which first) instructions it lacks.
    """
    by_instruction = {record["instruction"]: record for record in sequential}
    missing = [record["instruction"] for record in candidate if record["instruction"] not in by_instruction]
    if missing:
        raise PastaError(
            f"sequential run {sequential_name} lacks {len(missing)} of the {len(candidate)} evaluated instructions "
            f"(first: {missing[0][:80]!r}); decode the same prompts sequentially (same eval_data and eval.limit)"
        )
    return [(record, by_instruction[record["instruction"]]) for record in candidate]


def timed_alone(record: dict[str, Any]) -> bool:
    """Decoded one request at a time (stats written before batch sizes were kept came from eval.timing=wall)."""
    return record.get("batch_size", 1) == 1


def speed_metrics(
    candidate: list[dict[str, Any]],
    sequential: list[dict[str, Any]] | None,
    *,
    sequential_name: str = "sequential",
    bootstrap: BootstrapConfig = BootstrapConfig(),
    costs: StepCosts | None = None,
) -> dict[str, Any]:
    """Speed metrics of per-prompt stats records (`instruction`, `wall_s`, `num_tokens`, `num_steps`, and
    `step_rows` for the cost model on `costs`).

    Without a sequential run only the theoretical speedup and the latency per token are reported.
    """
    if not candidate:
        raise PastaError("no per-prompt stats to measure speed on")
    theoretical = np.array(
        [_positive(r, "num_tokens", "stats") / _positive(r, "num_steps", "stats") for r in candidate]
    )  # [n]
    alone = [r for r in candidate if timed_alone(r)] or candidate  # a batch's wall_s is shared by its requests
    ms_per_token = np.array(
        [1000.0 * _positive(r, "wall_s", "stats") / _positive(r, "num_tokens", "stats") for r in alone]
    )  # [n alone]
    metrics: dict[str, Any] = {
        "num_prompts": len(candidate),
        "theoretical_speedup_geomean": _summary(theoretical, geometric_mean, bootstrap),
        "ms_per_token_median": float(np.median(ms_per_token)),
        "tokens_mean": float(np.mean([r["num_tokens"] for r in candidate])),
        # Whether the model used the language at all: a PASTA checkpoint that forks nothing cannot be faster.
        "num_with_threads": sum(1 for r in candidate if r.get("num_threads", 0) > 0),
        "num_malformed": sum(1 for r in candidate if r.get("malformed")),
        "bootstrap": {"num_resamples": bootstrap.num_resamples, "confidence": bootstrap.confidence,
                      "seed": bootstrap.seed},
    }
    if sequential is None:
        return metrics
    pairs = join_by_instruction(candidate, sequential, sequential_name)
    step_speedups = np.array(
        [_positive(s, "num_steps", sequential_name) / _positive(c, "num_steps", "stats") for c, s in pairs]
    )  # [n]
    metrics.update(
        {
            "sequential_run": sequential_name,
            "step_speedup_geomean": _summary(step_speedups, geometric_mean, bootstrap),
            # Tokens per answer differ between models; this ratio says how much of the speedup is shorter answers.
            "length_ratio_mean": float(np.mean([c["num_tokens"] / s["num_tokens"] for c, s in pairs])),
        }
    )
    priced = [(c, s) for c, s in pairs if c.get("step_rows") and s.get("step_rows")]
    if costs is not None and len(priced) == len(pairs):
        cost_speedups = np.array(
            [costs.answer_seconds(s["step_rows"]) / costs.answer_seconds(c["step_rows"]) for c, s in pairs]
        )  # [n]
        metrics["cost_speedup_geomean"] = _summary(cost_speedups, geometric_mean, bootstrap)
        metrics["cost_curve"] = costs.to_dict()
    timed = [(c, s) for c, s in pairs if timed_alone(c) and timed_alone(s)]
    metrics["num_timed_prompts"] = len(timed)
    if timed:
        wall_speedups = np.array(
            [_positive(s, "wall_s", sequential_name) / _positive(c, "wall_s", "stats") for c, s in timed]
        )  # [n timed]
        sequential_ms_per_token = np.array(
            [1000.0 * _positive(s, "wall_s", sequential_name) / _positive(s, "num_tokens", sequential_name)
             for _, s in timed]
        )  # [n timed]
        metrics.update(
            {
                "wall_speedup_geomean": _summary(wall_speedups, geometric_mean, bootstrap),
                "wall_speedup_mean": _summary(wall_speedups, _mean, bootstrap),
                "wall_speedup_min": float(wall_speedups.min()),
                "wall_speedup_max": float(wall_speedups.max()),
                "sequential_ms_per_token_median": float(np.median(sequential_ms_per_token)),
            }
        )
        if "cost_speedup_geomean" in metrics:
            # The cost model on the same timed prompts: how well it predicts the wall clock it stands in for.
            on_timed = np.array([costs.answer_seconds(s["step_rows"]) / costs.answer_seconds(c["step_rows"])
                                 for c, s in timed])
            metrics["cost_speedup_timed_geomean"] = float(geometric_mean(on_timed))
    return metrics
