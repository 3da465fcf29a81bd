"""Preference pairs from scored candidates: combined score, best vs worst per prompt, ties skipped.

The paper scores each sampled answer by speed + lambda * quality, where speed is the decoder's theoretical speedup
(tokens / decoding steps) and quality the judge's score; lambda = inf ranks by quality alone. The best and the worst
candidate of a prompt make its pair; a prompt whose candidates all score the same teaches nothing and is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Scored:
    """One candidate's rewards."""

    speedup: float  # theoretical speedup of the candidate (>= 1)
    quality: float  # the judge's score in [0, 1]


def combined_score(candidate: Scored, quality_weight: float) -> float:
    """speedup + quality_weight * quality; quality alone when quality_weight is inf."""
    if math.isinf(quality_weight):
        return candidate.quality
    return candidate.speedup + quality_weight * candidate.quality


def best_and_worst(candidates: list[Scored], quality_weight: float) -> tuple[int, int] | None:
    """Indices of the best and the worst candidate, or None when they tie (or fewer than two were scored).

    Among equal scores the earliest candidate is taken, so the choice is reproducible.
    """
    if len(candidates) < 2:
        return None
    scores = [combined_score(c, quality_weight) for c in candidates]
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if scores[best] == scores[worst]:
        return None
    return best, worst
