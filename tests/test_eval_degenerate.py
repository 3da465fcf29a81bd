"""Degenerate answers: loops cut by the budget, budget cuts, promise lists whose topics loop."""

from pasta.evaluation.degenerate import DegenerateCounts, count_degenerate, ends_in_loop, topics_loop


def stats(output, finish_reason="eos", annotated=None):
    return {"output": output, "finish_reason": finish_reason, "annotated": annotated or output}


def test_a_repeated_phrase_at_the_end_is_a_loop_even_when_the_budget_cut_a_word():
    assert ends_in_loop("Wear something nice, like a dress or a dress or a dress or a dress or a dress or a dr")
    assert ends_in_loop("Steps: " + "mix the flour. " * 12)


def test_an_ordinary_ending_or_a_short_emphasis_is_not_a_loop():
    assert not ends_in_loop("No, no, no. You should sleep more, eat well and keep moving every day.")
    assert not ends_in_loop("1. Eat well.\n2. Sleep well.\n3. Move every day.\n4. Drink water.")


def test_topics_that_repeat_inside_themselves_or_each_other_loop():
    assert topics_loop(["create a business plan with a timeline and a budget and a timeline and a budget"])
    assert topics_loop(["Budget", "timeline", "budget"])
    assert not topics_loop(["budget", "timeline", "team"])


def test_a_run_counts_each_kind_once_per_answer():
    loop = "Pick " + "a dress or " * 8
    rows = [
        stats("Done.", "eos"),
        stats("A long answer that just ran out of", "max_new_tokens"),
        stats(loop, "max_total_tokens"),
        stats(loop, "eos"),  # a repetition that ended by itself is not cut by the budget
        stats("Plan:\n- Budget\n- Budget", "eos",
              annotated='Plan:\n<promise topic="Budget"/><promise topic="budget"/><async topic="Budget">- Budget\n'
                        '</async><async topic="budget">- Budget</async><sync/>'),
    ]
    assert count_degenerate(rows) == DegenerateCounts(num_answers=5, num_budget_cuts=2, num_loops=1,
                                                      num_topic_loops=1)


def test_a_chunk_that_loops_counts_even_when_the_plain_text_ends_elsewhere():
    annotated = ('Tips:<promise topic="a"/><promise topic="b"/><async topic="a">' + "eat more fruit and " * 6
                 + '</async><async topic="b">Sleep.</async><sync/> Done.')
    assert count_degenerate([stats("irrelevant", "max_total_tokens", annotated)]).num_loops == 1
