"""Validation of teacher answers: hand-made good and bad annotations, whitespace re-alignment, unusable originals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pasta.annotation import Rejected, check_original, realign_whitespace, validate_annotation
from pasta.lang import Document, Promise, Sync, Text, parse, plain_text, serialize

ROOT = Path(__file__).resolve().parent.parent
ORIGINAL = (
    "Two ways to sleep better:\n\n"
    "1. Keep a fixed bedtime, even on weekends.\n"
    "2. Keep the bedroom dark, quiet and cool.\n\n"
    "Together they help you fall asleep faster."
)
GOOD = (
    "Two ways to sleep better:\n\n"
    '<promise topic="fixed bedtime"/>\n<promise topic="dark cool room"/>'
    '<async topic="fixed bedtime">1. Keep a fixed bedtime, even on weekends.</async>'
    '<async topic="dark cool room">2. Keep the bedroom dark, quiet and cool.</async><sync/>\n\n'
    "Together they help you fall asleep faster."
)


def reason_of(original: str, answer: str | None) -> str:
    with pytest.raises(Rejected) as caught:
        validate_annotation(original, answer)
    return caught.value.reason


def test_exact_annotation_is_accepted_unchanged():
    doc = validate_annotation(ORIGINAL, GOOD)
    assert serialize(doc) == GOOD
    assert [p.topic for p in doc.promises] == ["fixed bedtime", "dark cool room"]


def test_fixture_annotations_are_all_accepted_with_their_plain_text():
    for line in (ROOT / "data" / "annotated_examples.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        doc = validate_annotation(record["output"], record["annotated"])
        assert plain_text(doc) == record["output"]


def test_answer_without_tags_is_accepted_as_sequential():
    doc = validate_annotation(ORIGINAL, ORIGINAL)
    assert not doc.is_annotated and plain_text(doc) == ORIGINAL


def test_whitespace_differences_are_realigned_to_the_original_exactly():
    # The teacher dropped the blank lines and wrapped with different spacing; tags stay among the same words.
    sloppy = GOOD.replace("\n\n", "\n").replace("1. Keep", "1.  Keep") + "\n"
    doc = validate_annotation(ORIGINAL, sloppy)
    assert plain_text(doc) == ORIGINAL
    assert [p.content for p in doc.promises] == [
        "1. Keep a fixed bedtime, even on weekends.",
        "2. Keep the bedroom dark, quiet and cool.",
    ]
    # The blank line before the conclusion follows <sync/>, as in the teacher's answer.
    assert serialize(doc).endswith("<sync/>\n\nTogether they help you fall asleep faster.")


def test_leading_and_trailing_whitespace_of_the_original_goes_to_the_main_text():
    original = "\n  alpha beta\n\ngamma delta  \n"
    answer = '<promise topic="a"/> <promise topic="b"/><async topic="a">alpha beta</async><async topic="b">gamma delta</async>'
    doc = validate_annotation(original, answer)
    assert plain_text(doc) == original
    assert [p.content for p in doc.promises] == ["alpha beta", "gamma delta"]
    assert doc.items[0] == Text("\n  ")


def test_one_enclosing_code_fence_is_unwrapped():
    doc = validate_annotation(ORIGINAL, f"````text\n{GOOD}\n````\n")
    assert serialize(doc) == GOOD


@pytest.mark.parametrize(
    ("answer", "code", "detail"),
    [
        (None, "empty_reply", "no text"),
        ("  \n", "empty_reply", "no text"),
        ("Sure! Here is the annotated response:\n" + GOOD, "extra_text", "before: 'Sure! Here is the annotated"),
        (GOOD + "\n\nI added two promises.", "extra_text", "after: 'I added two promises.'"),
        (GOOD[: GOOD.index("<async")], "parse_error", "has no async block"),
        (GOOD[: GOOD.index("<async") + 10], "parse_error", "malformed async tag"),
        (ORIGINAL[:60], "truncated", "stops after"),
        ("I'm sorry, but I can't help with that.", "refused", "I'm sorry"),
        (GOOD.replace("fixed bedtime,", "regular bedtime,"), "text_changed", "expected 'fixed bedtime"),
        (GOOD.replace("1. Keep", "Keep"), "text_changed", "expected '1. Keep"),
        ('<promise topic=fixed/>' + ORIGINAL, "parse_error", "malformed promise tag"),
        (GOOD.replace('topic="fixed bedtime"', 'topic=""'), "parse_error", "empty topic"),
        (
            GOOD.replace("1. Keep a fixed bedtime, even on weekends.</async>", "</async>1. Keep a fixed bedtime, even on weekends."),
            "parse_error",
            "is empty",
        ),
        ("\x00\x01garbage <async>", "parse_error", "malformed async tag"),
    ],
)
def test_bad_answers_are_rejected_with_a_reason(answer, code, detail):
    reason = reason_of(ORIGINAL, answer)
    assert reason.startswith(f"{code}: ")
    assert detail in reason


def test_parse_error_reason_carries_the_character_offset():
    bad = GOOD.replace("<sync/>", "<sync>")
    assert reason_of(ORIGINAL, bad).startswith(f"parse_error: at char {bad.index('<sync>')}: malformed sync tag")


@pytest.mark.parametrize(
    ("response", "code"),
    [
        ("", "empty_response"),
        ("  \n ", "empty_response"),
        ("text with a lone surrogate \udc80", "invalid_unicode"),
        ('Already tagged <promise topic="x"/> text<async topic="x">y</async>', "contains_tags"),
        ("half a tag <promise topic=x> here", "contains_tags"),
        ("x" * 101, "too_long"),
    ],
)
def test_originals_that_cannot_be_annotated_are_rejected_before_the_teacher(response, code):
    with pytest.raises(Rejected) as caught:
        check_original("Do something.", "", response, max_response_chars=100)
    assert caught.value.code == code


def test_html_and_comparisons_in_an_original_are_fine():
    check_original("Compare.", "", "Use <b>bold</b> when 3 < 4 and <promises> are kept.", max_response_chars=None)


_WORD = st.text(alphabet="abcXYZ.,1é", min_size=1, max_size=4)
_SPACE = st.text(alphabet=" \n\t\u00a0", min_size=1, max_size=3)


@st.composite
def annotated_with_sloppy_whitespace(draw):
    """(original, teacher answer) where the answer has the original's words and tags but other whitespace."""
    num_words = draw(st.integers(2, 12))
    words = [draw(_WORD) for _ in range(num_words)]
    original_spaces = [draw(_SPACE) for _ in range(num_words - 1)]
    edges = (draw(st.sampled_from(["", " ", "\n\n"])), draw(st.sampled_from(["", "\n", " \n"])))
    original = edges[0] + "".join(w + s for w, s in zip(words, original_spaces + [""], strict=True)) + edges[1]
    # Chunks are runs of whole words; the main text keeps the rest.
    cut = sorted(draw(st.sets(st.integers(0, num_words), min_size=2, max_size=6)))
    spans = list(zip(cut[::2], cut[1::2], strict=False))
    items: list[Text | Promise | Sync] = []
    position = 0
    for number, (start, end) in enumerate(spans):
        if start > position or (items and not isinstance(items[-1], Text)):
            between = " ".join(words[position:start])
            items.append(Text(f" {between} " if between else " "))
        items.append(Promise(topic=f"t{number}", content=" ".join(words[start:end])))
        if draw(st.booleans()):
            items.append(Sync())
        position = end
    items.append(Text(" " + " ".join(words[position:])))
    return original, serialize(Document(tuple(items)))


