"""Judge prompt templates (conf/prompts/judge_*.md) and parsing of the judges' text replies.

A template file holds the system message, a line that is exactly `<!-- user -->`, then the user message with
`{{name}}` placeholders. Placeholders are filled in one pass, so an answer that itself contains `{{reference}}` is
left as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pasta.data.jsonl import read_text_file
from pasta.errors import PastaError

USER_MARKER = "<!-- user -->"
_PLACEHOLDER_RE = re.compile(r"\{\{(\w+)\}\}")

SCORE_FIELDS = frozenset({"instruction", "candidate", "reference", "max_rating"})
COMPARE_FIELDS = frozenset({"instruction", "answer_1", "answer_2"})
NO_REFERENCE = "(no reference answer given)"
# The help text of the judges' score_prompt and compare_prompt settings.
PROMPT_HELP = 'template: a file path, or a name under conf/prompts/ (system text, a line "<!-- user -->", user text)'


@dataclass(frozen=True)
class ChatPrompt:
    system: str
    user_template: str

    def messages(self, **values: str) -> list[dict[str, str]]:
        """Chat messages with the placeholders filled in."""

        def fill(match: re.Match) -> str:
            return str(values[match.group(1)])

        user = _PLACEHOLDER_RE.sub(fill, self.user_template)
        system = self.system.strip()
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}
        ]


def resolve_prompt_path(name: str) -> Path:
    """A prompt given as a path that exists, or as a file name under the project's conf/prompts/."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    from pasta.config import conf_dir

    candidate = conf_dir() / "prompts" / name
    if candidate.is_file():
        return candidate
    raise PastaError(
        f"judge prompt not found: {name} (give a file path or a name under {conf_dir() / 'prompts'})"
    )


def load_prompt(name: str, fields: frozenset[str]) -> ChatPrompt:
    """Load and check a template: its placeholders must all be known and the essential ones present."""
    path = resolve_prompt_path(name)
    text = read_text_file(path)
    lines = text.splitlines(keepends=True)
    marker_lines = [i for i, line in enumerate(lines) if line.strip() == USER_MARKER]
    if len(marker_lines) != 1:
        raise PastaError(f"{path}: needs exactly one line '{USER_MARKER}' between system and user message")
    cut = marker_lines[0]
    system, user = "".join(lines[:cut]), "".join(lines[cut + 1 :]).strip("\n")
    used = set(_PLACEHOLDER_RE.findall(user))
    unknown = used - fields
    if unknown:
        raise PastaError(f"{path}: unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(fields)}")
    missing = (fields - {"max_rating", "reference"}) - used
    if missing:
        raise PastaError(
            f"{path}: the user message lacks placeholder(s) {sorted('{{' + m + '}}' for m in missing)}"
        )
    return ChatPrompt(system=system, user_template=user)


_NUMBER = r"(\d+(?:\.\d+)?)"
_OUT_OF_RE = re.compile(_NUMBER + r"\s*(?:/|out of)\s*(\d+)", re.IGNORECASE)
_LABELLED_RE = re.compile(r"\b(?:rating|score|grade)\b\s*(?:is|of|:|=)?\s*:?\s*" + _NUMBER, re.IGNORECASE)
_STANDALONE_RE = re.compile(r"(?<![\w.])" + _NUMBER + r"(?![\w]|\.\d)")


def parse_rating(text: str, max_rating: int) -> float | None:
    """The rating in a reply ("7", "Rating: 7", "**7/10**", "I'd give it 7."), or None when there is no single one.

    Out-of-range numbers count as unparseable rather than being clipped: a judge that answers "0" or "11" did not
    follow the scale, and a clipped number would hide that.
    """
    plain = re.sub(r"[*_`#]", "", text).strip()
    rating = None
    if match := _OUT_OF_RE.search(plain):
        if int(match.group(2)) == max_rating:
            rating = float(match.group(1))
    elif match := _LABELLED_RE.search(plain):
        rating = float(match.group(1))
    else:
        numbers = _STANDALONE_RE.findall(plain)
        # A reply that opens with a number rates with it ("7. The answer is clear but misses step 2").
        if numbers and (plain[:1].isdigit() or len(numbers) == 1):
            rating = float(numbers[0])
    if rating is None or not 1 <= rating <= max_rating:
        return None
    return rating


_CHOICE_PATTERNS = [
    re.compile(r"^\W*(?:(?:answer|output|response)\s*)?\(?([12])\)?\W*$", re.IGNORECASE),  # the whole reply
    re.compile(
        r"\b(?:answer|output|response)\s*\(?([12])\)?\s+is\s+(?:better|the better|preferred)", re.IGNORECASE
    ),
    re.compile(
        r"\b(?:better|preferred|winner|choice|verdict)\b[^0-9]{0,30}?\b(?:answer|output|response)?\s*([12])\b",
        re.IGNORECASE,
    ),
    re.compile(r"^\W*\(?([12])\)?(?:[^\w.]|$)"),  # starts with the bare choice: "2 - it is more complete"
]


def parse_choice(text: str) -> int | None:
    """1 or 2 from a reply to "which answer is better?", or None when the reply does not say clearly."""
    plain = re.sub(r"[*_`#]", "", text).strip()
    for pattern in _CHOICE_PATTERNS:
        if match := pattern.search(plain):
            return int(match.group(1))
    mentioned = set(re.findall(r"(?<![\w.])([12])(?![\w]|\.\d)", plain))
    return int(mentioned.pop()) if len(mentioned) == 1 else None
