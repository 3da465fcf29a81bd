"""The `structural` teacher: rule-based PASTA-LANG annotation that needs no model.

It is the offline fallback and the heuristic baseline, in the spirit of Skeleton-of-Thought and APAR: the parallel
parts of an answer are found from its layout, not its meaning.

- **Lists**: numbered (`1.`, `2)`) or bulleted (`-`, `*`, `•`, `+`) items at one indentation, with their indented
  continuation lines and sub-bullets, each item one chunk. Blank lines between items stay in the main text.
- **Labelled paragraphs**: consecutive paragraphs that each open with a label (`**Solids**`, `Solids:`, `## Solids`).
- **Announced paragraphs**: paragraphs that follow an intro naming their number ("three states" and three
  paragraphs after it).
- **Pros and cons**: two lists separated only by a short heading (`Cons:`) form one group.
- **Runs of points inside a paragraph**: after an intro sentence, sentences that open with ordinals in order
  ("First, ... Second, ..."), with additive openers ("Additionally", "Furthermore", "Another ...") or as examples
  ("For example, ... Another example ..."), each point running to the next opener; "Finally" opens the last, and a
  sentence that sums up ("Overall", "These ...") ends the run. A point that opens by pointing back ("Second, this
  ..."), a sentence that reads as a next step ("Then", "Once ..."), or imperative points when the instruction did
  not ask for tips or ways ("First, preheat the oven") leave the paragraph sequential.

And what it leaves sequential, as the teacher prompt asks: short answers (`min_words`), instructions that ask for
steps, derivations, code or stories (`sequential_patterns`), lists whose items point back at earlier ones ("Then",
"the result"), parts that the sentence before or after them calls steps ("These steps ..."), items too short on
average to be worth a promise (`min_item_words`), parts whose labels repeat (the turns of a dialogue), groups whose estimated critical path is not shorter than writing them in order, and a
last item or paragraph that sums up the others ("Overall, ..."), which goes after `<sync/>`. Any main text after a group follows a `<sync/>`, since it may refer to the chunks.

The annotation is built from character spans of the response, so its plain text is the response exactly: this
teacher never changes a character. Topics are the item's label, or its first `topic_words` words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pasta.errors import PastaError
from pasta.lang import Document, LangError, Promise, Sync, Text, parse, plain_text, serialize, validate_topic
from pasta.teachers.base import Teacher, TeacherReply, TeacherRequest

RULES_VERSION = "rules-v2"  # v2: runs of points inside a paragraph

# An instruction matching one of these asks for an answer whose parts depend on each other.
_DEFAULT_SEQUENTIAL_PATTERNS = [
    r"\bsteps?\b", r"\bstep-by-step\b", r"\bprocedure\b", r"\bprocess (of|for|to)\b", r"\brecipe\b",
    r"\binstructions\b", r"\bdirections\b", r"\balgorithm\b", r"\btimeline\b", r"\bchronolog",
    r"\bin order\b(?! to\b)", r"\bsequence\b",  # "in order to" states a purpose, not an order
    r"\b(calculate|compute|solve|derive|prove|simplify)\b",
    r"\bevaluate\b[^.?!]*[\d=+*/^]",  # evaluate an expression, not "evaluate the candidates"
    # "Write a short story", "compose a Python function": the thing asked for is at most three words after the verb
    # ("story ideas", "song titles" are lists of separate things).
    r"\b(write|compose|create|generate|tell|draft)(\W+\w+){0,3}?\W+(story|poem|song|rap|lyrics|haiku|dialogue|"
    r"conversation|script|letter|email|speech|essay|code|program|function|query|tweet|paragraph)\b"
    r"(?!\W+(ideas?|titles?|names?|prompts?|topics?)\b)",
]  # fmt: skip


@dataclass(frozen=True)
class StructuralConfig:
    """Settings of the rule-based teacher (conf/teacher/structural.yaml)."""

    kind: str = field(default="structural", metadata={"help": "teacher type: structural | hf | openai"})
    min_words: int = field(default=40, metadata={"help": "responses with fewer words get no tags"})
    min_items: int = field(default=2, metadata={"help": "fewest chunks in a group"})
    min_item_words: int = field(
        default=5,
        metadata={"help": "a list or paragraph run whose items are shorter on average stays sequential"},
    )
    topic_words: int = field(
        default=4,
        metadata={"help": "a topic is the item's label, or its first N words (fewer for short items)"},
    )
    sequential_patterns: list[str] = field(
        default_factory=lambda: list(_DEFAULT_SEQUENTIAL_PATTERNS),
        metadata={
            "help": "regexes (case-insensitive): an instruction matching one gets no tags (steps, code, ...)"
        },
    )


# A list item's first line: indentation, marker, at least one space, text.
_ITEM = re.compile(r"(?P<indent>[ \t]*)(?P<marker>(?P<number>\d{1,3})[.)]|[-*•+])[ \t]+\S")
_FENCE = re.compile(r"[ \t]*(```|~~~)")
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
# An item that continues from the previous one rather than standing on its own.
_DEPENDENT_START = re.compile(
    r"(then|next|after|afterwards?|finally|lastly|once|now|repeat|continue|meanwhile|subsequently|"
    r"following this|using (the|this) result)\b",
    re.IGNORECASE,
)
_BACK_REFERENCE = re.compile(
    r"\b(previous step|steps? \d+|the above|the result|this result|the mixture|this mixture)\b", re.IGNORECASE
)
# An item or paragraph that sums up the ones before it.
_CONCLUSION_START = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|together|taken together|all in all|in short|"
    r"ultimately|all of these|these)\b",
    re.IGNORECASE,
)
_COUNT_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    **{str(n): n for n in range(2, 11)},
}  # fmt: skip
_MARKDOWN = re.compile(r"[*_`#]+")
# Function words that say little at either end of a topic ("What is the ...", "... sweep of").
_STOPWORDS = frozenset({
    "a", "an", "the", "of", "to", "for", "and", "or", "but", "in", "on", "at", "by", "with", "from", "as", "that",
    "which", "who", "is", "are", "was", "were", "be", "your", "their", "its", "this", "these", "those", "it", "can",
    "will", "what", "how", "why", "where", "when", "do", "does",
})  # fmt: skip
_MARKER_PREFIX = re.compile(r"^([-*•+]|\d{1,3}[.)])\s+")
_TOPIC_WORD_EDGES = "\"'“”‘’()[]{}.,;:!?"
# <|promise|> <|promise_tokens|> N <|promise_end|>: what a promise costs the main thread beyond its topic.
_PROMISE_TAG_TOKENS = 4


@dataclass
class _Line:
    start: int  # offset of the line's first character in the response
    text: str  # without its newline
    in_code: bool  # inside a fenced code block, fences included

    @property
    def blank(self) -> bool:
        return not self.text.strip()

    @property
    def indent(self) -> int:
        return len(self.text) - len(self.text.lstrip(" \t"))


@dataclass(frozen=True)
class _Chunk:
    start: int  # character span of the chunk in the response
    end: int

    def text(self, response: str) -> str:
        return response[self.start : self.end]


@dataclass
class _Block:
    """A run of parallel candidates: one list, or one run of paragraphs."""

    chunks: list[_Chunk]
    is_list: bool
    is_sentences: bool = False  # points made by sentences inside one paragraph (`_find_sentence_runs`)


def _split_lines(response: str) -> list[_Line]:
    lines: list[_Line] = []
    in_code = False
    for match in re.finditer(r"[^\n]*\n?", response):
        if not match.group():
            continue
        text = match.group().rstrip("\n")
        fence = bool(_FENCE.match(text))
        lines.append(_Line(match.start(), text, in_code or fence))
        if fence:
            in_code = not in_code
    return lines


def _content_end(line: _Line) -> int:
    return line.start + len(line.text.rstrip())


def _item_marker(line: _Line) -> re.Match[str] | None:
    return None if line.in_code else _ITEM.match(line.text)


def _same_list(first: re.Match[str], other: re.Match[str], expected_number: int | None) -> bool:
    if len(first.group("indent")) != len(other.group("indent")):
        return False
    if first.group("number") is None:
        return other.group("marker") == first.group("marker")
    number = other.group("number")
    return (
        number is not None
        and int(number) == expected_number
        and other.group("marker")[-1] == first.group("marker")[-1]
    )


def _next_nonblank(lines: list[_Line], index: int) -> int | None:
    while index < len(lines) and lines[index].blank:
        index += 1
    return index if index < len(lines) else None


def _find_lists(lines: list[_Line]) -> list[tuple[_Block, int, int]]:
    """Lists as (block, first line, last line).

    An item runs over the lines indented deeper than its marker (sub-bullets, continued paragraphs), and over
    unindented lines right after its text ("1. Which river?" then "A) Seine") when the list goes on after them, or
    when every earlier item had such lines too. Other text at the marker's indentation ends the list.
    """
    found: list[tuple[_Block, int, int]] = []
    index = 0
    while index < len(lines):
        first = _item_marker(lines[index])
        if first is None:
            index += 1
            continue
        indent = len(first.group("indent"))
        number = None if first.group("number") is None else int(first.group("number"))
        chunks: list[_Chunk] = []
        had_lazy_lines: list[bool] = []
        start_line = index
        current = index
        while True:
            expected_next = None if number is None else number + len(chunks) + 1
            last = current
            lazy = False
            probe = current + 1
            while probe < len(lines):
                line = lines[probe]
                if line.blank:
                    following = _next_nonblank(lines, probe)
                    if following is None or lines[following].indent <= indent:
                        break
                    probe = following
                    continue
                if line.indent > indent:
                    last = probe
                    probe += 1
                    continue
                if _item_marker(line) is not None:  # the next item, or another list
                    break
                lazy_end = probe
                while (
                    lazy_end + 1 < len(lines)
                    and not lines[lazy_end + 1].blank
                    and _item_marker(lines[lazy_end + 1]) is None
                ):
                    lazy_end += 1
                following = _next_nonblank(lines, lazy_end + 1)
                marker = None if following is None else _item_marker(lines[following])
                goes_on = marker is not None and _same_list(first, marker, expected_next)
                if not goes_on and not (had_lazy_lines and all(had_lazy_lines)):
                    break  # main text after the list
                last, lazy, probe = lazy_end, True, lazy_end + 1
            item_start = lines[current].start + indent
            chunks.append(_Chunk(item_start, _content_end(lines[last])))
            had_lazy_lines.append(lazy)
            following = _next_nonblank(lines, last + 1)
            marker = None if following is None else _item_marker(lines[following])
            if marker is None or not _same_list(first, marker, expected_next):
                break
            current = following
        found.append((_Block(chunks, is_list=True), start_line, last))
        index = last + 1
    return found


def _paragraphs(lines: list[_Line], taken: set[int]) -> list[tuple[int, int, bool]]:
    """(first line, last line, eligible) of each blank-line-separated paragraph; eligible = no list or code."""
    paragraphs = []
    index = 0
    while index < len(lines):
        if lines[index].blank:
            index += 1
            continue
        end = index
        while end + 1 < len(lines) and not lines[end + 1].blank:
            end += 1
        span = range(index, end + 1)
        eligible = not any(i in taken or lines[i].in_code for i in span)
        paragraphs.append((index, end, eligible))
        index = end + 1
    return paragraphs


def _paragraph_chunk(lines: list[_Line], first: int, last: int) -> _Chunk:
    return _Chunk(lines[first].start + lines[first].indent, _content_end(lines[last]))


def _announced_count(text: str) -> set[int]:
    return {_COUNT_WORDS[w] for w in re.findall(r"[A-Za-z]+|\d+", text.lower()) if w in _COUNT_WORDS}


def _find_paragraph_runs(response: str, lines: list[_Line], taken: set[int]) -> list[_Block]:
    blocks: list[_Block] = []
    paragraphs = _paragraphs(lines, taken)
    index = 0
    while index < len(paragraphs):
        run_end = index
        while run_end < len(paragraphs) and paragraphs[run_end][2]:
            run_end += 1
        run = paragraphs[index:run_end]
        chunks = [_paragraph_chunk(lines, first, last) for first, last, _ in run]
        labelled = [label_of(c.text(response)) is not None for c in chunks]
        position = 0
        while position < len(run):
            # Labelled paragraphs in a row.
            end = position
            while end < len(run) and labelled[end]:
                end += 1
            if end - position >= 2:
                blocks.append(_Block(chunks[position:end], is_list=False))
                position = end
                continue
            # An intro that announces how many paragraphs follow.
            following = chunks[position + 1 :]
            counts = _announced_count(chunks[position].text(response))
            if len(following) in counts:
                blocks.append(_Block(following, is_list=False))
                break
            if len(following) - 1 in counts and _CONCLUSION_START.match(following[-1].text(response)):
                blocks.append(_Block(following[:-1], is_list=False))
                break
            position += 1
        index = run_end + 1
    return blocks


# A sentence starts after . ! or ? (and a closing quote or bracket) and a space, with a capital, digit or quote.
_SENTENCE_START = re.compile(r"(?<=[.!?])[\"'”’)\]]*[ \t]+(?=[\"“(]?[A-Z0-9])")
# Sentence openers that mark the points of a run of sentences. Ordinals number them; additive openers add one.
_ORDINAL = re.compile(
    r"(?:the[ \t]+)?(?P<ordinal>first|second|third|fourth|fifth|sixth)(?:ly)?\b", re.IGNORECASE
)
_ORDINAL_NUMBERS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6}
_ADDITIVE = re.compile(
    r"(additionally|furthermore|moreover|in addition|also|besides|another|on top of (that|this))\b", re.IGNORECASE
)
_EXAMPLE_FIRST = re.compile(r"(for example|for instance|one example|an example)\b", re.IGNORECASE)
_EXAMPLE_NEXT = re.compile(r"(another|a second|a further|a third) example\b", re.IGNORECASE)
_LAST_POINT = re.compile(r"(finally|lastly|last but not least)\b", re.IGNORECASE)
# A sentence that sums up or draws on the points before it: the run of points ends there.
_SUMMING_UP = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|in short|all in all|ultimately|together|"
    r"taken together|therefore|thus|hence|as a result|consequently|all of these|these|by (doing|following|using)|"
    r"with (these|all)|this way)\b",
    re.IGNORECASE,
)
# A point that opens by pointing at an earlier one ("Second, this means ...") depends on it.
_POINTS_BACK = re.compile(r"(this|these|those|such|both|the same|the former|the latter)\b", re.IGNORECASE)
_MARKER_END = re.compile(r"[ \t]*,?[ \t]*")
# An instruction that asks for separate pieces of advice: imperative points are then tips, not steps.
_ASKS_FOR_TIPS = re.compile(
    r"\b(tips?|ways?|ideas?|suggestions?|techniques?|strategies|methods?|practices|advice|recommendations?)\b",
    re.IGNORECASE,
)
# An imperative point ("First, preheat the oven"): a step of a procedure unless tips were asked for.
_IMPERATIVE = re.compile(
    r"(make|use|add|take|get|go|start|begin|put|place|mix|combine|preheat|cut|open|turn|set|create|choose|select|"
    r"gather|find|identify|determine|write|read|check|remove|install|click|pour|heat|boil|bake|stir|prepare|plan|"
    r"decide|research|consider|ensure|keep|try|list|define|collect|build|connect|apply|follow|wash|fill|cook|let|"
    r"you (will )?(need|should|must|have to|can)|we (will )?(need|should|must|have to))\b",
    re.IGNORECASE,
)


def _sentences(text: str, start: int) -> list[_Chunk]:
    """The sentences of a paragraph `text` that starts at offset `start` of the response."""
    spans = []
    position = 0
    for match in _SENTENCE_START.finditer(text):
        spans.append(_Chunk(start + position, start + match.start()))
        position = match.end()
    spans.append(_Chunk(start + position, start + len(text.rstrip())))
    return spans


def _point_marker(sentence: str) -> re.Match[str] | None:
    for pattern in (_ORDINAL, _EXAMPLE_NEXT, _EXAMPLE_FIRST, _ADDITIVE, _LAST_POINT):
        if match := pattern.match(sentence):
            return match
    return None


def _point_starts(sentences: list[str]) -> list[int]:
    """Indices of the sentences that open the points of a run: numbered (First, Second, ... in order), examples
    (For example ... Another example) or added (Additionally, Another ...); `Finally` opens the last one."""
    numbered: list[int] = []
    for index, sentence in enumerate(sentences):
        match = _ORDINAL.match(sentence)
        if match and _ORDINAL_NUMBERS[match.group("ordinal").lower()] == len(numbered) + 1:
            numbered.append(index)
    if len(numbered) < 2:
        first = next((i for i, t in enumerate(sentences) if _EXAMPLE_FIRST.match(t)), None)
        following = [i for i, t in enumerate(sentences) if _EXAMPLE_NEXT.match(t) and first is not None and i > first]
        numbered = [first, *following] if following else [i for i, t in enumerate(sentences) if _ADDITIVE.match(t)]
    if not numbered:
        return []
    last = next((i for i, t in enumerate(sentences) if i > numbered[-1] and _LAST_POINT.match(t)), None)
    return numbered + ([last] if last is not None else [])


def _find_sentence_runs(instruction: str, response: str, lines: list[_Line], taken: set[int]) -> list[_Block]:
    """Points made by runs of sentences inside a paragraph ("First, ... Second, ...", "Additionally, ...").

    The points follow an intro sentence, which stays in the main text, and end where a sentence sums them up. A run
    is left sequential when a point opens by pointing back ("Second, this ..."), when a sentence reads as a next
    step ("Then", "Once ..."), or when its points are imperative and the instruction did not ask for tips or ways.
    """
    blocks: list[_Block] = []
    for first, last, eligible in _paragraphs(lines, taken):
        if not eligible:
            continue
        paragraph = _paragraph_chunk(lines, first, last)
        sentences = _sentences(paragraph.text(response), paragraph.start)
        texts = [sentence.text(response) for sentence in sentences]
        starts = _point_starts(texts)
        if len(starts) < 2 or starts[0] == 0:
            continue
        end = next((i for i in range(starts[-1] + 1, len(texts)) if _SUMMING_UP.match(texts[i])), len(texts))
        bounds = list(zip(starts, [*starts[1:], end], strict=True))
        bodies = [texts[start][_MARKER_END.match(texts[start], _point_marker(texts[start]).end()).end() :]
                  for start in starts]  # fmt: skip
        if any(_POINTS_BACK.match(body) for body in bodies[1:]):
            continue
        if any(_DEPENDENT_START.match(texts[i]) and not _LAST_POINT.match(texts[i]) for a, b in bounds
               for i in range(a, b)):  # fmt: skip
            continue
        chunks = [_Chunk(sentences[a].start, sentences[b - 1].end) for a, b in bounds]
        if any(_BACK_REFERENCE.search(chunk.text(response)) for chunk in chunks):
            continue
        if not _ASKS_FOR_TIPS.search(instruction) and any(_IMPERATIVE.match(body) for body in bodies):
            continue
        blocks.append(_Block(chunks, is_list=False, is_sentences=True))
    return blocks


def _word_count(text: str) -> int:
    return len(text.split())


def _estimated_tokens(text: str) -> float:
    """A tokenizer-free length estimate (about 1.3 tokens a word; a line break is a token)."""
    return max(_word_count(text) * 1.3, 1.0 if text else 0.0)


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
    first_line = _MARKER_PREFIX.sub("", first_line.strip())
    label = label_of(first_line)
    if label is not None and _ENUMERATOR.fullmatch(_MARKDOWN.sub("", label)):
        # "Q1: What is the capital of India?": the label only counts; the words after it say what the chunk is.
        first_line = first_line[_LABEL.match(first_line).end() :].strip()
        label = None
    if label is None and (marker := _point_marker(first_line)):
        # "Secondly, forests provide habitat": the opener only orders the points; the words after it name this one.
        first_line = first_line[_MARKER_END.match(first_line, marker.end()).end() :]
    if label is not None:
        words = label.split()
    else:
        words = []
        # A short item gets a short topic: the promise must cost less than the chunk it stands for.
        num_words = max(3, min(topic_words, _word_count(chunk_text) // 3))
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
    cleaned = [_MARKDOWN.sub("", w).strip(_TOPIC_WORD_EDGES) for w in words]
    topic = " ".join(w for w in cleaned if w).replace('"', "").replace("<", "").replace(">", "")
    topic = "".join(ch for ch in topic if ord(ch) >= 32)[:100].strip()
    return topic if validate_topic(topic) is None else ""


class StructuralAnnotator:
    """Finds a response's parallel parts and writes them as PASTA-LANG (see the module docstring)."""

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
        if _word_count(response) < self.cfg.min_words:
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

    def _blocks(self, instruction: str, response: str) -> list[_Block]:
        lines = _split_lines(response)
        lists = _find_lists(lines)
        taken = {i for _, first, last in lists for i in range(first, last + 1)}
        runs = _find_paragraph_runs(response, lines, taken)
        in_runs = {i for i, line in enumerate(lines) for b in runs for c in b.chunks if c.start <= line.start < c.end}
        sentence_runs = _find_sentence_runs(instruction, response, lines, taken | in_runs)
        blocks = [block for block, _, _ in lists] + runs + sentence_runs
        blocks.sort(key=lambda b: b.chunks[0].start)
        kept = []
        for block in blocks:
            chunks = list(block.chunks)
            if len(chunks) >= 2 and _CONCLUSION_START.match(
                _MARKER_PREFIX.sub("", chunks[-1].text(response))
            ):
                chunks.pop()  # a last item that sums up the others stays in the main text, after <sync/>
            texts = [c.text(response) for c in chunks]
            if not texts or sum(map(_word_count, texts)) < self.cfg.min_item_words * len(texts):
                continue
            items = [_MARKER_PREFIX.sub("", t) for t in texts]
            if not block.is_sentences and any(
                _DEPENDENT_START.match(t) or _BACK_REFERENCE.search(t) for t in items[1:]
            ):
                continue  # (sentence runs checked themselves, and may end with a "Finally" point)
            if _calls_them_steps(response, chunks):
                continue
            labels = [label for label in map(label_of, items) if label]
            if len(labels) != len(set(labels)):
                continue  # a label said twice: turns of a dialogue ("Friend 1:"), questions and answers
            if chunks:
                kept.append(_Block(chunks, block.is_list))
        return kept

    def _groups(self, instruction: str, response: str) -> list[list[_Chunk]]:
        groups: list[list[_Chunk]] = []
        for block in self._blocks(instruction, response):
            if groups and _is_joining_heading(response[groups[-1][-1].end : block.chunks[0].start]):
                groups[-1].extend(block.chunks)
            else:
                groups.append(list(block.chunks))
        return [g for g in groups if len(g) >= self.cfg.min_items and self._saves_steps(response, g)]

    def _saves_steps(self, response: str, group: list[_Chunk]) -> bool:
        """Whether the group's estimated critical path is shorter than writing it in order."""
        main_steps = 0.0
        chunk_ends = []
        sequential_steps = 0.0
        previous_end = group[0].start
        for chunk in group:
            gap = _estimated_tokens(response[previous_end : chunk.start])
            topic = make_topic(chunk.text(response), self.cfg.topic_words)
            content = _estimated_tokens(chunk.text(response))
            main_steps += gap + _estimated_tokens(topic) + _PROMISE_TAG_TOKENS
            chunk_ends.append(main_steps + content + 1)  # +1: </async>
            sequential_steps += gap + content
            previous_end = chunk.end
        return max(main_steps, *chunk_ends) < sequential_steps

    def _build(self, response: str, groups: list[list[_Chunk]]) -> Document:
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


_NAMES_STEPS = re.compile(r"\b(steps?|stages?|phases?|procedure)\b", re.IGNORECASE)


def _calls_them_steps(response: str, chunks: list[_Chunk]) -> bool:
    """Whether the sentence right before or right after the parts calls them steps ("These steps will help ...")."""
    before = re.split(r"(?<=[.!?:])\s", response[: chunks[0].start].rstrip())[-1]
    after = re.split(r"(?<=[.!?])\s", response[chunks[-1].end :].lstrip(), maxsplit=1)[0]
    return bool(_NAMES_STEPS.search(before) or _NAMES_STEPS.search(after))


def _is_joining_heading(between: str) -> bool:
    """Text between two blocks that only introduces the next one (`Cons:`), so both can be one group."""
    text = between.strip()
    if not text:
        return True
    if "\n" in text:
        return False
    text = _MARKDOWN.sub("", text).strip()
    return text.endswith(":") and _word_count(text) <= 8


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
