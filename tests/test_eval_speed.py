"""Speed metrics on hand-made numbers: geometric means, bootstrap intervals, joining runs by instruction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pasta.decoding.cost_model import StepCosts
from pasta.errors import PastaError
from pasta.evaluation.speed import BootstrapConfig, SpeedSummary, bootstrap_ci, speed_metrics
from pasta.measure import geometric_mean


def stats(instruction: str, wall_s: float, num_tokens: int = 100, num_steps: int = 100) -> dict:
    return {"instruction": instruction, "wall_s": wall_s, "num_tokens": num_tokens, "num_steps": num_steps}


def test_geometric_mean_of_hand_made_numbers():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert geometric_mean([3.0]) == pytest.approx(3.0)
    # A speedup and the matching slowdown cancel: the reason the paper averages speedups geometrically.
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)


def test_geometric_mean_reduces_the_last_axis_of_resamples():
    assert geometric_mean(np.array([[1.0, 4.0], [2.0, 8.0]])) == pytest.approx([2.0, 4.0])


@pytest.mark.parametrize("values", [[], [1.0, 0.0], [2.0, -1.0]])
def test_geometric_mean_rejects_empty_and_non_positive_values(values):
    with pytest.raises(ValueError):
        geometric_mean(values)


def test_bootstrap_of_a_constant_is_that_constant():
    assert bootstrap_ci([1.5] * 7, geometric_mean, BootstrapConfig(num_resamples=200)) == pytest.approx((1.5, 1.5))


def test_bootstrap_is_repeatable_with_a_seed_and_varies_with_another():
    values = [1.0, 1.2, 1.7, 2.5, 0.9, 1.4, 3.0, 1.1]
    first = bootstrap_ci(values, geometric_mean, BootstrapConfig(num_resamples=500, seed=3))
    again = bootstrap_ci(values, geometric_mean, BootstrapConfig(num_resamples=500, seed=3))
    other = bootstrap_ci(values, geometric_mean, BootstrapConfig(num_resamples=500, seed=4))
    assert first == again
    assert first != other


def test_bootstrap_interval_brackets_the_estimate_and_matches_a_normal_approximation():
    rng = np.random.default_rng(0)
    values = rng.normal(10.0, 2.0, size=400)
    low, high = bootstrap_ci(values, lambda s: s.mean(axis=-1), BootstrapConfig(num_resamples=4000, seed=1))
    assert low < values.mean() < high
    # For a mean, the 95% percentile interval is close to mean +- 1.96 standard errors.
    half_width = 1.96 * values.std(ddof=1) / math.sqrt(values.size)
    assert (high - low) / 2 == pytest.approx(half_width, rel=0.1)


def test_bootstrap_interval_narrows_with_more_prompts():
    rng = np.random.default_rng(0)
    few = rng.lognormal(0.3, 0.4, size=20)
    many = rng.lognormal(0.3, 0.4, size=2000)
    config = BootstrapConfig(num_resamples=1000)
    few_low, few_high = bootstrap_ci(few, geometric_mean, config)
    many_low, many_high = bootstrap_ci(many, geometric_mean, config)
    assert many_high - many_low < (few_high - few_low) / 3


def test_per_prompt_wall_speedups_are_joined_by_instruction_and_averaged_geometrically():
    candidate = [stats("a", 1.0, num_tokens=120, num_steps=60), stats("b", 2.0, num_tokens=90, num_steps=90)]
    # Given in another order, with an extra prompt the candidate did not decode.
    sequential = [stats("c", 9.0), stats("b", 1.0), stats("a", 4.0)]
    metrics = speed_metrics(candidate, sequential, bootstrap=BootstrapConfig(num_resamples=100))
    # Speedups: a = 4 / 1 = 4, b = 1 / 2 = 0.5; geometric mean sqrt(2).
    assert metrics.wall_speedup_geomean.value == pytest.approx(math.sqrt(2.0))
    assert metrics.wall_speedup_mean.value == pytest.approx(2.25)
    assert (metrics.wall_speedup_min, metrics.wall_speedup_max) == pytest.approx((0.5, 4.0))
    assert metrics.theoretical_speedup_geomean.value == pytest.approx(math.sqrt(2.0 * 1.0))
    # Latency per token: a 1000 * 1.0 / 120 = 8.33 ms, b 1000 * 2.0 / 90 = 22.2 ms; median of two = their mean.
    assert metrics.ms_per_token_median == pytest.approx((1000 / 120 + 2000 / 90) / 2)
    interval = metrics.wall_speedup_geomean
    assert 0.5 <= interval.ci_low <= interval.value <= interval.ci_high <= 4.0


def test_parallelism_is_each_answer_against_its_own_plain_text_replayed_sequentially():
    forked = {**stats("a", 1.0, 100, 50), "replay_wall_s": 3.0, "num_threads": 2}
    also_forked = {**stats("d", 1.0, 100, 80), "replay_wall_s": 4.0 / 3.0, "num_threads": 1}
    plain = stats("b", 2.0, 100, 100)  # forked nothing: it was its own plain decode
    batched = {**stats("c", 5.0, 100, 100), "batch_size": 4, "num_threads": 1}  # a batch's wall time: no ratio
    metrics = speed_metrics([forked, also_forked, plain, batched], None, bootstrap=BootstrapConfig(num_resamples=10))
    assert metrics.num_replayed == 2
    assert metrics.parallelism_forked_geomean == pytest.approx(2.0)  # sqrt(3 * 4/3)
    assert metrics.parallelism_geomean.value == pytest.approx(4.0 ** (1 / 3))  # 3, 4/3 and 1
    unreplayed = speed_metrics([stats("a", 1.0, 100, 50)], None, bootstrap=BootstrapConfig(num_resamples=10))
    assert unreplayed.parallelism_geomean is None and unreplayed.num_replayed is None


def test_without_a_sequential_run_only_theoretical_speed_and_latency_are_reported():
    metrics = speed_metrics([stats("a", 1.0, 100, 50)], None, bootstrap=BootstrapConfig(num_resamples=10))
    assert metrics.theoretical_speedup_geomean.value == pytest.approx(2.0)
    assert metrics.wall_speedup_geomean is None and metrics.headline is None


def test_a_throughput_runs_latency_per_token_is_each_answers_batch_wall_time_and_says_so():
    from pasta.evaluation.formatting import run_markdown

    batched = [stats("a", 4.0, 100, 50) | {"batch_size": 2, "timed_alone": False},
               stats("b", 4.0, 50, 50) | {"batch_size": 2, "timed_alone": False}]
    metrics = speed_metrics(batched, None, bootstrap=BootstrapConfig(num_resamples=10))
    assert metrics.ms_per_token_batched and metrics.ms_per_token_median == pytest.approx((40 + 80) / 2)
    assert SpeedSummary.from_dict(metrics.to_dict()) == metrics
    text = run_markdown({"generator": "r", "num_prompts": 2, "speed": metrics.to_dict()})
    assert "each one's batch wall time over its tokens" in text
    one_alone = speed_metrics([batched[0], stats("c", 1.0, 100, 50)], None, bootstrap=BootstrapConfig(num_resamples=10))
    assert not one_alone.ms_per_token_batched and one_alone.ms_per_token_median == pytest.approx(10.0)
    assert "batch wall time" not in run_markdown({"generator": "r", "num_prompts": 2, "speed": one_alone.to_dict()})


def test_sequential_run_missing_an_instruction_is_an_error_naming_the_run_and_instruction():
    with pytest.raises(PastaError, match=r"baseline-sft lacks 1 of the 2 .*'Name three colours.'"):
        speed_metrics(
            [stats("Say hi.", 1.0), stats("Name three colours.", 1.0)],
            [stats("Say hi.", 2.0)],
            sequential_name="baseline-sft",
        )


def test_a_zero_wall_time_is_an_error_not_an_infinite_speedup():
    with pytest.raises(PastaError, match="wall_s"):
        speed_metrics([stats("a", 0.0)], [stats("a", 1.0)])


def test_answers_that_forked_or_had_malformed_tags_are_counted():
    records = [
        {**stats("a", 1.0), "num_threads": 3, "malformed": {}},
        {**stats("b", 1.0), "num_threads": 0, "malformed": {"unclosed_promise": 1}},
        stats("c", 1.0),  # a stats file from a sequential run: no thread fields
    ]
    metrics = speed_metrics(records, None, bootstrap=BootstrapConfig(num_resamples=10))
    assert (metrics.num_with_threads, metrics.num_malformed) == (1, 1)


# --- steps and the cost model ----------------------------------------------------------------------------------

COSTS = StepCosts(rows=[1, 3, 10], seconds=[1.0, 2.0, 5.0])  # rows alone: no request or cache-length term


def test_cost_and_step_speedups_price_every_answer_and_wall_speedups_only_the_prompts_timed_alone():
    sequential = [stats("a", 8.0, num_tokens=7, num_steps=7) | {"step_rows": [10] + [1] * 6, "batch_size": 1},
                  stats("b", 8.0, num_tokens=7, num_steps=7) | {"step_rows": [10] + [1] * 6, "batch_size": 1}]
    candidate = [stats("a", 4.0, num_tokens=7, num_steps=3) | {"step_rows": [10, 3, 3], "batch_size": 1},
                 stats("b", 99.0, num_tokens=7, num_steps=3) | {"step_rows": [10, 3, 3], "batch_size": 2}]
    metrics = speed_metrics(candidate, sequential, costs=COSTS, bootstrap=BootstrapConfig(num_resamples=50))
    assert metrics.step_speedup_geomean.value == pytest.approx(7 / 3)
    assert metrics.cost_speedup_geomean.value == pytest.approx((5 + 6) / (5 + 4))
    assert metrics.num_timed_prompts == 1  # b was batched: its wall time is its batch's
    assert metrics.wall_speedup_geomean.value == pytest.approx(2.0)
    assert metrics.cost_speedup_timed_geomean == pytest.approx(11 / 9)


def test_sequential_times_taken_beside_each_answer_replace_the_sequential_runs_own():
    """eval.sequential_model: the sequential answer timed right after the candidate's, in the same run, is what
    the wall-clock speedup divides; the sequential run (timed hours earlier, on a slower machine here) gives the
    steps only. Its answers must be that run's: another length is one error."""
    sequential = [stats("a", 9.0, num_tokens=7, num_steps=7), stats("b", 9.0, num_tokens=5, num_steps=5)]
    candidate = [stats("a", 2.0, num_tokens=7, num_steps=3) | {"sequential_wall_s": 4.0, "sequential_num_tokens": 7},
                 stats("b", 1.0, num_tokens=5, num_steps=5) | {"sequential_wall_s": 1.0, "sequential_num_tokens": 5}]
    metrics = speed_metrics(candidate, sequential, bootstrap=BootstrapConfig(num_resamples=20))
    assert metrics.wall_timed_beside and metrics.wall_speedup_geomean.value == pytest.approx(2.0 ** 0.5)
    assert metrics.sequential_ms_per_token_median == pytest.approx((4000 / 7 + 1000 / 5) / 2)
    assert metrics.step_speedup_geomean.value == pytest.approx((7 / 3) ** 0.5)
    own = speed_metrics([stats("a", 2.0, num_tokens=7, num_steps=3)], sequential[:1],
                        bootstrap=BootstrapConfig(num_resamples=20))
    assert not own.wall_timed_beside and own.wall_speedup_geomean.value == pytest.approx(4.5)
    # A prompt the sequential run decoded in a batch still counts when timed beside: both its times are this run's
    # (a run timing 50 prompts against a sequential run that timed 20 measures 50).
    batched = [sequential[0], sequential[1] | {"batch_size": 4}]
    again = speed_metrics(candidate, batched, bootstrap=BootstrapConfig(num_resamples=20))
    assert again.num_timed_prompts == 2 and again.wall_speedup_geomean.value == pytest.approx(2.0 ** 0.5)
    candidate[1]["sequential_num_tokens"] = 6
    with pytest.raises(PastaError, match=r"eval.sequential_model decoded 1 of the 2 timed prompts to another length "
                                         r"than baseline-sft's answers \(first: 'b'\)"):
        speed_metrics(candidate, sequential, sequential_name="baseline-sft")


