"""One answer per prompt, when several files answer the same prompts (`data.answer_paths`, `data.pick`), and the
answer-length cap (`data.max_output_chars`).

AlpacaEval ships three GPT-4 answer sets for the same 805 prompts (the Turbo references, a verbose and a concise
one), of different lengths and layouts: `data=alpaca_eval_gpt4` keeps one answer per prompt from them. Prompts
are matched by their normalised text (pasta.data.heldout.prompt_key), in the order the files first give
them; answers over `max_output_chars` are not candidates, and a prompt left without one is dropped and counted.

- `first`: the first file's answer that is short enough (`path`, then `answer_paths` in order);
- `shortest`: the shortest answer;
- `shortest_with_list`: the shortest answer laid out as a list or in sections (two list items or two Markdown
  headings: where an answer's independent parts are), else the shortest answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pasta.choice import Choice
from pasta.data.heldout import prompt_key

_LIST_ITEM = re.compile(r"^[ \t]*(\d{1,3}[.)]|[-*•+])[ \t]+\S", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}[ \t]+\S", re.MULTILINE)


class Pick(Choice):
    """Which of a prompt's answers is kept."""

    first = "first"
    shortest = "shortest"
    shortest_with_list = "shortest_with_list"


def has_list(text: str) -> bool:
    """Whether the text is laid out as a list or in sections: two list items, or two Markdown headings."""
    return len(_LIST_ITEM.findall(text)) >= 2 or len(_HEADING.findall(text)) >= 2


@dataclass(frozen=True)
class Answer:
    """One file's record for a prompt: the record, and which file (0 = `path`, i = `answer_paths[i - 1]`)."""

    record: dict[str, Any]
    source: int


def pick_answers(files: Sequence[Sequence[dict[str, Any]]], pick: Pick, max_output_chars: int | None
                 ) -> tuple[list[Answer], int]:
    """(one answer per prompt, in the order the files first give the prompts; how many prompts had none short
    enough). `files` are checked records (`instruction`, `output`, optional `input`)."""
    candidates: dict[str, list[Answer]] = {}
    for source, records in enumerate(files):
        for record in records:
            key = prompt_key(record["instruction"], record.get("input") or "")
            candidates.setdefault(key, []).append(Answer(record, source))
    chosen: list[Answer] = []
    num_too_long = 0
    for answers in candidates.values():
        fitting = [a for a in answers if max_output_chars is None or len(a.record["output"]) <= max_output_chars]
        if not fitting:
            num_too_long += 1
            continue
        chosen.append(_pick(fitting, pick))
    return chosen, num_too_long


def _pick(answers: list[Answer], pick: Pick) -> Answer:
    if pick == Pick.first:
        return answers[0]
    if pick == Pick.shortest_with_list:
        answers = [a for a in answers if has_list(a.record["output"])] or answers
    return min(answers, key=lambda a: len(a.record["output"]))  # min keeps the first of equal lengths
