"""Labels and topics: the label a paragraph or item opens with, and the short topic a promise names its chunk by."""

from __future__ import annotations

import re

from pasta.lang import validate_topic
from pasta.teachers.structural.cues import point_body
from pasta.teachers.structural.lists import strip_marker
from pasta.teachers.structural.segments import word_count

# A paragraph that opens with a label: a Markdown heading, a bold phrase, or a short `Label:`.
_LABEL = re.compile(
    r"#{1,6}[ \t]+(?P<heading>[^\n]+)|\*\*(?P<bold>[^*\n]{1,80})\*\*|__(?P<under>[^_\n]{1,80})__|"
    r"(?P<colon>[A-Z0-9][^:.!?\n]{0,60}):(?:\s|$)"
)
_MAX_LABEL_WORDS = 6
# A label that only numbers its paragraph ("Q1", "Step 2", "Part 3b"): no use as a topic.
_ENUMERATOR = re.compile(
    r"\s*((q|question|part|item|option|step|section|no\.?|#)\s*)?\d+[a-z]?\s*", re.IGNORECASE
)
# Markdown emphasis, code and heading marks: not part of a topic or a heading's words.
MARKDOWN = re.compile(r"[*_`#]+")
# Function words that say little at either end of a topic ("What is the ...", "... sweep of").
_STOPWORDS = frozenset({
    "a", "an", "the", "of", "to", "for", "and", "or", "but", "in", "on", "at", "by", "with", "from", "as", "that",
    "which", "who", "is", "are", "was", "were", "be", "your", "their", "its", "this", "these", "those", "it", "can",
    "will", "what", "how", "why", "where", "when", "do", "does",
})  # fmt: skip
_TOPIC_WORD_EDGES = "\"'“”‘’()[]{}.,;:!?"


def label_of(text: str) -> str | None:
    """The label a paragraph or item opens with (`## Solids`, `**Solids**`, `Solids:`), or None."""
    match = _LABEL.match(text)
    if match is None:
        return None
    label = next(g for g in match.groups() if g is not None).strip()
    if not label or len(label.split()) > _MAX_LABEL_WORDS:
        return None
    return label


def _bare(word: str) -> str:
    return word.lower().strip(_TOPIC_WORD_EDGES)


def make_topic(chunk_text: str, topic_words: int) -> str:
    """The chunk's label (`**Solids**`, `Solids:`) or its first words, as a valid topic ("" when nothing is left)."""
    first_line = chunk_text.strip().splitlines()[0] if chunk_text.strip() else ""
    first_line = strip_marker(first_line.strip())
    label = label_of(first_line)
    if label is not None and _ENUMERATOR.fullmatch(MARKDOWN.sub("", label)):
        # "Q1: What is the capital of India?": the label only counts; the words after it say what the chunk is.
        first_line = first_line[_LABEL.match(first_line).end() :].strip()
        label = None
    if label is None and (body := point_body(first_line)) is not None:
        # "Secondly, forests provide habitat": the opener only orders the points; the words after it name this one.
        first_line = body
    if label is not None:
        words = label.split()
    else:
        words = []
        # A short item gets a short topic: the promise must cost less than the chunk it stands for. Three words
        # leave a short item's topic enough to name it; fewer only where the user asks for them.
        num_words = min(topic_words, max(3, word_count(chunk_text) // 3))
        candidates = first_line.split()
        while len(candidates) > 2 and _bare(candidates[0]) in _STOPWORDS:  # "What is the capital" -> "capital"
            candidates.pop(0)
        num_content = 0
        for word in candidates[: num_words + 1]:  # function words inside count half: "capital of India"
            words.append(word)
            num_content += _bare(word) not in _STOPWORDS
            if num_content >= num_words or (word[-1] in ",;:.!?" and len(words) >= 2):  # or the first clause ends
                break
        while len(words) > 1 and _bare(words[-1]) in _STOPWORDS:  # never end on "of the"
            words.pop()
    cleaned = [MARKDOWN.sub("", w).strip(_TOPIC_WORD_EDGES) for w in words]
    topic = " ".join(w for w in cleaned if w).replace('"', "").replace("<", "").replace(">", "")
    topic = "".join(ch for ch in topic if ord(ch) >= 32)[:100].strip()
    return topic if validate_topic(topic) is None else ""


def topic_of(label: str | None, body: str, topic_words: int) -> str:
    """The topic of a chunk whose lead (pasta.teachers.structural.leads) carries `label` and whose body is `body`.

    The lead already stands in the main thread right before the promise, so the topic only has to name the chunk:
    the label's first `topic_words` words (a leading article dropped, never ending on a function word). A label that
    only numbers its part ("Step 2", "Q1"), or none, gives the body's first words (`make_topic`).
    """
    cleaned = "" if label is None else MARKDOWN.sub("", label).strip()
    if not cleaned or _ENUMERATOR.fullmatch(cleaned):
        return make_topic(body, topic_words)
    words = [w for w in cleaned.split() if w.strip(_TOPIC_WORD_EDGES)]
    while len(words) > 1 and _bare(words[0]) in {"a", "an", "the"}:
        words.pop(0)
    words = words[:topic_words]
    while len(words) > 1 and _bare(words[-1]) in _STOPWORDS:
        words.pop()
    topic = " ".join(w.strip(_TOPIC_WORD_EDGES) for w in words).replace('"', "").replace("<", "").replace(">", "")
    topic = "".join(ch for ch in topic if ord(ch) >= 32)[:100].strip()
    return topic if validate_topic(topic) is None else make_topic(body, topic_words)
