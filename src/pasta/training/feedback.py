"""A preference round's best well-formed forking answers, as SFT records (`round-<r>/forking.jsonl`).

The structural teacher puts promises in about 6% of Alpaca answers, so SFT has few examples of forking. Each round
samples the student's own answers to prompts the teacher left plain too. Per prompt, the candidate kept is the best
by the round's score (speed + lambda * quality) among those that fork (one promise or more), are well-formed, ended
by themselves (not cut at the token limit), number their chunks in order if they number them at all, and judge at
least as well as the prompt's median candidate: one more promise-bearing example, in words the student already
writes, no worse than its usual answer. Only the chosen side of a pair would keep fewer: at lambda = inf a fork is
rarely the single best-judged answer (measured before the numbering test: 1 of 32 prompts, against 6 with the median
floor; with it, 1 either way). The records have the annotation stage's fields (`instruction`, `input`,
`output` = the plain text, `annotated`, `accepted`), so SFT reads them beside the teacher's:

    python -m pasta.train stage=sft data.path=annotated.jsonl 'data.extra_paths=[outputs/pref/round-*/forking.jsonl]'
"""

from __future__ import annotations

import re
from typing import Any

from pasta.lang import LangError, parse
from pasta.training.candidates import Candidate, ScoredPrompt
from pasta.training.config import SpeedReward
from pasta.training.pairs import combined_score, median_quality, scored_of

# A chunk that opens as a numbered list item: "3. ...", "3) ...".
ITEM_NUMBER = re.compile(r"\s*(\d+)[.)]\s")


def usable_promises(candidate: Candidate) -> int:
    """The candidate's promises, or 0 when it is not fit to train on: its annotation does not parse (the decoder
    renders what it parsed, so that is not expected), or its chunks number themselves out of order.

    Chunks are written in parallel, each inferring its number from the promises it sees, and a small student gets
    it wrong (in the CPU rounds: 1 of 6 and 1 of 20 numbered forks in order; the teacher's records, 183 of 186);
    training on such an answer would teach the wrong numbers."""
    try:
        promises = parse(candidate.annotated).promises
    except LangError:
        return 0
    numbers = [ITEM_NUMBER.match(promise.content) for promise in promises]
    if any(numbers) and [int(m.group(1)) if m else None for m in numbers] != list(range(1, len(promises) + 1)):
        return 0
    return len(promises)


def forking_records(
    scored: list[ScoredPrompt], quality_weight: float, reward: SpeedReward, round_index: int
) -> list[dict[str, Any]]:
    """Per scored prompt, its best well-formed, self-ended fork judged no worse than its median candidate."""
    records = []
    for entry in scored:
        if entry.status != "scored":  # a prompt the judge failed on has candidates without quality
            continue
        floor = median_quality(entry)
        eligible = [
            (index, candidate)
            for index, candidate in enumerate(entry.candidates)
            if not candidate.num_malformed
            and candidate.ended
            and candidate.quality >= floor
            and usable_promises(candidate) > 0
        ]
        if not eligible:
            continue
        index, best = max(
            eligible, key=lambda pair: (combined_score(scored_of(pair[1], entry, reward), quality_weight), -pair[0])
        )
        records.append(
            {
                "instruction": entry.instruction,
                "input": entry.input,
                "output": best.text,
                "annotated": best.annotated,
                "accepted": True,
                "teacher": "pref",
                "round": round_index,
                "prompt_id": entry.id,
                "candidate_index": index,
                "num_promises": usable_promises(best),
                "theoretical_speedup": best.speedup,
                "quality": best.quality,
                "judge": best.judge,
            }
        )
    return records
