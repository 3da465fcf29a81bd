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
    r"\b(previous step|steps? \d+|the above|the result|this result|the mixture|this mixture|on the other hand|"
    r"in contrast|by contrast|conversely|similarly|likewise|as mentioned|as noted|mentioned above|the former|"
    r"the latter|the same way)\b",
    re.IGNORECASE,
)
# The first item of a list that starts a procedure ("1. Start with the infinitive").
STARTS_SEQUENCE = re.compile(r"(start|begin|first|to begin|to start)\b", re.IGNORECASE)
# An item or paragraph that sums up the ones before it.
CONCLUSION_START = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|together|taken together|all in all|in short|"
    r"ultimately|all of these|these|in essence|essentially|in a nutshell|to conclude)\b",
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
    r"soak|simmer|strain|rinse|dry|drain|measure|insert|attach|mark|drill|screw|mount|fold|roll|press|pull|push|"
    r"hold|load|lift|lower|release|clean|wipe|sand|paint|spray|cover|seal|store|serve|heat|cool|chill|freeze|"
    r"dissolve|blend|whisk|knead|shape|slice|chop|season|test|run|save|download|upload|log|sign|enter|type|"
    r"navigate|configure|initialize|launch|restart|update|replace|adjust|align|position|secure|tighten|loosen|"
    r"you (will )?(need|should|must|have to|can)|we (will )?(need|should|must|have to))\b",
    re.IGNORECASE,
)
# An instruction that asks how to carry something out ("How do I install ...", "walk me through"), not how to make
# something better ("How can I make my battery last longer?"): its numbered imperative items are steps.
ASKS_HOW_TO = re.compile(
    r"\b(how (do|can|should|would) (i|you|we|one)|how to)[ \t]+(\w+[ \t]+)?(make|build|install|set up|cook|bake|"
    r"prepare|fix|repair|clean|assemble|configure|brew|grow|plant|load|draw|dye|knit|sew|paint|replace|"
    r"initiali[sz]e|deploy|defrost|change|detail|create|use|play|start|get to|apply|register|file|open)\b"
    r"(?![^?.]*\b(better|longer|more|less|easier|faster|healthier|last|stronger|happier|safer)\b)|"
    r"\b(walk me through|step[- ]by[- ]step|recipe)\b",
    re.IGNORECASE,
)


# Text that calls the parts around it steps ("These steps will help ...", "Here are the steps:", "a step-by-step
# guide"), and not a mere mention ("quantum computing is in its early stages").
NAMES_STEPS = re.compile(
    r"\b(these|those|the|following|some|several|a few|few|\d+|two|three|four|five|six|seven|eight|nine|ten)"
    r"[ \t]+(\w+[ \t]+){0,2}?(steps|stages|phases)\b|\bstep[- ]by[- ]step\b|\bprocedure\b|\b(next|first|final|last) step\b|"
    r"\brecipe\b",
    re.IGNORECASE,
)
# A heading that names a step of a sequence ("Step 2", "Day 1", "Phase three") or a recipe's method.
STEP_HEADING = re.compile(
    r"\b(step|stage|phase|day|week|month|round|level|segment|part|chapter|scene|act|episode|lesson|module|section)"
    r"[ \t]*(\d+|one|two|three|four|five|six|seven|eight|nine|ten|[ivx]+)\b|"
    r"^(instructions|directions|method|procedure|preparation|steps|how to make it|ingredients)$",
    re.IGNORECASE,
)
# A heading over parts that are steps ("Installation Steps:", "Instructions").
STEPS_HEADING = re.compile(r"\b(steps?|instructions|directions|procedure|method|how to)\b", re.IGNORECASE)
# A label that places its part in a sequence of times: the parts of an itinerary or a schedule.
TIME_LABEL = re.compile(r"(morning|afternoon|evening|night|midday|noon|dawn|dusk|late night)\b", re.IGNORECASE)
# A heading that sums the sections up: its section goes after the sync.
CONCLUSION_HEADING = re.compile(
    r"^(conclusion|summary|in summary|in conclusion|final thoughts|overall|bottom line|to sum up|wrapping up|"
    r"key takeaways?|takeaways?)\b", re.IGNORECASE)
# A heading that introduces the sections after it: its section stays in the main thread, before the group.
INTRODUCTION_HEADING = re.compile(r"^(introduction|intro|overview|background|context)\b", re.IGNORECASE)
# A paragraph that closes an answer rather than continuing its last part.
CLOSING_START = re.compile(
    r"(overall|in summary|in conclusion|to sum up|to summari[sz]e|taken together|all in all|in short|ultimately|"
    r"in the end|all of these|these|remember|keep in mind|by (following|using|applying|taking|keeping)|"
    r"with (these|this|all)|following these|i hope|hope this|feel free|good luck|if you (have|need|want|are)|"
    r"always)\b",
    re.IGNORECASE,
)


def _point_marker(sentence: str) -> re.Match[str] | None:
    for pattern in (ORDINAL, EXAMPLE_NEXT, EXAMPLE_FIRST, ADDITIVE, LAST_POINT):
        if match := pattern.match(sentence):
            return match
    return None


def point_opener_end(sentence: str) -> int | None:
    """Where the opener of a point ends when a comma follows it ("Secondly," "For example,"): the part the main
    thread writes; None when no opener with a comma starts the sentence."""
    marker = _point_marker(sentence)
    if marker is None:
        return None
    comma = re.match(r"[ \t]*,", sentence[marker.end() :])
    return marker.end() + comma.end() if comma else None


def point_body(sentence: str) -> str | None:
    """The sentence after the opener that marks it a point, and its comma ("Secondly, forests ..." -> "forests
    ..."), or None when no such opener starts it."""
    marker = _point_marker(sentence)
    if marker is None:
        return None
    return sentence[_MARKER_END.match(sentence, marker.end()).end() :]
