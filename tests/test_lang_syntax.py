"""PASTA-LANG inline form: parsing, errors with offsets, serialization and plain text (no model needed)."""

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pasta.lang import (
    Document,
    LangError,
    Promise,
    Sync,
    Text,
    parse,
    plain_text,
    serialize,
    strip_annotations,
    strip_tags,
)

ISSUE_EXAMPLE = (
    'Two ways to sleep better: <promise topic="routine" tokens="18"/><promise topic="room" tokens="15"/>'
    '<async topic="routine">Keep a fixed bedtime, even on weekends.</async>'
    '<async topic="room">Keep the bedroom dark and cool.</async><sync/> Together they help you fall asleep faster.'
)


def test_issue_example_parses_into_text_promises_sync_text():
    doc = parse(ISSUE_EXAMPLE)
    assert doc.items == (
        Text("Two ways to sleep better: "),
        Promise("routine", "Keep a fixed bedtime, even on weekends.", 18),
        Promise("room", "Keep the bedroom dark and cool.", 15),
        Sync(),
        Text(" Together they help you fall asleep faster."),
    )
    assert [[p.topic for p in g] for g in doc.groups] == [["routine", "room"]]


def test_plain_text_splices_chunks_at_their_promises_keeping_whitespace():
    annotated = (
        'Tips:\n<promise topic="a"/>\n<promise topic="b"/><async topic="a">1. Sleep.</async>'
        '<async topic="b">2. Eat.</async><sync/>\nDone.'
    )
    assert plain_text(parse(annotated)) == "Tips:\n1. Sleep.\n2. Eat.\nDone."


def test_canonical_text_round_trips_exactly():
    assert serialize(parse(ISSUE_EXAMPLE)) == ISSUE_EXAMPLE


def test_async_blocks_after_main_text_are_accepted_and_serialized_before_sync():
    annotated = '<promise topic="a"/> then text <async topic="a">A</async> more<sync/>end'
    doc = parse(annotated)
    assert plain_text(doc) == "A then text  moreend"
    assert serialize(doc) == '<promise topic="a"/> then text  more<async topic="a">A</async><sync/>end'
    assert parse(serialize(doc)) == doc


def test_teacher_form_without_tokens_is_accepted_unless_required():
    annotated = '<promise topic="a"/><async topic="a">x</async>'
    assert parse(annotated).promises[0].num_tokens is None
    with pytest.raises(LangError, match="no tokens"):
        parse(annotated, require_tokens=True)


def test_angle_brackets_that_are_not_pasta_tags_are_plain_text():
    text = 'if 3 < 4 and x > 2: print("<b>bold</b>") <promises> <synced/> <asyncio>'
    doc = parse(text)
    assert doc.items == (Text(text),)
    assert not doc.is_annotated


def test_several_groups_each_closed_by_sync_or_the_end():
    annotated = (
        '<promise topic="a"/><async topic="a">A</async><sync/>mid'
        '<promise topic="a"/><promise topic="b"/><async topic="a">A2</async><async topic="b">B</async>'
    )
    doc = parse(annotated)
    assert [[p.topic for p in g] for g in doc.groups] == [["a"], ["a", "b"]]
    assert plain_text(doc) == "AmidA2B"


@pytest.mark.parametrize(
    ("annotated", "num_lead_words"),
    [
        ('1.<promise topic="a"/><async topic="a">A</async>', 1),
        ('<promise topic="a"/><async topic="a">A</async>', 0),
        ('Two things:\n\n1.<promise topic="a"/><async topic="a">A</async> then <promise topic="b"/>'
         '<async topic="b">B</async>', 3),
        ("no promise at all", None),
    ],
)
def test_the_lead_is_the_main_threads_words_before_its_first_promise(annotated, num_lead_words):
    assert parse(annotated).num_lead_words == num_lead_words


