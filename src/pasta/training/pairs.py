"""Preference pairs from scored candidates: combined score, best vs worst per prompt, ties skipped.

The paper scores each sampled answer by speed + lambda * quality, where speed is the decoder's theoretical speedup
(tokens / decoding steps) and quality the judge's score; lambda = inf ranks by quality alone. The best and the worst
candidate of a prompt make its pair; a prompt whose candidates all score the same teaches nothing and is skipped.

A candidate whose decode had malformed PASTA-LANG ranks below every well-formed one, whatever its score: its
training sequence is the decoder's cleaned version of what was sampled, a sequence the policy never wrote, and
a garbled fork can out-score a clean answer on speed (measured on the tiny model: a speed-only round picked a
malformed fork with log-prob -62 over a clean answer with -6 and made sampling worse). So it is never the chosen
side, and it is the rejected side when the prompt has one: the pair then teaches away from broken structure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Scored:
    """One candidate's rewards."""

    speedup: float  # theoretical speedup of the candidate (>= 1)
    quality: float  # the judge's score in [0, 1]
    num_malformed: int = 0  # malformed-output events of the candidate's decode (see the module docstring)


def combined_score(candidate: Scored, quality_weight: float) -> float:
    """speedup + quality_weight * quality; quality alone when quality_weight is inf."""
    if math.isinf(quality_weight):
        return candidate.quality
    return candidate.speedup + quality_weight * candidate.quality


def best_and_worst(candidates: list[Scored], quality_weight: float) -> tuple[int, int] | None:
    """Indices of the best and the worst candidate, or None when they tie (or fewer than two were scored).

    Well-formed candidates rank above malformed ones (see the module docstring); a prompt with no well-formed
    candidate makes no pair. Among equal ranks the earliest candidate is taken, so the choice is reproducible.
    """
    if len(candidates) < 2:
        return None
    ranks = [(c.num_malformed == 0, combined_score(c, quality_weight)) for c in candidates]
    best = max(range(len(ranks)), key=lambda i: (ranks[i], -i))
    worst = min(range(len(ranks)), key=lambda i: (ranks[i], i))
    if ranks[best] == ranks[worst] or not ranks[best][0]:
        return None
    return best, worst