@settings(max_examples=200, deadline=None)
@given(annotated_with_sloppy_whitespace())
def test_realignment_keeps_words_and_tags_and_restores_the_exact_original(case):
    original, answer = case
    doc = validate_annotation(original, answer)
    assert plain_text(doc) == original
    teacher_doc = parse(answer)
    assert [p.topic for p in doc.promises] == [p.topic for p in teacher_doc.promises]
    assert [p.content.split() for p in doc.promises] == [p.content.split() for p in teacher_doc.promises]
    assert sum(isinstance(i, Sync) for i in doc.items) == sum(isinstance(i, Sync) for i in teacher_doc.items)
    assert parse(serialize(doc)) == doc


def test_realign_is_identity_when_whitespace_already_matches():
    doc = parse(GOOD)
    assert realign_whitespace(doc, ORIGINAL) == doc


def test_an_answer_naming_one_topic_twice_is_rejected_even_in_two_groups():
    """The parser refuses a repeat within one group; the decoder's grammar anywhere in an answer."""
    original = "Intro.\nA: cheap.\nB: fast.\nMore.\nA: cheap again."
    answer = ('Intro.\nA: <promise topic="price"/><async topic="price">cheap.</async><sync/>\nMore.\n'
              'A: <promise topic="Price!"/><async topic="Price!">cheap again.</async>')
    with pytest.raises(Rejected, match="^duplicate_topic: topic 'Price!' repeats an earlier promise's words$"):
        validate_annotation(original, answer)


def test_a_topic_with_a_lone_surrogate_is_refused_and_its_reject_line_can_be_written():
    from pasta.annotation.records import make_record
    from pasta.data import Record

    answer = '<promise topic="a\ud800"/><async topic="a\ud800">Hi.</async>'
    with pytest.raises(Rejected) as rejected:
        validate_annotation("Hi.", answer)
    assert rejected.value.code == "parse_error" and "lone surrogate" in rejected.value.reason
    record = make_record(source=Record(instruction="Say hi.", output="Hi."), teacher="t",
                         teacher_model="m", reject_reason=rejected.value.reason, teacher_output=answer)
    json.dumps(record, ensure_ascii=False).encode("utf-8")  # what the output file holds