def test_without_prompts_timed_alone_there_is_no_wall_speedup_but_still_a_step_speedup():
    sequential = [stats("a", 8.0, num_steps=100) | {"batch_size": 4}]
    candidate = [stats("a", 4.0, num_steps=50) | {"batch_size": 4}]
    metrics = speed_metrics(candidate, sequential, bootstrap=BootstrapConfig(num_resamples=50))
    assert metrics.wall_speedup_geomean is None and metrics.num_timed_prompts == 0
    assert metrics.step_speedup_geomean.value == pytest.approx(2.0)
    assert metrics.cost_speedup_geomean is None  # no cost model given
    # A prompt left alone in a throughput batch (the last of a run, or a resume's one left) was decoded one at a
    # time, but cold: no warm-up ran before it and nothing was timed beside it.
    left_alone = {"batch_size": 1, "timed_alone": False}
    metrics = speed_metrics([candidate[0] | left_alone], [sequential[0] | left_alone],
                            bootstrap=BootstrapConfig(num_resamples=50))
    assert metrics.wall_speedup_geomean is None and metrics.num_timed_prompts == 0


def test_the_summary_round_trips_through_speed_json_and_its_headline_is_the_wall_clock_speedup():
    sequential = [stats("a", 8.0, num_tokens=7, num_steps=7) | {"step_rows": [10] + [1] * 6}]
    candidate = [stats("a", 4.0, num_tokens=7, num_steps=3) | {"step_rows": [10, 3, 3]}]
    metrics = speed_metrics(candidate, sequential, costs=COSTS, bootstrap=BootstrapConfig(num_resamples=20))
    record = metrics.to_dict()
    assert record["wall_speedup_geomean"] == {"value": 2.0, "ci_low": 2.0, "ci_high": 2.0}
    assert "sequential_ms_per_token_median" in record and "wall_speedup_mean" in record
    assert SpeedSummary.from_dict(record) == metrics and metrics.headline.value == pytest.approx(2.0)
    alone = speed_metrics(candidate, None, bootstrap=BootstrapConfig(num_resamples=20)).to_dict()
    assert "wall_speedup_geomean" not in alone and "sequential_run" not in alone  # not computed: not written