@pytest.mark.parametrize(
    ("annotated", "message", "offset"),
    [
        ('ab<promise topic="x">', "malformed promise tag", 2),
        ('<promise topic="x"/>', 'promise "x" has no async block before the end', 0),
        ('<promise topic="x"/><sync/>', 'promise "x" has no async block before <sync/>', 0),
        ('ab<async topic="x">c</async>', 'async block "x" has no promise', 2),
        ('<promise topic="x"/><promise topic="x"/>', 'duplicate topic "x"', 20),
        ('<promise topic="x" tokens="ten"/><async topic="x">c</async>', "not a positive integer", 0),
        ('<promise topic="x" tokens="0"/><async topic="x">c</async>', "not a positive integer", 0),
        ('<promise topic="x"/><async topic="x">c <sync/></async>', "tags inside an async block", 39),
        ('<promise topic="x"/><async topic="x">c <promise topic="y"/></async>', "tags inside", 39),
        ('<promise topic="x"/><async topic="x">never closed', "not closed", 20),
        ("text </async> text", "</async> without an open async block", 5),
        ('<promise topic="a"/><promise topic="b"/><async topic="b">B</async>', "does not match", 40),
        ('<promise topic=""/>', "empty topic", 0),
        ('<promise topic="a b>"/>', "malformed promise tag", 0),
        ("<sync>", "malformed sync tag", 0),
        ('<promise topic="x"/><async topic="x">   </async>', "is empty", 20),
        ("</sync>", "unknown closing tag", 0),
    ],
)
def test_malformed_annotations_raise_langerror_with_offset(annotated, message, offset):
    with pytest.raises(LangError) as info:
        parse(annotated)
    assert message in info.value.message
    assert info.value.offset == offset


def test_topic_longer_than_100_characters_is_rejected():
    topic = "t" * 101
    with pytest.raises(LangError, match="longer than 100"):
        parse(f'<promise topic="{topic}"/><async topic="{topic}">x</async>')


def test_huge_input_parses_in_linear_time():
    body = "word < other " * 20_000 + '<promise topic="x"/><async topic="x">' + "y" * 100_000 + "</async>"
    assert len(plain_text(parse(body))) == len("word < other " * 20_000) + 100_000


def test_strip_tags_removes_complete_and_half_written_tags():
    assert strip_tags('a <promise topic="x"> b </async> c <sync/> d <async topic="q') == "a  b  c  d "


def test_strip_annotations_falls_back_to_stripping_when_parse_fails():
    assert strip_annotations(ISSUE_EXAMPLE).startswith("Two ways to sleep better: Keep a fixed")
    assert strip_annotations('a <promise topic="x"/> b') == "a  b"


# --- property tests -------------------------------------------------------------------------------------------

_TAG_LIKE = re.compile(r"</?(promise|async|sync)(?![\w-])")
_texts = (
    st.lists(st.sampled_from(list('ab <>/"=\n\té') + ["promise", "async", "sync"]), max_size=20)
    .map("".join)
    .filter(lambda t: not _TAG_LIKE.search(t))
)
_contents = _texts.filter(lambda t: t.strip())
_topics = st.text(alphabet=st.sampled_from(list("abc xyz-")), min_size=1, max_size=12).filter(
    lambda t: t.strip()
)


@st.composite
def documents(draw) -> Document:
    items = []
    group_size = 0
    for kind in draw(st.lists(st.sampled_from(["text", "promise", "sync"]), max_size=12)):
        if kind == "text":
            items.append(Text(draw(_texts)))
        elif kind == "promise":
            num_tokens = draw(st.none() | st.integers(1, 500))
            # Topics are unique within a group by construction.
            items.append(Promise(f"{draw(_topics)} {group_size}", draw(_contents), num_tokens))
            group_size += 1
        else:
            items.append(Sync())
            group_size = 0
    merged: list = []
    for item in items:
        if isinstance(item, Text) and not item.text:
            continue
        if isinstance(item, Text) and merged and isinstance(merged[-1], Text):
            merged[-1] = Text(merged[-1].text + item.text)
        else:
            merged.append(item)
    assume(not any(isinstance(item, Text) and _TAG_LIKE.search(item.text) for item in merged))
    return Document(tuple(merged))


@settings(max_examples=300, deadline=None)
@given(documents())
def test_valid_documents_round_trip_through_the_inline_form(doc):
    assert parse(serialize(doc)) == doc
    assert serialize(parse(serialize(doc))) == serialize(doc)


@settings(max_examples=300, deadline=None)
@given(documents())
def test_plain_text_of_inline_form_equals_strip_annotations(doc):
    assert strip_annotations(serialize(doc)) == plain_text(doc)


_fuzz_alphabet = st.sampled_from(
    list('ab <>/"=\n')
    + ["<promise", "<async", "</async>", "<sync/>", ' topic="', ' tokens="', '"/>', '">', "1"]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_fuzz_alphabet, max_size=40).map("".join))
def test_parser_never_raises_anything_but_langerror(text):
    try:
        doc = parse(text)
    except LangError as error:
        assert error.offset is None or 0 <= error.offset <= len(text)
    else:
        assert parse(serialize(doc)) == doc
