"""The cost model (pasta/decoding/step_costs.py): c(rows, requests, slots) priced from its measured terms, and
measured through the decoder's own step."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.models import lively_model
from pasta.decoding import runner
from pasta.decoding.cost_model import StepCosts
from pasta.decoding.step_costs import measure_step_costs

COSTS = StepCosts(rows=[1, 3, 10], seconds=[1.0, 2.0, 5.0], requests=[1, 2, 4], request_seconds=[1.0, 2.0, 4.0],
                  slot_seconds=0.01, cache_len=100)


def test_the_rows_term_interpolates_between_measured_rows_and_extends_the_last_slope():
    assert [COSTS.rows_cost(q) for q in (1, 2, 3, 10)] == pytest.approx([1.0, 1.5, 2.0, 5.0])
    assert COSTS.rows_cost(17) == pytest.approx(5.0 + 7 * 3.0 / 7)  # the slope of 3..10 beyond the last point


def test_requests_and_attended_slots_add_to_what_the_rows_cost():
    assert COSTS.cost(4, 1) == pytest.approx(COSTS.rows_cost(4))  # one request over cache_len slots
    # 4 requests feeding one row each cost 4.0 where one request's 4 rows cost 2 + 2/7: the rest is theirs.
    assert COSTS.requests_cost(4) == pytest.approx(4.0 - (2.0 + 3.0 / 7))
    assert COSTS.cost(6, 4) == pytest.approx(COSTS.rows_cost(6) + COSTS.requests_cost(4))
    assert COSTS.cost(6, 4, num_slots=4 * 100 + 50) == pytest.approx(COSTS.cost(6, 4) + 50 * 0.01)


def test_an_answer_is_priced_step_by_step_over_the_cache_it_has_filled():
    # 10 prompt rows, then 3 and 1: caches of 10, 13 and 14 slots, each 100 - n short of cache_len.
    expected = sum(COSTS.rows_cost(q) + 0.01 * (slots - 100) for q, slots in ((10, 10), (3, 13), (1, 14)))
    assert COSTS.answer_seconds([10, 3, 1]) == pytest.approx(expected)
    assert COSTS.answer_seconds([10, 3, 1], prefill=False) == pytest.approx(expected - (5.0 - 0.9))


def test_steps_priced_from_their_distributions_cost_what_they_cost_one_by_one():
    steps = [(1, 1, 120), (5, 2, 230), (9, 4, 420), (40, 3, 300)]  # (rows, requests, slots)
    one_by_one = sum(COSTS.cost(*step) for step in steps)
    rows = [(r, 1) for r, _, _ in steps]
    requests = [(2, 1), (4, 1), (3, 1), (1, 1)]
    assert COSTS.steps_seconds(rows, requests, sum(s for _, _, s in steps)) == pytest.approx(one_by_one)


def test_a_version_1_record_prices_rows_alone(tmp_path):
    from pasta.evaluation.run_files import read_step_costs

    version_1 = {"rows": [1, 3, 10], "seconds": [1.0, 2.0, 5.0], "prefix_len": 256}
    old = StepCosts.from_dict(version_1)
    assert old.version == 1 and old.cost(6, 4, num_slots=9999) == pytest.approx(old.rows_cost(6))
    assert StepCosts.from_dict(COSTS.to_dict()) == COSTS
    # A sequential run's step_costs.json from before version 2 is read so too when a run is scored against it.
    (tmp_path / "step_costs.json").write_text(json.dumps(version_1))
    assert read_step_costs(tmp_path) == old


def test_the_cost_model_is_measured_through_the_decoders_own_step(tiny_model_and_tokenizer, torch_threads,
                                                                   monkeypatch):
    model, _ = lively_model(tiny_model_and_tokenizer[1])
    timed = []
    step = runner.StepBatch.step

    def spy(self):
        outcome = step(self)
        timed.append((outcome.timing.num_rows, outcome.timing.num_requests, outcome.timing.num_slots))
        return outcome

    monkeypatch.setattr(runner.StepBatch, "step", spy)
    costs = measure_step_costs(model, rows=(1, 4), requests=(1, 3), cache_len=16, repeats=1)
    assert costs.rows == [1, 4] and costs.requests == [1, 3] and costs.cache_len == 16
    assert 0 < costs.seconds[0] <= costs.seconds[1] and 0 < costs.request_seconds[0] <= costs.request_seconds[1]
    assert costs.slot_seconds >= 0
    # The probes' one-token prompts; then each round: 1 and 3 requests of one row over 16 slots, then over 32; one
    # request of 1 and 4 rows.
    assert timed[:7] == [(3, 3, 3), (1, 1, 17), (3, 3, 51), (1, 1, 33), (3, 3, 99), (1, 1, 17), (4, 1, 20)]
    assert len(timed) == 1 + 2 * 6 and not torch.is_inference_mode_enabled()
