"""The `hf` teacher's settings (conf/teacher/hf.yaml), apart from the teacher itself: composing a config reads them,
and should not import transformers, which the teacher needs (pasta/teachers/hf.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pasta.config import check_ranges
from pasta.errors import PastaError


@dataclass(frozen=True)
class HFTeacherConfig:
    """Settings of the local-model teacher (conf/teacher/hf.yaml); its model is a `model/` config at teacher.model."""

    model: dict[str, Any] = field(
        metadata={"help": "a model config (conf/model/*.yaml): the teacher's weights"}
    )
    kind: str = field(default="hf", metadata={"help": "teacher type: structural | hf | openai"})
    prompt: str = field(
        default="teacher_v2", metadata={"help": "prompt name in conf/prompts/ or a file path"}
    )
    batch_size: int = field(default=2, metadata={"help": "records generated together (left-padded)"})
    max_new_tokens_factor: float = field(
        default=1.5, metadata={"help": "token budget = factor * response tokens + extra"}
    )
    max_new_tokens_extra: int = field(
        default=128, metadata={"help": "tokens allowed for the tags themselves"}
    )
    stop_when_diverged: bool = field(
        default=True, metadata={"help": "stop a row once its answer holds text that is not in the response"}
    )

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "batch_size": (lambda v: v >= 1, ">= 1"),
            "max_new_tokens_factor": (lambda v: v >= 0, ">= 0 (0 = a budget of max_new_tokens_extra alone)"),
            "max_new_tokens_extra": (lambda v: v >= 0, ">= 0"),
        })
        if self.max_new_tokens_factor == 0 and self.max_new_tokens_extra == 0:
            raise PastaError(f"{where}.max_new_tokens_factor=0 and {where}.max_new_tokens_extra=0 leave the teacher "
                             "no token to write")
