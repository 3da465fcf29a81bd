"""The structural annotator and teacher: find a response's candidate blocks, keep the independent ones, group them,
and write the annotation from character spans of the response."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from pasta.errors import PastaError
from pasta.lang import Document, LangError, Promise, Sync, Text, parse, plain_text, serialize
from pasta.teachers.base import Teacher, TeacherReply, TeacherRequest
from pasta.teachers.structural.config import StructuralConfig
from pasta.teachers.structural.lists import find_lists
from pasta.teachers.structural.paragraphs import find_paragraph_runs
from pasta.teachers.structural.rules import is_joining_heading, parallel_chunks, saves_steps
from pasta.teachers.structural.segments import Block, Chunk, split_lines, word_count
from pasta.teachers.structural.sentences import find_sentence_runs
from pasta.teachers.structural.topics import make_topic

RULES_VERSION = "rules-v2"  # v2: runs of points inside a paragraph


class StructuralAnnotator:
    """Finds a response's parallel parts and writes them as PASTA-LANG (see pasta.teachers.structural)."""

    def __init__(self, cfg: StructuralConfig):
        self.cfg = cfg
        try:
            self._sequential = [re.compile(p, re.IGNORECASE) for p in cfg.sequential_patterns]
        except re.error as exc:
            raise PastaError(f"teacher.sequential_patterns: invalid regex {exc.pattern!r} ({exc})") from None

    def annotate(self, instruction: str, response: str) -> str:
        """The annotated response (inline PASTA-LANG without `tokens=`), or the response unchanged."""
        return serialize(self.document(instruction, response))

    def document(self, instruction: str, response: str) -> Document:
        unchanged = Document((Text(response),) if response else ())
        if word_count(response) < self.cfg.min_words:
            return unchanged
        if any(pattern.search(instruction) for pattern in self._sequential):
            return unchanged
        try:
            if parse(response).is_annotated:
                return unchanged  # the response already holds tags: not ours to rewrite
        except LangError:
            return unchanged
        groups = self._groups(instruction, response)
        if not groups:
            return unchanged
        doc = self._build(response, groups)
        if plain_text(doc) != response:  # a bug here would corrupt training data: refuse rather than write it
            raise AssertionError("structural teacher changed the response")
        return doc

    def _groups(self, instruction: str, response: str) -> list[list[Chunk]]:
        groups: list[list[Chunk]] = []
        for block in _candidate_blocks(instruction, response):
            chunks = parallel_chunks(block, response, self.cfg.min_item_words)
            if chunks is None:
                continue
            if groups and is_joining_heading(response[groups[-1][-1].end : chunks[0].start]):
                groups[-1].extend(chunks)
            else:
                groups.append(chunks)
        return [
            g for g in groups if len(g) >= self.cfg.min_items and saves_steps(response, g, self.cfg.topic_words)
        ]

    def _build(self, response: str, groups: list[list[Chunk]]) -> Document:
        items: list[Text | Promise | Sync] = []
        position = 0
        for group_index, group in enumerate(groups):
            topics: set[str] = set()
            for chunk in group:
                if chunk.start > position:
                    items.append(Text(response[position : chunk.start]))
                topic = make_topic(chunk.text(response), self.cfg.topic_words) or f"part {len(topics) + 1}"
                base, suffix = topic, 2
                while topic in topics:
                    topic = f"{base[:95]} ({suffix})"
                    suffix += 1
                topics.add(topic)
                items.append(Promise(topic=topic, content=chunk.text(response)))
                position = chunk.end
            next_start = groups[group_index + 1][0].start if group_index + 1 < len(groups) else len(response)
            if response[position:next_start].strip():
                items.append(Sync())  # the text after a group may refer to its chunks
        if position < len(response):
            items.append(Text(response[position:]))
        return Document(tuple(items))


def _candidate_blocks(instruction: str, response: str) -> list[Block]:
    """Lists, then paragraph runs outside them, then sentence runs outside both, in the order of the response."""
    lines = split_lines(response)
    lists = find_lists(lines)
    taken = {i for _, first, last in lists for i in range(first, last + 1)}
    runs = find_paragraph_runs(response, lines, taken)
    in_runs = {i for i, line in enumerate(lines) for b in runs for c in b.chunks if c.start <= line.start < c.end}
    sentence_runs = find_sentence_runs(instruction, response, lines, taken | in_runs)
    blocks = [block for block, _, _ in lists] + runs + sentence_runs
    blocks.sort(key=lambda b: b.chunks[0].start)
    return blocks


class StructuralTeacher(Teacher):
    name = "structural"
    model = RULES_VERSION

    def __init__(self, cfg: StructuralConfig):
        self.annotator = StructuralAnnotator(cfg)

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        for request in requests:
            yield TeacherReply(
                request.id, text=self.annotator.annotate(request.instruction, request.response)
            )
