"""The preference stage's records: sampled candidates, a prompt's scored candidates, and best-vs-worst pairs.

They cross the stage's steps (sampling -> pairing -> training) and its files: `scores.jsonl` holds one
`ScoredPrompt` per line (written with `to_json()`, read back with `from_json()` when a round resumes) and `pairs.jsonl`
one `Pair`; the files keep the field names they always had, and scores written before a field existed still read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pasta.decoding.result import ENDED_BY_ITSELF

# A candidate's thread ids as training examples hold them: main_ids, opener_ids, body_ids, num_predicted.
ThreadIds = dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    """One sampled answer with its scores; `quality` is None when the judge could not score it."""

    text: str  # plain text, what the judge read
    annotated: str  # with its PASTA-LANG tags
    speedup: float  # theoretical: tokens / forward steps
    quality: float | None
    judge: str  # whose score `quality` is
    num_tokens: int = 0
    num_steps: int = 0
    finish_reason: str = ""
    malformed: dict[str, int] = field(default_factory=dict)  # malformed-output events by kind
    tokens: ThreadIds = field(default_factory=dict)

    @property
    def num_malformed(self) -> int:
        return sum(self.malformed.values())

    @property
    def ended(self) -> bool:
        """The answer ended by itself (not cut by its budget)."""
        return self.finish_reason in ENDED_BY_ITSELF

    @property
    def forked(self) -> bool:
        """The answer decoded at least one chunk."""
        return bool(self.tokens.get("body_ids"))

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Candidate:
        # Scores written before candidates recorded their malformed events count as well-formed.
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ScoredPrompt:
    """A prompt of a round and its candidates; `status` is "scored", or "judge_failed" when a candidate has no
    quality after the judge's retries (the prompt is then skipped, never scored as zero)."""

    id: str
    prompt_index: int  # its place in the round's prompts: with the round's seed, it seeds its candidates
    instruction: str
    input: str
    reference: str  # the answer the judge compares with
    prompt_ids: list[int]
    judge: str
    status: str
    candidates: list[Candidate]
    # The reference answer's tokens in the student's tokenizer, eos included: the steps a sequential decode of it
    # takes, against which `stage.speed_reward=latency` scores a candidate's steps. None in older scores files.
    reference_num_tokens: int | None = None
    # The settings that drew the candidates (`sampling_settings`: the stage's and its decoder's), so a resumed round
    # can refuse scores drawn otherwise. None in older scores files; the decoder's (`decoding`) is absent in files
    # written before 2026-11-27.
    sampling: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ScoredPrompt:
        fields = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        return cls(**{**fields, "candidates": [Candidate.from_json(c) for c in record["candidates"]]})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PairSide:
    """The chosen or the rejected candidate of a pair, with its place among the prompt's candidates."""

    index: int
    score: float  # speed + quality_weight * quality
    num_malformed: int
    speed: float  # the speed reward's value (stage.speed_reward)
    speedup: float  # theoretical: the candidate's tokens / its steps
    quality: float | None
    judge: str
    text: str
    annotated: str
    tokens: ThreadIds
    num_tokens: int = 0  # the side's sampled tokens (an untagged side: its plain tokens); 0 in older pairs files

    @property
    def forked(self) -> bool:
        """The answer decoded at least one chunk."""
        return bool(self.tokens.get("body_ids"))


@dataclass(frozen=True)
class Pair:
    """A best-vs-worst pair of one prompt."""

    id: str
    instruction: str
    judge: str
    quality_weight: float | str  # "inf" for quality only (JSON has no infinity)
    prompt_ids: list[int]
    chosen: PairSide
    rejected: PairSide

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
