"""The lead of a part: what stays in the main thread when the part becomes a chunk.

A fork is cheap when the chunk writes only what the main thread cannot: so a list item's marker and number, its
bold or labelled lead, a section's heading and the opener of a point ("Secondly,") are written by the main thread,
before the promise, and the chunk writes the body. The main thread then renders the list as it reads
(`1. **Sleep**:<promise topic="Sleep"/>\\n2. ...`), a chunk never guesses its item number, and a lead that the
topic names is not written twice.

    1. **Lead**: body          ->  main "1. **Lead**:"      chunk " body"       topic "Lead"
    - **Lead:** body           ->  main "- **Lead:**"       chunk " body"       topic "Lead"
    2. Label: body             ->  main "2. Label:"         chunk " body"       topic "Label"
    - Term - body              ->  main "- Term -"          chunk " body"       topic "Term"
    ### Heading\\n\\nbody       ->  main "### Heading"       chunk "\\n\\nbody"  topic "Heading"
    3. plain item text         ->  main "3."                chunk " plain ..."  topic from the body's first words
    Secondly, forests ...      ->  main "Secondly,"         chunk " forests ..."

The chunk starts with the whitespace after the lead, so its first word keeps the leading space it has in running
text (the same tokens the student writes when it decodes it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pasta.teachers.structural.cues import point_opener_end

_MARKER = re.compile(r"(?:[-*•+]|\d{1,3}[.)])(?=[ \t])")
_HEADING = re.compile(r"#{1,6}[ \t]+(?P<label>[^\n]+?)[ \t#]*(?=\n|$)")
_BOLD = re.compile(r"(?P<mark>\*\*|__)(?P<label>[^*_\n]{1,100}?)(?P=mark)(?:[ \t]*[:\-–—])?")
_COLON = re.compile(r"(?P<label>[A-Z0-9][^:.!?\n*]{0,60}):(?=\s)")
# "Misfortune - implies bad luck", "Fela Kuti (Nigeria) – Afrobeat": a short term before a spaced dash.
_DASH = re.compile(r"(?P<label>[A-Z0-9\"“][^:.!?\n*–—]{0,50}?)[ \t]+[-–—](?=[ \t])")
_MAX_BOLD_WORDS = 12
_MAX_COLON_WORDS = 5
_MAX_DASH_WORDS = 4


@dataclass(frozen=True)
class Lead:
    """How many characters of a part stay in the main thread, the label they carry (None: a bare marker or an
    opener), and the kind of lead: heading, bold, colon, dash, opener, marker, or "" for none."""

    length: int
    label: str | None
    kind: str = ""


def find_lead(text: str) -> Lead:
    """The lead of a part's text (which starts at its marker, heading or first word): see the module docstring.

    Only a lead followed by a body is split off: a part that is all lead stays whole.
    """
    position = 0
    marker = _MARKER.match(text)
    if marker:
        position = marker.end()
    bare = Lead(position, None, "marker" if marker else "")
    rest_start = len(text) - len(text[position:].lstrip(" \t"))
    lead = _labelled(text, rest_start)
    if lead is None:
        opener = point_opener_end(text[rest_start:]) if not marker else None
        lead = Lead(rest_start + opener, None, "opener") if opener else bare
    for candidate in (lead, bare):  # all lead and no body: at most the marker stays behind
        if re.search(r"\w", text[candidate.length :]):
            return candidate
    return Lead(0, None)


def group_leads(texts: list[str], leads_in_main: bool = True) -> list[Lead]:
    """The leads of a group's parts. A `Label:` or `Term -` lead is one only when every part of the group opens
    with one (a sentence with a colon or a dash in one item is not a label); otherwise the marker alone stays.

    With `leads_in_main=False` only markers, numbers and openers stay in the main thread: the chunk writes its own
    lead (after a marker, or its heading), and the label only names the topic.
    """
    leads = [find_lead(text) for text in texts]
    if any(lead.kind in ("colon", "dash") for lead in leads) and len({lead.kind for lead in leads}) > 1:
        leads = [_bare(text) if lead.kind in ("colon", "dash") else lead for text, lead in zip(texts, leads,
                                                                                               strict=True)]
    if not leads_in_main:
        leads = [Lead(_bare(text).length, lead.label, lead.kind) if lead.label else lead
                 for text, lead in zip(texts, leads, strict=True)]
    return leads


def _bare(text: str) -> Lead:
    marker = _MARKER.match(text)
    if marker and re.search(r"\w", text[marker.end() :]):
        return Lead(marker.end(), None, "marker")
    return Lead(0, None)


def _labelled(text: str, start: int) -> Lead | None:
    heading = _HEADING.match(text, start)
    if heading:
        return Lead(heading.end(), _clean(heading.group("label")), "heading")
    bold = _BOLD.match(text, start)
    if bold and len(bold.group("label").split()) <= _MAX_BOLD_WORDS:
        return Lead(bold.end(), _clean(bold.group("label")), "bold")
    colon = _COLON.match(text, start)
    if colon and len(colon.group("label").split()) <= _MAX_COLON_WORDS:
        return Lead(colon.end(), _clean(colon.group("label")), "colon")
    dash = _DASH.match(text, start)
    if dash and len(dash.group("label").split()) <= _MAX_DASH_WORDS:
        return Lead(dash.end(), _clean(dash.group("label")), "dash")
    return None


def _clean(label: str) -> str:
    return re.sub(r"[*_`#\"“”]+", "", label).strip().rstrip(":.").strip()
