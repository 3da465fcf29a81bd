"""What an alpaca_eval preference may be (pasta.evaluation.annotations), shared by saved files and judge verdicts."""

from __future__ import annotations

import math

import pytest

from pasta.evaluation.annotations import preference_problem


@pytest.mark.parametrize("value", [1, 1.0, 1.5, 2, 0, None, math.nan])
def test_preferences_in_one_to_two_a_draw_and_not_judged_are_valid(value):
    assert preference_problem(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [(True, "is not a number"), ("1.5", "is not a number"), (2.5, "is outside [1, 2]"), (0.5, "is outside [1, 2]")],
)
def test_other_preferences_say_what_is_wrong(value, problem):
    assert problem in preference_problem(value)
