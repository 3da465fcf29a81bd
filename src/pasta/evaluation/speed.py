"""Speed of an evaluated run: per-prompt wall-clock speedup against a sequential run, and the modelled ones.

The paper's speed number is the geometric mean over prompts of (sequential wall time / candidate wall time), both
decoded one request at a time on the same machine. This module reads a run's per-prompt stats (stats.jsonl, see
`pasta.evaluation.run_files`) as `AnswerSpeed` records, joins them with a sequential run's by instruction, and
gathers a `SpeedSummary` (speed.json):

- `wall_speedup_geomean`: geometric mean of the per-prompt wall-clock speedups, with a bootstrap interval, over
  the prompts both runs decoded one at a time (all of them under eval.timing=wall; eval.timed_prompts of a
  throughput run). It is the run's headline speedup (`SpeedSummary.headline`), the one rule: a run without it has
  no headline speedup, never another kind in its place;
- `step_speedup_geomean`: the sequential run's steps (its tokens) over the run's steps, per prompt: the wall-clock
  speedup of a machine whose step costs the same whatever it feeds;
- `cost_speedup_geomean`: both runs' answers priced on one cost model (the sequential run's step_costs.json,
  pasta.decoding.cost_model: each step by its rows and the cache it attends, decoded alone): this machine's
  batch-1 wall-clock speedup as the model predicts it, for every prompt, batched or not, without timing noise
  between the runs;
- `theoretical_speedup_geomean`: geometric mean of tokens / forward steps (what an ideal interpreter would gain);
- `ms_per_token_*`: median latency per decoded token of each run (wall time / tokens, all threads counted), over
  the answers timed alone; a run with none (a throughput run, eval.timed_prompts=0) takes each answer's batch wall
  time, the wait its client had, and says so (`ms_per_token_batched`);
- `parallelism_forked_geomean`: an async run's forked answers timed alone, each against its plain text decoded one
  token per step by the same model right after it (eval.parallelism: `replay_wall_s`): the part of the speedup
  that is parallel decoding and not a shorter answer; `parallelism_geomean` the same over every answer timed alone,
  an answer that forked nothing counting 1.0 (it was decoded as its own plain text, one token per step).

Bootstrap intervals resample prompts with replacement (percentile method, seeded), so the same files always give
the same interval. Formatting these for a person is pasta.evaluation.formatting's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pasta.decoding.cost_model import StepCosts
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


@dataclass(frozen=True)
class Interval:
    """A statistic over prompts and its bootstrap interval."""

    value: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, values: np.ndarray, statistic: Callable, bootstrap: BootstrapConfig) -> Interval:
        low, high = bootstrap_ci(values, statistic, bootstrap)
        return cls(float(statistic(values[None, :])[0]), low, high)


def _mean(samples: np.ndarray) -> np.ndarray:
    return samples.mean(axis=-1)


def _positive(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PastaError(f"{where}: '{key}' must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class AnswerSpeed:
    """One answer's speed fields, as its stats.jsonl line keeps them (DecodeStats and the batch it was decoded in)."""

    instruction: str
    num_tokens: float
    num_steps: float
    wall_s: Any  # checked where it is read: a batched answer's is its batch's, and read only for the cost model
    batch_size: int = 1  # stats written before batch sizes were kept came from eval.timing=wall
    # Decoded one request at a time after the warm-up, timed beside the sequential model: its wall time is its own.
    # Not a prompt left alone in a throughput batch (no warm-up, nothing beside it); stats written before the key
    # was kept read it from the batch size.
    timed_alone: bool = True
    step_rows: tuple[int, ...] = ()
    num_threads: int = 0
    malformed: bool = False
    replay_wall_s: float | None = None  # its plain text decoded sequentially, teacher-forced (eval.parallelism)
    sequential_wall_s: float | None = None  # eval.sequential_model's answer, decoded right after it
    sequential_num_tokens: int | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any], where: str) -> AnswerSpeed:
        return cls(instruction=record["instruction"],
                   num_tokens=_positive(record.get("num_tokens"), "num_tokens", where),
                   num_steps=_positive(record.get("num_steps"), "num_steps", where),
                   wall_s=record.get("wall_s"), batch_size=record.get("batch_size", 1),
                   timed_alone=bool(record.get("timed_alone", record.get("batch_size", 1) == 1)),
                   step_rows=tuple(record.get("step_rows") or ()), num_threads=record.get("num_threads", 0),
                   malformed=bool(record.get("malformed")), replay_wall_s=record.get("replay_wall_s"),
                   sequential_wall_s=record.get("sequential_wall_s"),
                   sequential_num_tokens=record.get("sequential_num_tokens"))

    @property
    def theoretical_speedup(self) -> float:
        return self.num_tokens / self.num_steps

    def wall(self, where: str) -> float:
        return _positive(self.wall_s, "wall_s", where)

    def ms_per_token(self, where: str) -> float:
        return 1000.0 * self.wall(where) / self.num_tokens


