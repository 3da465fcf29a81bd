"""The `hf` judge's settings (conf/judge/hf.yaml), apart from the judge itself: composing a config reads them, and
should not import torch, which the judge needs (pasta/judges/hf_judge.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pasta.config import check_ranges
from pasta.judges.prompts import PROMPT_HELP

_PREFIX_HELP = (
    "assistant text appended after the chat template's generation prompt; the digit is read at the next token, and "
    "each digit must be exactly one token after it (checked at start-up)"
)


@dataclass
class HFJudgeConfig:
    """Settings of judge=hf (scores are named "hf:<model name>")."""

    kind: str = field(default="hf", metadata={"help": "judge type: embedding | openai | hf"})
    model: Any = field(
        default=None,
        metadata={"help": "the judge's own model config (group model/), independent of the policy's `model`; pick "
                          "one with model@judge.model=qwen2.5-1.5b"},
    )
    device: str = field(
        default="auto", metadata={"help": "auto (cuda if available, else cpu) | cpu | cuda | cuda:N"}
    )
    batch_size: int = field(
        default=8, metadata={"help": "prompts per forward pass (left-padded, sorted by length)"}
    )
    max_rating: int = field(
        default=9,
        metadata={"help": "score reads ratings 1..max_rating; at most 9 so each is one digit token"},
    )
    max_answer_tokens: int = field(
        default=512, metadata={"help": "answers longer than this many tokens are cut (marked ' [...]') before judging"}
    )
    score_prompt: str = field(default="judge_score.md", metadata={"help": PROMPT_HELP})
    compare_prompt: str = field(default="judge_compare.md", metadata={"help": PROMPT_HELP})
    score_prefix: str = field(default="Rating: ", metadata={"help": f"{_PREFIX_HELP}; the rating digit"})
    compare_prefix: str = field(default="Better answer: Answer ", metadata={"help": f"{_PREFIX_HELP}; the choice digit"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "batch_size": (lambda v: v >= 1, ">= 1"),
            "max_rating": (lambda v: 2 <= v <= 9, "in 2..9 (each rating one digit token)"),
            "max_answer_tokens": (lambda v: v >= 1, ">= 1"),
        })
