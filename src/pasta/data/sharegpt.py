"""ShareGPT conversations as instruction records: `data.format=sharegpt` (SlimOrca, the paper's data, is one).

A ShareGPT record is `{"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}` (`user` and
`assistant` are read as `human` and `gpt`; other keys of a turn, such as SlimOrca's `weight`, are ignored). A
single exchange, an optional system turn then one human turn and one gpt turn, becomes

    {"instruction": <system prompt>\\n\\n<human turn>, "input": "", "output": <gpt turn>, "human": <human turn>,
     "system": <system prompt>}

The system prompt goes in front of the instruction (`data.system_prompt=prepend`, the default) because it shapes
the answer: SlimOrca's ask for "a detailed and long answer", a step-by-step justification, or an explanation "to a
five year old", and the chat templates pasta trains with have one user turn (pasta.models.prompts). `human` and
`system` are what the loader checks against the held-out pool besides the instruction (a pool prompt given as the
system turn is still a pool prompt, whether or not the instruction keeps it), then drops.
`data.system_prompt=drop` trains on the human turn alone. Anything else (no conversations list, a turn without a
string `value`, an unknown role, an empty turn, several exchanges) is malformed: `conversation_record` says why,
and the loader skips the record and counts it.
"""

from __future__ import annotations

from typing import Any

from pasta.choice import Choice

ROLES = {"system": "system", "human": "human", "user": "human", "gpt": "gpt", "assistant": "gpt"}


class SystemPrompt(Choice):
    """What a ShareGPT record's system prompt becomes."""

    prepend = "prepend"
    drop = "drop"


def conversation_record(raw: Any, system_prompt: SystemPrompt = SystemPrompt.prepend) -> dict[str, str] | str:
    """The instruction record of one ShareGPT record, or the reason it is malformed."""
    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}"
    turns = raw.get("conversations")
    if not isinstance(turns, list) or not turns:
        return "no 'conversations' list"
    roles, values = [], []
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return f"turn {number} has no string 'value'"
        role = ROLES.get(turn.get("from")) if isinstance(turn.get("from"), str) else None
        if role is None:
            return f"turn {number} is from {turn.get('from')!r}, not one of {', '.join(ROLES)}"
        roles.append(role)
        values.append(turn["value"])
    system = ""
    if roles[0] == "system":
        system = values[0].strip()
        roles, values = roles[1:], values[1:]
    if roles != ["human", "gpt"]:
        return f"expected [system,] human, gpt turns, got {', '.join(roles) or 'no other turn'}"
    human, answer = values
    if not human.strip() or not answer.strip():
        return f"empty {'human' if not human.strip() else 'gpt'} turn"
    prepend = system and system_prompt == SystemPrompt.prepend
    return {"instruction": f"{system}\n\n{human}" if prepend else human, "input": "", "output": answer, "human": human,
            "system": system}
