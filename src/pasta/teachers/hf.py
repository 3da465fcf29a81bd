"""The `hf` teacher: a local transformers model annotates responses with the teacher prompt, batched and greedy.

Each request becomes the model's chat prompt (system part and filled user template of the teacher prompt), a batch
is left-padded and decoded greedily with `generate`. The token budget of each batch is `max_new_tokens_factor`
times the longest response's length in tokens plus `max_new_tokens_extra` (room for the tags); an answer that
reaches it without the end-of-turn token is rejected as truncated. Works offline with the embedded SmolLM2-135M,
which is far too small to follow the prompt: its acceptance rate is reported, not hidden.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pasta.lang import encode_text
from pasta.models import ModelConfig, load_model
from pasta.teachers.base import TRUNCATED, Teacher, TeacherReply, TeacherRequest
from pasta.teachers.prompt import TeacherPrompt


@dataclass(frozen=True)
class HFTeacherConfig:
    """Settings of the local-model teacher (conf/teacher/hf.yaml)."""

    model: dict[str, Any] = field(
        metadata={"help": "a model config (conf/model/*.yaml): the teacher's weights"}
    )
    name: str = field(default="hf", metadata={"help": "teacher type: structural | hf | openai"})
    prompt: str = field(
        default="teacher_v1", metadata={"help": "prompt name in conf/prompts/ or a file path"}
    )
    batch_size: int = field(default=2, metadata={"help": "records generated together (left-padded)"})
    max_new_tokens_factor: float = field(
        default=1.5, metadata={"help": "token budget = factor * response tokens + extra"}
    )
    max_new_tokens_extra: int = field(
        default=128, metadata={"help": "tokens allowed for the tags themselves"}
    )


def model_label(model_cfg: ModelConfig) -> str:
    """What to write as the teacher model: its folder, hub id or config name."""
    if model_cfg.random_init is not None:
        return model_cfg.name
    return model_cfg.path or model_cfg.hub_id or model_cfg.name


class HFTeacher(Teacher):
    name = "hf"

    def __init__(self, cfg: HFTeacherConfig, device: str = "auto"):
        import torch

        if cfg.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.cfg = cfg
        model_cfg = ModelConfig.from_cfg(cfg.model)
        self.model = model_label(model_cfg)
        self.prompt = TeacherPrompt.load(cfg.prompt)
        self._torch = torch
        self._lm, self._tokenizer = load_model(model_cfg, device=device)
        self._tokenizer.padding_side = "left"  # generation continues from the right end of every row

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        iterator = iter(requests)
        while batch := list(itertools.islice(iterator, self.cfg.batch_size)):
            yield from self._generate(batch)

    def _budget(self, response: str) -> int:
        num_tokens = len(encode_text(self._tokenizer, response))
        return math.ceil(num_tokens * self.cfg.max_new_tokens_factor) + self.cfg.max_new_tokens_extra

    def _generate(self, batch: list[TeacherRequest]) -> list[TeacherReply]:
        torch = self._torch
        tokenizer = self._tokenizer
        prompts = [
            tokenizer.apply_chat_template(
                self.prompt.messages(r.instruction, r.input, r.response),
                add_generation_prompt=True,
                tokenize=False,
            )
            for r in batch
        ]
        # The chat template already writes the special tokens; adding them again would double a BOS.
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self._lm.device
        )
        budget = max(self._budget(r.response) for r in batch)
        with torch.no_grad():
            output = self._lm.generate(
                **encoded,
                max_new_tokens=budget,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )  # [B, S + new]
        new_ids = output[:, encoded["input_ids"].shape[1] :].tolist()  # [B, new]
        replies = []
        for request, ids in zip(batch, new_ids, strict=True):
            finished = tokenizer.eos_token_id in ids
            if finished:
                ids = ids[: ids.index(tokenizer.eos_token_id)]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            reason = None if finished else f"{TRUNCATED}: no end of answer within {budget} new tokens"
            replies.append(TeacherReply(request.id, text=text, reject_reason=reason))
        return replies
