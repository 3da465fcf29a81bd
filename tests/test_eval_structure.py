"""The structure table of a run: forks, promises, malformed output, predicted vs actual chunk length, overruns, on
hand-written annotated answers whose values are known."""

from __future__ import annotations

import pytest

from pasta.config import compose
from pasta.errors import PastaError
from pasta.evaluation.structure import answer_structure, run_structure, structure_stats
from pasta.lang import ReservationPolicy, encode_text
from pasta.models import load_tokenizer

# Chunk lengths, counted in words here: (predicted, actual) = (3, 3), (5, 7) in the first, (2, 5) in the third.
ANSWERS = [
    {"instruction": "tips", "malformed": {"duplicate_topic": 2, "bad_count": 1},
     "annotated": 'Tips:\n<promise topic="a" tokens="3"/><promise topic="b" tokens="5"/>'
                  '<async topic="a">one two three</async><async topic="b">four five six seven eight nine ten</async>'
                  "<sync/>Done."},
    {"instruction": "fact", "malformed": {}, "annotated": "Paris."},
    {"instruction": "list", "malformed": {"empty_chunk": 1},
     "annotated": '<promise topic="x" tokens="2"/><async topic="x">a b c d e</async>'},
    # Not valid PASTA-LANG (a promise without its chunk): counted apart, no chunks.
    {"instruction": "broken", "annotated": '<promise topic="x" tokens="4"/> and no chunk'},
]


def count_words(text: str) -> int:
    return len(text.split())


def stats_of(answers, policy: ReservationPolicy):
    return structure_stats([answer_structure(a, count_words, policy) for a in answers])


def test_structure_of_hand_written_answers_has_the_known_fork_share_promises_and_events():
    stats = stats_of(ANSWERS, ReservationPolicy("exact"))
    assert (stats.num_answers, stats.num_forked, stats.fork_share) == (4, 2, 0.5)
    assert (stats.num_chunks, stats.promises_per_answer) == (3, 0.75)
    assert stats.malformed_per_answer == 0.5  # bad_count + empty_chunk over 4 answers
    assert stats.duplicate_topics_per_answer == 0.5
    assert stats.num_unparsed == 1


def test_predicted_vs_actual_chunk_length_gives_the_hand_computed_spearman_and_mae():
    stats = stats_of(ANSWERS, ReservationPolicy("exact"))
    # predicted [3, 5, 2] ranks [2, 3, 1]; actual [3, 7, 5] ranks [1, 3, 2]: 1 - 6 * 2 / (3 * 8) = 0.5
    assert stats.length_spearman == pytest.approx(0.5)
    assert stats.length_mae == pytest.approx((0 + 2 + 3) / 3)


def test_cross_thread_repetition_is_the_mean_share_over_forked_answers():
    answers = [
        {"instruction": "echo", "malformed": {}, "annotated": 'Garden tips:<promise topic="soil"/><promise topic="sun"/>'
         '<async topic="soil">Garden soil needs compost.</async><async topic="sun">Plants love sunlight.</async>'},
        {"instruction": "plain", "malformed": {}, "annotated": "Garden tips: water often."},
    ]
    stats = stats_of(answers, ReservationPolicy("uncounted"))
    # garden soil needs compost | plants love sunlight: garden (the intro) and soil (its topic) of 7 content words
    assert stats.cross_thread_repetition == pytest.approx(2 / 7)
    assert stats_of(answers[1:], ReservationPolicy("uncounted")).cross_thread_repetition is None


def test_uncounted_promises_are_forks_without_a_length_prediction():
    answers = [*ANSWERS, {"instruction": "uncounted", "malformed": {},
                          "annotated": '<promise topic="u"/><async topic="u">one two three four five</async>'}]
    stats = stats_of(answers, ReservationPolicy("uncounted", fixed=4))
    assert (stats.num_forked, stats.num_chunks) == (3, 4)
    assert stats.length_mae == pytest.approx((0 + 2 + 3) / 3)  # the three counted chunks only
    assert stats.num_overruns == 3  # 7 > 4, 5 > 4, and the uncounted chunk's 5 > fixed 4


@pytest.mark.parametrize(("policy", "overruns"), [
    (ReservationPolicy("exact"), 2),  # 7 > 5 and 5 > 2
    (ReservationPolicy("scale", scale=2.0), 1),  # reserved 6, 10, 4: only 5 > 4
    (ReservationPolicy("fixed", fixed=4), 2),  # 7 > 4 and 5 > 4
])
def test_overruns_are_chunks_longer_than_the_policys_reservation(policy, overruns):
    assert stats_of(ANSWERS, policy).num_overruns == overruns


def test_one_predicted_length_for_every_chunk_leaves_the_rank_correlation_undefined():
    same = [{"instruction": str(i), "malformed": {},
             "annotated": f'<promise topic="t" tokens="14"/><async topic="t">{"w " * (i + 1)}</async>'}
            for i in range(3)]
    stats = stats_of(same, ReservationPolicy("exact"))
    assert stats.length_spearman is None and stats.length_mae == pytest.approx((13 + 12 + 11) / 3)
    assert stats_of(ANSWERS[1:2], ReservationPolicy("exact")).length_mae is None


def test_chunks_are_measured_in_the_students_tokens_under_the_recorded_policy():
    cfg = compose("eval", ["model=tiny"])
    meta = {"model": "tiny", "reservation": {"policy": "exact", "scale": 2.0, "multiple": 16, "fixed": 64}}
    stats = run_structure(ANSWERS, meta, cfg.model, cfg.lang)
    tokenizer = load_tokenizer(cfg.model)
    actual = [len(encode_text(tokenizer, text)) for text in ("one two three", "four five six seven eight nine ten",
                                                             "a b c d e")]
    assert stats.length_mae == pytest.approx((abs(actual[0] - 3) + abs(actual[1] - 5) + abs(actual[2] - 2)) / 3)
    assert stats.reservation["policy"] == "exact"
    assert stats.num_overruns == sum(a > p for a, p in zip(actual, (3, 5, 2), strict=True))


def test_answers_without_promises_need_no_tokenizer():
    # run.json names a model the config cannot load: fine as long as no chunk has to be measured.
    cfg = compose("eval", ["model=tiny"])
    stats = run_structure([ANSWERS[1]], {"model": "some-other-model"}, cfg.model, cfg.lang)
    assert (stats.num_forked, stats.num_chunks, stats.reservation["policy"]) == (0, 0, cfg.lang.reservation.policy)
    with pytest.raises(PastaError, match="decoded by 'some-other-model'"):
        run_structure(ANSWERS[:1], {"model": "some-other-model"}, cfg.model, cfg.lang)
