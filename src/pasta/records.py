"""Recorded settings: what a run file keeps of the settings it ran with, and how a resumed run compares them with
its own (the first setting that differs names the refusal). No stage and no torch: the decoder's own record check
(pasta.decoding.config.decode_difference) builds on it.

    from pasta.records import as_json, first_difference, with_defaults
"""

from __future__ import annotations

import json
from typing import Any


def as_json(value: Any) -> Any:
    """`value` through JSON, so that it compares equal to what a resumed run reads back from its file (a tuple is a
    list there)."""
    return json.loads(json.dumps(value))


def with_defaults(recorded: Any, defaults: Any) -> Any:
    """`recorded` (a run file's settings) with the settings it lacks taken from `defaults`, nested dicts included: a
    setting added after a run was recorded did not exist then, so that run ran as its default does."""
    if not isinstance(recorded, dict) or not isinstance(defaults, dict):
        return recorded
    return {**defaults, **{key: with_defaults(value, defaults.get(key)) for key, value in recorded.items()}}


def first_difference(key: str, recorded: Any, asked: Any) -> tuple[str, Any, Any]:
    """The innermost setting where `recorded` and `asked` differ, as (dotted key, recorded value, asked value)."""
    if isinstance(recorded, dict) and isinstance(asked, dict):
        for name in (*recorded, *(k for k in asked if k not in recorded)):
            if recorded.get(name) != asked.get(name):
                return first_difference(f"{key}.{name}", recorded.get(name), asked.get(name))
    return key, recorded, asked