@dataclass(frozen=True)
class SpeedSummary:
    """A run's speed (speed.json): every field the module docstring names; those that need a sequential run, a
    cost model or prompts timed alone are None without them."""

    num_prompts: int
    theoretical_speedup_geomean: Interval
    ms_per_token_median: float
    tokens_mean: float
    num_with_threads: int  # answers that forked: a PASTA checkpoint that forks nothing cannot be faster
    num_malformed: int
    bootstrap: BootstrapConfig
    ms_per_token_batched: bool = False  # no answer timed alone: each answer's batch wall time over its tokens
    sequential_run: str | None = None
    step_speedup_geomean: Interval | None = None
    length_ratio_mean: float | None = None  # tokens per answer against the sequential run's: shorter answers
    cost_speedup_geomean: Interval | None = None
    cost_curve: dict | None = None  # the cost model the answers were priced on (StepCosts.to_dict())
    num_timed_prompts: int | None = None
    wall_timed_beside: bool | None = None  # the sequential times are eval.sequential_model's, taken beside each answer
    wall_speedup_geomean: Interval | None = None
    wall_speedup_mean: Interval | None = None
    wall_speedup_min: float | None = None
    wall_speedup_max: float | None = None
    sequential_ms_per_token_median: float | None = None
    cost_speedup_timed_geomean: float | None = None  # the cost model on the timed prompts: how well it predicts
    num_replayed: int | None = None  # forked answers timed alone, replayed sequentially
    parallelism_geomean: Interval | None = None
    parallelism_forked_geomean: float | None = None

    @property
    def headline(self) -> Interval | None:
        """The run's headline speedup: measured wall clock against the sequential run, or none."""
        return self.wall_speedup_geomean

    def to_dict(self) -> dict[str, Any]:
        """speed.json: the fields computed (None ones left out)."""
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SpeedSummary:
        """A speed.json / summary.json `speed` record (keys it does not know are ignored: older or newer files)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {key: value for key, value in record.items() if key in known}
        for key, value in values.items():
            if isinstance(value, dict) and {"value", "ci_low", "ci_high"} <= set(value):
                values[key] = Interval(value["value"], value["ci_low"], value["ci_high"])
        values["bootstrap"] = BootstrapConfig(**record.get("bootstrap", {}))
        values.setdefault("num_with_threads", 0)
        values.setdefault("num_malformed", 0)
        return cls(**values)


def join_by_instruction(
    candidate: list[AnswerSpeed], sequential: list[AnswerSpeed], sequential_name: str
) -> list[tuple[AnswerSpeed, AnswerSpeed]]:
    """Pair each candidate answer with the sequential answer to the same instruction.

    Raises PastaError naming the sequential run and how many (and which first) instructions it lacks.
    """
    by_instruction = {answer.instruction: answer for answer in sequential}
    missing = [answer.instruction for answer in candidate if answer.instruction not in by_instruction]
    if missing:
        raise PastaError(
            f"sequential run {sequential_name} lacks {len(missing)} of the {len(candidate)} evaluated instructions "
            f"(first: {missing[0][:80]!r}); decode the same prompts sequentially (same eval_data and eval.limit)"
        )
    return [(answer, by_instruction[answer.instruction]) for answer in candidate]


def check_beside(timed: list[tuple[AnswerSpeed, AnswerSpeed]], sequential_name: str) -> None:
    """The answers timed beside the run are the sequential run's (same length each): the wall-clock speedup and
    the step speedup then divide the same work."""
    differ = [c for c, s in timed if c.sequential_num_tokens != s.num_tokens]
    if differ:
        raise PastaError(
            f"eval.sequential_model decoded {len(differ)} of the {len(timed)} timed prompts to another length than "
            f"{sequential_name}'s answers (first: {differ[0].instruction[:60]!r}): give the model and decode settings "
            "of the eval.sequential run"
        )


def speed_metrics(
    candidate: list[dict[str, Any]],
    sequential: list[dict[str, Any]] | None,
    *,
    sequential_name: str = "sequential",
    bootstrap: BootstrapConfig = BootstrapConfig(),
    costs: StepCosts | None = None,
) -> SpeedSummary:
    """The SpeedSummary of per-prompt stats records (`instruction`, `wall_s`, `num_tokens`, `num_steps`, and
    `step_rows` for the cost model on `costs`). Without a sequential run only the theoretical speedup and the
    latency per token are gathered."""
    if not candidate:
        raise PastaError("no per-prompt stats to measure speed on")
    answers = [AnswerSpeed.from_record(record, "stats") for record in candidate]
    theoretical = np.array([answer.theoretical_speedup for answer in answers])  # [n]
    alone = [answer for answer in answers if answer.timed_alone] or answers  # a batch's wall_s is shared
    summary = SpeedSummary(
        ms_per_token_batched=not any(answer.timed_alone for answer in answers),
        num_prompts=len(answers),
        theoretical_speedup_geomean=Interval.of(theoretical, geometric_mean, bootstrap),
        ms_per_token_median=float(np.median([answer.ms_per_token("stats") for answer in alone])),
        tokens_mean=float(np.mean([answer.num_tokens for answer in answers])),
        num_with_threads=sum(1 for answer in answers if answer.num_threads > 0),
        num_malformed=sum(1 for answer in answers if answer.malformed),
        bootstrap=bootstrap,
    )
    replayed = [answer for answer in answers if answer.timed_alone and answer.replay_wall_s is not None]
    if replayed:
        def parallelism(answer: AnswerSpeed) -> float:
            if answer.replay_wall_s is None:
                return 1.0
            return _positive(answer.replay_wall_s, "replay_wall_s", "stats") / answer.wall("stats")

        timed_alone = [answer for answer in answers if answer.timed_alone and
                       (answer.num_threads == 0 or answer.replay_wall_s is not None)]
        summary = dataclasses.replace(
            summary, num_replayed=len(replayed),
            parallelism_geomean=Interval.of(np.array([parallelism(a) for a in timed_alone]), geometric_mean,
                                            bootstrap),
            parallelism_forked_geomean=float(geometric_mean([parallelism(a) for a in replayed])))
    if sequential is None:
        return summary
    baseline = [AnswerSpeed.from_record(record, sequential_name) for record in sequential]
    pairs = join_by_instruction(answers, baseline, sequential_name)
    fields: dict[str, Any] = {
        "sequential_run": sequential_name,
        "step_speedup_geomean": Interval.of(np.array([s.num_steps / c.num_steps for c, s in pairs]), geometric_mean,
                                            bootstrap),
        "length_ratio_mean": float(np.mean([c.num_tokens / s.num_tokens for c, s in pairs])),
    }

    def modelled(pairs_: list[tuple[AnswerSpeed, AnswerSpeed]]) -> np.ndarray:
        return np.array([costs.answer_seconds(s.step_rows) / costs.answer_seconds(c.step_rows) for c, s in pairs_])

    priced = costs is not None and all(c.step_rows and s.step_rows for c, s in pairs)
    if priced:
        fields["cost_speedup_geomean"] = Interval.of(modelled(pairs), geometric_mean, bootstrap)
        fields["cost_curve"] = costs.to_dict()
    # Timed beside (eval.sequential_model), both of a prompt's times are this run's: the sequential run need not
    # have timed that prompt alone (it times its own first `eval.timed_prompts`, which may be fewer).
    beside_pairs = [(c, s) for c, s in pairs if c.timed_alone and c.sequential_wall_s is not None]
    timed = beside_pairs or [(c, s) for c, s in pairs if c.timed_alone and s.timed_alone]
    fields["num_timed_prompts"] = len(timed)
    if timed:
        beside = bool(beside_pairs)
        if beside:
            check_beside(timed, sequential_name)
            sequential_walls = [_positive(c.sequential_wall_s, "sequential_wall_s", "stats") for c, _ in timed]
        else:
            sequential_walls = [s.wall(sequential_name) for _, s in timed]
        wall_speedups = np.array([w / c.wall("stats") for w, (c, _) in zip(sequential_walls, timed, strict=True)])
        fields.update(
            wall_timed_beside=beside,
            wall_speedup_geomean=Interval.of(wall_speedups, geometric_mean, bootstrap),
            wall_speedup_mean=Interval.of(wall_speedups, _mean, bootstrap),
            wall_speedup_min=float(wall_speedups.min()),
            wall_speedup_max=float(wall_speedups.max()),
            sequential_ms_per_token_median=float(np.median(
                [1000.0 * w / s.num_tokens for w, (_, s) in zip(sequential_walls, timed, strict=True)])),
        )
        if priced:
            fields["cost_speedup_timed_geomean"] = float(geometric_mean(modelled(timed)))
    return dataclasses.replace(summary, **fields)
