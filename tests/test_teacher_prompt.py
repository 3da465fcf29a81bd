"""The teacher prompts in conf/prompts/: every worked example is a valid annotation of its response, and the default
prompt's examples follow the structural teacher's rules-v3 convention (markers and leads in the main thread, short
topics), since an LLM teacher copies what its examples do."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from pasta.annotation import validate_annotation
from pasta.config import conf_dir
from pasta.decoding.config import DecodeConfig
from pasta.lang import Promise, parse, plain_text
from pasta.teachers.hf_config import HFTeacherConfig
from pasta.teachers.openai_teacher import OpenAITeacherConfig
from pasta.teachers.prompt import TeacherPrompt

PROMPTS = sorted((conf_dir() / "prompts").glob("teacher*.md"))
_EXAMPLE = re.compile(r"^### (Example \d+: .*)$", re.MULTILINE)
_FENCED = re.compile(r"^````text\n(.*?)\n````$", re.DOTALL | re.MULTILINE)
# What rule 3 of teacher_v2 keeps in the main thread: a list marker or number, a bold lead, a heading. (A chunk that
# opens with a line break follows a heading line; its own bullets are its text.)
_LEAD_IN_CHUNK = re.compile(r"[ \t]*(?:(?:[-*•+]|\d{1,3}[.)])[ \t]|\*\*|__|#{1,6}[ \t])")


def worked_examples(prompt: TeacherPrompt) -> list[tuple[str, str, str]]:
    """(title, response, annotated) of each `### Example` of the prompt's system part."""
    parts = _EXAMPLE.split(prompt.system)
    examples = []
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        response, annotated = _FENCED.findall(body)
        examples.append((title, response, annotated))
    return examples


def default_prompt() -> str:
    defaults = {
        next(f.default for f in fields(cls) if f.name == "prompt")
        for cls in (HFTeacherConfig, OpenAITeacherConfig)
    }
    assert len(defaults) == 1, defaults  # both LLM teachers send the same prompt
    return defaults.pop()


@pytest.mark.parametrize("path", PROMPTS, ids=lambda p: p.stem)
def test_every_worked_example_recovers_its_response_exactly(path):
    examples = worked_examples(TeacherPrompt.load(str(path)))
    assert len(examples) >= 9
    for title, response, annotated in examples:
        doc = parse(annotated)
        assert plain_text(doc) == response, title  # exactly, not after whitespace re-alignment
        assert validate_annotation(response, annotated) == doc, title


def test_the_default_prompt_teaches_markers_and_leads_in_the_main_thread_and_short_topics():
    prompt = TeacherPrompt.load(default_prompt())
    max_topic_chars = DecodeConfig().max_topic_chars
    num_promises = 0
    for title, _, annotated in worked_examples(prompt):
        for item in parse(annotated).items:
            if isinstance(item, Promise):
                num_promises += 1
                assert not _LEAD_IN_CHUNK.match(item.content), (title, item.topic)
                assert len(item.topic.split()) <= 3 and len(item.topic) < max_topic_chars, (title, item.topic)
    assert num_promises >= 20
