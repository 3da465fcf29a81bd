"""The structural teacher's parts on their own: list items, point openers, the independence rules, group joining."""

from __future__ import annotations

from pasta.teachers.structural.cues import point_body
from pasta.teachers.structural.lists import find_lists, strip_marker
from pasta.teachers.structural.rules import is_joining_heading, parallel_chunks, saves_steps
from pasta.teachers.structural.segments import Block, Chunk, split_lines, split_sentences


def item_texts(response: str) -> list[list[str]]:
    return [[chunk.text(response) for chunk in block.chunks] for block, _, _ in find_lists(split_lines(response))]


def test_a_list_item_takes_its_indented_lines_and_stops_at_main_text():
    response = "Intro:\n1. First item\n   more of it\n2. Second item\n\nAfter the list."
    assert item_texts(response) == [["1. First item\n   more of it", "2. Second item"]]


def test_numbers_out_of_order_start_another_list():
    response = "1. One\n3. Three\n"
    assert item_texts(response) == [["1. One"], ["3. Three"]]


def test_unindented_lines_belong_to_an_item_when_the_list_goes_on_after_them():
    response = "1. Which river?\nA) Seine\nB) Loire\n2. Which mountain?\nA) Alps"
    assert item_texts(response) == [["1. Which river?\nA) Seine\nB) Loire", "2. Which mountain?\nA) Alps"]]


def test_list_markers_in_a_code_block_are_not_a_list():
    assert item_texts("```\n1. not an item\n2. nor this\n```") == []


def test_strip_marker_removes_only_a_leading_list_marker():
    assert (strip_marker("12. Twelve - 3. three"), strip_marker("- dash"), strip_marker("Plain")) == (
        "Twelve - 3. three", "dash", "Plain")


def test_point_body_is_the_sentence_after_its_opener_and_comma():
    assert point_body("Secondly, forests provide habitat.") == "forests provide habitat."
    assert point_body("For example, bees pollinate crops.") == "bees pollinate crops."
    assert point_body("Bees pollinate crops.") is None


def test_sentences_are_spans_of_the_response():
    response = "Intro here. First, one thing! Second, another."
    assert [s.text(response) for s in split_sentences(response, 0)] == [
        "Intro here.", "First, one thing!", "Second, another."]


def block_of(response: str, *parts: str, is_sentences: bool = False) -> Block:
    chunks = []
    for part in parts:
        start = response.index(part)
        chunks.append(Chunk(start, start + len(part)))
    return Block(chunks, is_sentences=is_sentences)


def test_a_last_part_that_sums_up_is_left_out_of_the_parallel_parts():
    parts = ("- Apples keep well in a cool dark cellar", "- Pears ripen quickly on a sunny windowsill",
             "- Overall, store each fruit where it suits")
    response = "\n".join(parts)
    chunks = parallel_chunks(block_of(response, *parts), response, min_item_words=5)
    assert [c.text(response) for c in chunks] == list(parts[:2])


def test_parts_that_continue_from_each_other_stay_sequential():
    parts = ("1. Heat the pan with a little oil", "2. Then add the onions and stir them well")
    response = "\n".join(parts)
    assert parallel_chunks(block_of(response, *parts), response, min_item_words=5) is None
    # A run of points inside a paragraph checked its openers itself.
    assert parallel_chunks(block_of(response, *parts, is_sentences=True), response, min_item_words=5) is not None


def test_parts_the_next_sentence_calls_steps_stay_sequential():
    parts = ("- Pick a quiet room with a door", "- Put the phone in another room")
    response = "\n".join(parts) + "\nThese steps help you focus."
    assert parallel_chunks(block_of(response, *parts), response, min_item_words=5) is None


def test_short_parts_and_repeated_labels_stay_sequential():
    parts = ("- Red", "- Blue")
    response = "\n".join(parts)
    assert parallel_chunks(block_of(response, *parts), response, min_item_words=5) is None
    turns = ("Friend 1: How was the trip to the coast last week?", "Friend 1: And did you see the old lighthouse?")
    response = "\n\n".join(turns)
    assert parallel_chunks(block_of(response, *turns), response, min_item_words=5) is None


def test_only_a_short_heading_line_joins_two_blocks():
    assert is_joining_heading("\n\n**Cons:**\n")
    assert is_joining_heading("  ")
    assert not is_joining_heading("Some text that says a lot more than any heading would:")
    assert not is_joining_heading("Cons below")
    assert not is_joining_heading("Cons:\nMore")


def test_a_group_saves_steps_only_when_its_parts_are_long_enough():
    long_parts = ("- " + " ".join(["word"] * 30), "- " + " ".join(["other"] * 30))
    response = "\n".join(long_parts)
    assert saves_steps(response, block_of(response, *long_parts).chunks, topic_words=4)
    short_parts = ("- one two", "- three four")
    response = "\n".join(short_parts)
    assert not saves_steps(response, block_of(response, *short_parts).chunks, topic_words=4)
