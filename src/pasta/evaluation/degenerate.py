"""Degenerate answers of a run: loops, budget cuts and promise lists whose topics loop, counted per run.

A small student's failures are not rare events: an answer that repeats "a dress or a dress or ..." until the
budget runs out, or plans twenty promises whose topics repeat themselves, costs a user the whole budget in time and
says nothing. The quality proxies average them away and the speed numbers can even reward them (a loop that forks
is fast), so every evaluation counts them, for both decoders, and the study table shows them beside the speedups.

Read from a run's stats.jsonl lines (`output`, `annotated`, `finish_reason`):

- budget cut: the decoder stopped the answer at its budget (`max_new_tokens`, or `max_total_tokens` for all
  threads together), not at eos or a stop string;
- loop: a budget cut whose text (the plain answer, or any chunk of it) ends in the same word n-gram repeated
  (`LOOP_MIN_REPEATS` times or more, covering `LOOP_MIN_WORDS` words or more): it was still repeating when the
  budget stopped it;
- topic loop: a promise list whose topics loop: a topic that repeats a word pair inside itself ("a timeline and a
  budget and a timeline and ...") or two topics of one answer that are the same words.

    from pasta.evaluation.degenerate import count_degenerate
    counts = count_degenerate(read_stats(run_dir))   # DegenerateCounts
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pasta.decoding.result import BUDGET_CUTS
from pasta.lang import LangError, parse, topic_words

LOOP_MAX_NGRAM = 16  # words in the longest repeated unit looked for
LOOP_MIN_REPEATS = 3
LOOP_MIN_WORDS = 12  # "no, no, no" is emphasis; twelve words of one repeated unit are a loop
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class DegenerateCounts:
    """A run's degenerate answers (each answer counted at most once per kind)."""

    num_answers: int
    num_budget_cuts: int
    num_loops: int
    num_topic_loops: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ends_in_loop(text: str) -> bool:
    """The text ends in one word n-gram repeated back to back (the last, possibly cut, word left out)."""
    tokens = words(text)
    for tail in (tokens, tokens[:-1]):  # a budget cut may stop inside a word
        for n in range(1, LOOP_MAX_NGRAM + 1):
            unit = tail[-n:]
            if len(unit) < n:
                break
            repeats, end = 0, len(tail)
            while end >= n and tail[end - n : end] == unit:
                repeats, end = repeats + 1, end - n
            if repeats >= LOOP_MIN_REPEATS and repeats * n >= LOOP_MIN_WORDS:
                return True
    return False


def topics_loop(topics: Sequence[str]) -> bool:
    """A topic repeats a word pair inside itself, or two topics are the same words."""
    seen: set[tuple[str, ...]] = set()
    for topic in topics:
        named = topic_words(topic)
        pairs = list(zip(named, named[1:], strict=False))
        if len(pairs) != len(set(pairs)) or (named and named in seen):
            return True
        seen.add(named)
    return False


def _threads(annotated: str | None) -> tuple[list[str], list[str]]:
    """(chunk texts, promise topics) of an annotated answer; none when it is absent or does not parse."""
    if not annotated:
        return [], []
    try:
        doc = parse(annotated)
    except LangError:
        return [], []
    return [p.content for p in doc.promises], [p.topic for p in doc.promises]


def answer_flags(record: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(budget cut, loop, topic loop) of one stats line."""
    cut = record.get("finish_reason") in BUDGET_CUTS
    chunks, topics = _threads(record.get("annotated"))
    loop = cut and any(ends_in_loop(text) for text in [record.get("output") or "", *chunks])
    return cut, loop, topics_loop(topics)


def count_degenerate(records: Iterable[dict[str, Any]]) -> DegenerateCounts:
    num = cuts = loops = topic_loops = 0
    for record in records:
        cut, loop, topic_loop = answer_flags(record)
        num, cuts, loops, topic_loops = num + 1, cuts + cut, loops + loop, topic_loops + topic_loop
    return DegenerateCounts(num, cuts, loops, topic_loops)
