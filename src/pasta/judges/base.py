"""What every quality judge is: the item it judges and the two questions it answers.

`score` gives pointwise quality in [0, 1] (the preference stage's quality reward); `compare` gives the probability
that the candidate beats the reference (the evaluation's pairwise preference). `None` marks an item the judge could
not judge after its retries; callers skip it and never read it as a zero. Every number belongs to `judge.name`:
numbers from different judges are never mixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class JudgeItem:
    """One answer to judge."""

    instruction: str
    candidate: str  # plain text being judged (tags already removed)
    reference: str | None = (
        None  # a point of comparison, e.g. the Baseline-SFT answer to the same instruction
    )


@runtime_checkable
class Judge(Protocol):
    name: str  # written next to every score, e.g. "embedding:all-MiniLM-L6-v2", "openai:gpt-4o-mini"

    def score(self, items: list[JudgeItem]) -> list[float | None]:
        """Quality of each candidate in [0, 1]; None = failed after retries."""
        ...

    def compare(self, items: list[JudgeItem]) -> list[float | None]:
        """P(candidate beats reference) in [0, 1] for each item; None = failed after retries."""
        ...


def rating_to_unit(rating: float, max_rating: int) -> float:
    """Map a rating on 1..max_rating to [0, 1]."""
    return (rating - 1.0) / (max_rating - 1.0)
