"""Settings of the structural teacher (conf/teacher/structural.yaml), with the instructions it leaves sequential."""

from __future__ import annotations

from dataclasses import dataclass, field

from pasta.errors import PastaError

# An instruction matching one of these asks for an answer whose parts depend on each other.
_DEFAULT_SEQUENTIAL_PATTERNS = [
    r"\bsteps?\b", r"\bstep-by-step\b", r"\bprocedure\b", r"\bprocess (of|for|to)\b", r"\brecipe\b",
    r"\binstructions\b", r"\bdirections\b", r"\balgorithm\b", r"\btimeline\b", r"\bchronolog",
    r"\bin order\b(?! to\b)", r"\bsequence\b",  # "in order to" states a purpose, not an order
    r"\b(calculate|compute|solve|derive|prove|simplify)\b",
    r"\bevaluate\b[^.?!]*[\d=+*/^]",  # evaluate an expression, not "evaluate the candidates"
    r"(?s)^(?=.*\d).*\bhow (much|many|long|far|old|fast)\b",  # a word problem: "... two $50 combos. How much ..."
    # "Write a short story", "compose a Python function": the thing asked for is at most three words after the verb
    # ("story ideas", "song titles" are lists of separate things).
    r"\b(write|compose|create|generate|tell|draft)(\W+\w+){0,3}?\W+(story|poem|song|rap|lyrics|haiku|dialogue|"
    r"conversation|script|letter|email|speech|essay|code|program|function|query|tweet|paragraph)\b"
    r"(?!\W+(ideas?|titles?|names?|prompts?|topics?)\b)",
]  # fmt: skip


@dataclass(frozen=True)
class StructuralConfig:
    """Settings of the rule-based teacher (conf/teacher/structural.yaml), in the style of Skeleton-of-Thought / APAR
    heuristics: list items, sections under headings, labelled or announced paragraphs, pros/cons sections and runs
    of points inside a paragraph ("First, ... Second, ...", "Additionally, ...") become chunks, their markers, leads
    and headings written by the main thread; steps, code, stories and short answers stay sequential. Needs no model
    and never changes a character."""

    kind: str = field(default="structural", metadata={"help": "teacher type: structural | hf | openai"})
    min_words: int = field(default=40, metadata={"help": "responses with fewer words get no tags"})
    min_items: int = field(default=2, metadata={"help": "fewest chunks in a group"})
    min_item_words: int = field(
        default=5,
        metadata={"help": "a list or paragraph run whose items are shorter on average stays sequential"},
    )
    topic_words: int = field(
        default=3,
        metadata={"help": "an unlabelled part's topic is its first N content words (function words inside count "
                          "half), at most 3 for a part under 12 words; more where two topics would be equal"},
    )
    leads_in_main: bool = field(
        default=True,
        metadata={"help": "a part's bold lead, label or heading is written by the main thread and the chunk writes "
                          "only the body; false: only markers, numbers and openers stay there, and the chunk writes "
                          "its lead (fewer main-thread steps, a lead the chunk must guess from its topic)"},
    )
    lead_topic_words: int = field(
        default=1,
        metadata={"help": "a part whose lead (bold lead, label, heading) stays in the main thread gets the lead's "
                          "first N words as its topic, more only to tell two apart"},
    )
    sequential_patterns: list[str] = field(
        default_factory=lambda: list(_DEFAULT_SEQUENTIAL_PATTERNS),
        metadata={
            "help": "regexes (case-insensitive): an instruction matching one gets no tags (steps, code, ...)"
        },
    )

    def __post_init__(self) -> None:
        for name in ("topic_words", "lead_topic_words"):
            if getattr(self, name) < 1:
                raise PastaError(f"teacher.{name}: must be >= 1 (a topic names its chunk), got {getattr(self, name)}")
        if self.min_items < 2:
            raise PastaError(f"teacher.min_items: must be >= 2 (one chunk alone runs in parallel with nothing), "
                             f"got {self.min_items}")
