"""The structural annotator and teacher: find a response's candidate blocks, keep the independent ones, group them,
and write the annotation from character spans of the response."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator

from pasta.errors import PastaError
from pasta.lang import Document, LangError, Promise, Sync, Text, parse, plain_text, serialize, topic_words
from pasta.teachers.base import Teacher, TeacherReply, TeacherRequest
from pasta.teachers.structural.config import StructuralConfig
from pasta.teachers.structural.leads import Lead, group_leads
from pasta.teachers.structural.lists import find_lists
from pasta.teachers.structural.paragraphs import find_paragraph_runs
from pasta.teachers.structural.rules import (
    can_join,
    estimated_steps,
    parallel_chunks,
    parallel_sections,
    saves_steps,
)
from pasta.teachers.structural.sections import find_sections
from pasta.teachers.structural.segments import Block, Chunk, Line, split_lines, word_count
from pasta.teachers.structural.sentences import find_sentence_runs
from pasta.teachers.structural.topics import topic_of

# v2: runs of points inside a paragraph. v3: leads (markers, numbers, bold leads, headings, openers) stay in the
# main thread; sections under headings; groups join across heading lines. v4: no topic's words twice in an answer, a
# bold "Then" item keeps its list sequential, a sentence pointing back at a run's points ends the run.
RULES_VERSION = "rules-v4"
_DEFAULTS = StructuralConfig()


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
        lines = split_lines(response)
        groups: list[list[Chunk]] = []
        for block in _candidate_blocks(instruction, response, lines):
            chunks = parallel_chunks(block, response, self.cfg.min_item_words, instruction)
            if chunks is None:
                continue
            if groups and can_join(response, groups[-1], chunks):
                groups[-1].extend(chunks)
            else:
                groups.append(chunks)
        groups = [g for g in groups if self._worth_forking(response, g)]
        for block in find_sections(lines):
            sections = parallel_sections(block, response, self.cfg.min_item_words, instruction)
            if sections is not None and self._worth_forking(response, sections):
                groups = self._better_of(response, groups, sections)
        return groups

    def _worth_forking(self, response: str, group: list[Chunk]) -> bool:
        return len(group) >= self.cfg.min_items and saves_steps(response, group, self.cfg.topic_words,
                                                                 self.cfg.lead_topic_words, self.cfg.leads_in_main)

    def _better_of(self, response: str, groups: list[list[Chunk]], sections: list[Chunk]) -> list[list[Chunk]]:
        """`groups` with the run of sections in place of the groups it overlaps, when that takes fewer estimated
        steps over the span they cover (a section per chunk, or the lists and paragraphs inside them)."""
        inside = [g for g in groups if g[0].start < sections[-1].end and g[-1].end > sections[0].start]
        start = min([sections[0].start, *(g[0].start for g in inside)])
        end = max([sections[-1].end, *(g[-1].end for g in inside)])
        options = (self.cfg.topic_words, start, end, self.cfg.lead_topic_words, self.cfg.leads_in_main)
        if estimated_steps(response, [sections], *options) >= estimated_steps(response, inside, *options):
            return groups
        return sorted([g for g in groups if g not in inside] + [sections], key=lambda g: g[0].start)

    def _build(self, response: str, groups: list[list[Chunk]]) -> Document:
        items: list[Text | Promise | Sync] = []
        position = 0
        promised: set[tuple[str, ...]] = set()  # the topics' words so far: no two promises of an answer share them
        for group_index, group in enumerate(groups):
            texts = [chunk.text(response) for chunk in group]
            leads = group_leads(texts, self.cfg.leads_in_main)  # marker, number, lead, heading: the main thread's
            for chunk, lead, topic in zip(group, leads, self._topics(texts, leads, promised), strict=True):
                body_start = chunk.start + lead.length
                if body_start > position:
                    items.append(Text(response[position:body_start]))
                items.append(Promise(topic=topic, content=response[body_start : chunk.end]))
                position = chunk.end
            next_start = groups[group_index + 1][0].start if group_index + 1 < len(groups) else len(response)
            if response[position:next_start].strip():
                items.append(Sync())  # the text after a group may refer to its chunks
        if position < len(response):
            items.append(Text(response[position:]))
        return Document(tuple(items))

    def _topics(self, texts: list[str], leads: list[Lead], promised: set[tuple[str, ...]]) -> list[str]:
        """One topic per chunk of a group, named by words no other promise of the answer has (`promised`, the earlier
        groups' topics, which this adds to: the decoder's grammar allows no repeat, pasta.lang.topic_words): a lead's
        first `lead_topic_words` words, else the body's first `topic_words` words (either more where two would be
        equal); a topic still taken gets a number."""
        def topic(index: int, num_words: int) -> str:
            lead = leads[index]
            return topic_of(lead.label, texts[index][lead.length :], num_words) or f"part {index + 1}"

        num_words = [self.cfg.lead_topic_words if lead.label else self.cfg.topic_words for lead in leads]
        topics = [topic(i, n) for i, n in enumerate(num_words)]
        for _ in range(4):  # lengthen the topics that collide, a word at a time
            taken = Counter(topic_words(t) for t in topics)
            clashing = [i for i, t in enumerate(topics) if taken[topic_words(t)] > 1 or topic_words(t) in promised]
            if not clashing:
                break
            for i in clashing:
                num_words[i] += 1
                topics[i] = topic(i, num_words[i])
        for i, base in enumerate(topics):
            suffix = 2
            while topic_words(topics[i]) in promised:
                topics[i] = f"{base[:95]} ({suffix})"
                suffix += 1
            promised.add(topic_words(topics[i]))
        return topics


def _candidate_blocks(instruction: str, response: str, lines: list[Line]) -> list[Block]:
    """Lists, then paragraph runs outside them, then sentence runs outside both, in the order of the response."""
    lists = find_lists(lines)
    taken = {i for _, first, last in lists for i in range(first, last + 1)}
    runs = find_paragraph_runs(response, lines, taken)
    in_runs = {i for i, line in enumerate(lines) for b in runs for c in b.chunks if c.start <= line.start < c.end}
    sentence_runs = find_sentence_runs(instruction, response, lines, taken | in_runs)
    blocks = [block for block, _, _ in lists] + runs + sentence_runs
    blocks.sort(key=lambda b: b.chunks[0].start)
    return blocks


def _custom(value: object) -> str:
    return "custom-" + hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()[:8]


class StructuralTeacher(Teacher):
    name = "structural"

    def __init__(self, cfg: StructuralConfig):
        self.annotator = StructuralAnnotator(cfg)
        # The rules' version and every setting that differs from the defaults ("rules-v4 topic_words=1"): each record
        # says what wrote it, and an output is never extended under other settings (pasta.annotation.stage).
        # A list of patterns is named by a hash of its contents ("custom-1a2b3c4d"): two custom lists differ too.
        changed = [f"{f.name}={value if isinstance(value, int | bool) else _custom(value)}"
                   for f in dataclasses.fields(cfg)
                   if f.name != "kind" and (value := getattr(cfg, f.name)) != getattr(_DEFAULTS, f.name)]
        self.model = " ".join([RULES_VERSION, *changed])

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        for request in requests:
            yield TeacherReply(
                request.id, text=self.annotator.annotate(request.instruction, request.response)
            )
