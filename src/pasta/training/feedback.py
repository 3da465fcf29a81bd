"""A preference round's best well-formed forking answers, as SFT records (`round-<r>/forking.jsonl`).

The structural teacher puts promises in about 6% of Alpaca answers, so SFT has few examples of forking. Each round
samples the student's own answers to prompts the teacher left plain too; the chosen side of a pair that forks, is
well-formed and ended by itself (not cut at the token limit) is one more promise-bearing example, in the words the
student already writes. The records have the annotation stage's fields (`instruction`, `input`, `output` = the plain
text, `annotated`, `accepted`), so SFT reads them beside the teacher's:

    python -m pasta.train stage=sft data.path=annotated.jsonl 'data.extra_paths=[outputs/pref/round-*/forking.jsonl]'
"""

from __future__ import annotations

from typing import Any

from pasta.lang import LangError, parse
from pasta.training.candidates import Pair, ScoredPrompt

# The decoder's finish reasons of an answer that ended by itself (DecodeStats.finish_reason).
ENDED_BY_ITSELF = ("eos", "stop_string")


def forking_records(scored: list[ScoredPrompt], pairs: list[Pair], round_index: int) -> list[dict[str, Any]]:
    """Each pair's chosen candidate that forks (one promise or more), is well-formed and ended by itself."""
    prompts = {entry.id: entry for entry in scored}
    records = []
    for pair in pairs:
        entry = prompts[pair.id]
        candidate = entry.candidates[pair.chosen.index]
        if candidate.num_malformed or candidate.finish_reason not in ENDED_BY_ITSELF:
            continue
        try:
            num_promises = len(parse(candidate.annotated).promises)
        except LangError:  # the decoder renders what it parsed, so this is not expected; never train on it
            continue
        if num_promises == 0:
            continue
        records.append(
            {
                "instruction": entry.instruction,
                "input": entry.input,
                "output": candidate.text,
                "annotated": candidate.annotated,
                "accepted": True,
                "teacher": "pref",
                "round": round_index,
                "prompt_id": entry.id,
                "num_promises": num_promises,
                "theoretical_speedup": candidate.speedup,
                "quality": candidate.quality,
                "judge": candidate.judge,
            }
        )
    return records
