"""The phrases the structural teacher reads: openers that mark points, and words that point back, sum up, or
call parts steps. Only the rules that use them (lists, paragraph and sentence runs, the independence rules) say what
they mean for an answer.
"""

from __future__ import annotations

import re

# An item that continues from the previous one rather than standing on its own.
DEPENDENT_START = re.compile(
    r"(then|next|after|afterwards?|finally|lastly|once|now|repeat|continue|meanwhile|subsequently|"
    r"following this|using (the|this) result)\b",
    re.IGNORECASE,
)
BACK_REFERENCE = re.compile(
    r"\b(previous step|steps? \d+|the above|the result|this result|the mixture|this mixture)\b", re.IGNORECASE
)
# An item or paragraph that sums up the ones before it.
CONCLUSION_START = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|together|taken together|all in all|in short|"
    r"ultimately|all of these|these)\b",
    re.IGNORECASE,
)
# Sentence openers that mark the points of a run of sentences. Ordinals number them; additive openers add one.
ORDINAL = re.compile(
    r"(?:the[ \t]+)?(?P<ordinal>first|second|third|fourth|fifth|sixth)(?:ly)?\b", re.IGNORECASE
)
ORDINAL_NUMBERS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6}
ADDITIVE = re.compile(
    r"(additionally|furthermore|moreover|in addition|also|besides|another|on top of (that|this))\b", re.IGNORECASE
)
EXAMPLE_FIRST = re.compile(r"(for example|for instance|one example|an example)\b", re.IGNORECASE)
EXAMPLE_NEXT = re.compile(r"(another|a second|a further|a third) example\b", re.IGNORECASE)
LAST_POINT = re.compile(r"(finally|lastly|last but not least)\b", re.IGNORECASE)
# A sentence that sums up or draws on the points before it: the run of points ends there.
SUMMING_UP = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|in short|all in all|ultimately|together|"
    r"taken together|therefore|thus|hence|as a result|consequently|all of these|these|by (doing|following|using)|"
    r"with (these|all)|this way)\b",
    re.IGNORECASE,
)
# A point that opens by pointing at an earlier one ("Second, this means ...") depends on it.
POINTS_BACK = re.compile(r"(this|these|those|such|both|the same|the former|the latter)\b", re.IGNORECASE)
_MARKER_END = re.compile(r"[ \t]*,?[ \t]*")
# An instruction that asks for separate pieces of advice: imperative points are then tips, not steps.
ASKS_FOR_TIPS = re.compile(
    r"\b(tips?|ways?|ideas?|suggestions?|techniques?|strategies|methods?|practices|advice|recommendations?)\b",
    re.IGNORECASE,
)
# An imperative point ("First, preheat the oven"): a step of a procedure unless tips were asked for.
IMPERATIVE = re.compile(
    r"(make|use|add|take|get|go|start|begin|put|place|mix|combine|preheat|cut|open|turn|set|create|choose|select|"
    r"gather|find|identify|determine|write|read|check|remove|install|click|pour|heat|boil|bake|stir|prepare|plan|"
    r"decide|research|consider|ensure|keep|try|list|define|collect|build|connect|apply|follow|wash|fill|cook|let|"
    r"you (will )?(need|should|must|have to|can)|we (will )?(need|should|must|have to))\b",
    re.IGNORECASE,
)


# Text that calls the parts around it steps ("These steps will help ...").
NAMES_STEPS = re.compile(r"\b(steps?|stages?|phases?|procedure)\b", re.IGNORECASE)


def _point_marker(sentence: str) -> re.Match[str] | None:
    for pattern in (ORDINAL, EXAMPLE_NEXT, EXAMPLE_FIRST, ADDITIVE, LAST_POINT):
        if match := pattern.match(sentence):
            return match
    return None


def point_body(sentence: str) -> str | None:
    """The sentence after the opener that marks it a point, and its comma ("Secondly, forests ..." -> "forests
    ..."), or None when no such opener starts it."""
    marker = _point_marker(sentence)
    if marker is None:
        return None
    return sentence[_MARKER_END.match(sentence, marker.end()).end() :]
