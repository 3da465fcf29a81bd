"""The `hf` teacher: a local transformers model annotates responses with the teacher prompt, batched and greedy.

Each request becomes the model's chat prompt (system part and filled user template of the teacher prompt), a batch
is padded and decoded greedily with `generate`. The system part (the language description and its examples, ~5.5K
tokens) is the same for every record, so its KV cache is computed once and reused by every batch. The token budget of each batch is `max_new_tokens_factor`
times the longest response's length in tokens plus `max_new_tokens_extra` (room for the tags); an answer that
reaches it without the end-of-turn token is rejected as truncated.

A row stops early once its answer holds text that is not in the response (`stop_when_diverged`): a teacher that
rewrites, explains or rambles is rejected as `diverged` after a few tokens instead of a full budget of them, which
is what makes a weak local teacher affordable on a CPU. Works offline with the embedded SmolLM2-135M, which is far
too small to follow the prompt: its acceptance rate is reported, not hidden.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from transformers import StoppingCriteria, StoppingCriteriaList

from pasta.config import schema_from
from pasta.lang import encode_text
from pasta.models import ModelConfig, encode_chat, load_model
from pasta.teachers.base import DIVERGED, TRUNCATED, Teacher, TeacherReply, TeacherRequest
from pasta.teachers.hf_config import HFTeacherConfig
from pasta.teachers.prompt import TeacherPrompt
from pasta.transformers_api import CACHE_ARGUMENT, output_cache

# Anything tag-shaped; what lies between tags must be text of the response.
_TAG = re.compile(r"<[^<>]*>")
_OPENING_FENCE = re.compile(r"\A\s*(`{3,}|~{3,})[\w+-]*[ \t]*\n")
_PARTIAL_FENCE = re.compile(r"\s*(`+|~+)[\w+-]*[ \t]*")
_CLOSING_FENCE = re.compile(r"\n[ \t]*(`+|~+)\s*\Z")


def _squash(text: str) -> str:
    return "".join(text.split())


def follows_response(answer: str, squashed_response: str) -> bool:
    """Whether a partial answer could still become an annotation of the response (whitespace aside).

    Every piece of text between tags must occur in the response. A half-written tag at the end and a code fence
    around the answer (which validation unwraps) are left out of the check.
    """
    if _PARTIAL_FENCE.fullmatch(answer):
        return True
    answer = _CLOSING_FENCE.sub("", _OPENING_FENCE.sub("", answer))
    unclosed = answer.rfind("<")
    if unclosed != -1 and ">" not in answer[unclosed:]:
        answer = answer[:unclosed]
    return all(_squash(piece) in squashed_response for piece in _TAG.split(answer))


class _DivergenceStop(StoppingCriteria):
    """Marks a row done once its answer no longer `follows_response` (generate then pads it)."""

    def __init__(self, tokenizer, prompt_length: int, responses: list[str]):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.squashed = [_squash(r) for r in responses]
        self.diverged = [False] * len(responses)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        for row, ids in enumerate(input_ids[:, self.prompt_length :].tolist()):  # [B, new]
            if not self.diverged[row]:
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                self.diverged[row] = not follows_response(text, self.squashed[row])
        return torch.tensor(self.diverged, device=input_ids.device)


def model_label(model_cfg: ModelConfig) -> str:
    """What to write as the teacher model: its folder, hub id or config name."""
    if model_cfg.random_init is not None:
        return model_cfg.name
    return model_cfg.path or model_cfg.hub_id or model_cfg.name


class HFTeacher(Teacher):
    name = "hf"

    def __init__(self, cfg: HFTeacherConfig, device: str = "auto"):
        import torch

        cfg.validate("teacher")  # a config built in code, not composed, is checked here
        self.cfg = cfg
        model_cfg = schema_from(cfg.model, ModelConfig, "model")
        self.model = model_label(model_cfg)
        self.prompt = TeacherPrompt.load(cfg.prompt)
        self._torch = torch
        # generate() with transformers' own masks: whatever its attention is, pasta does not mask it.
        self._lm, self._tokenizer = load_model(model_cfg, device=device, check=False, path_key="teacher.model.path")
        self._prefix: tuple[list[int], Any] | None = None

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        iterator = iter(requests)
        while batch := list(itertools.islice(iterator, self.cfg.batch_size)):
            yield from self._generate(batch)

    def _budget(self, response: str) -> int:
        num_tokens = len(encode_text(self._tokenizer, response))
        return math.ceil(num_tokens * self.cfg.max_new_tokens_factor) + self.cfg.max_new_tokens_extra

    def _prompt_ids(self, request: TeacherRequest) -> list[int]:
        # A record's text that spells a control token stays text (pasta.models.prompts).
        return encode_chat(self._tokenizer, self.prompt.messages(request.instruction, request.input, request.response))

    def _shared_prefix(self) -> tuple[list[int], Any]:
        """The system part's ids and their KV cache, computed once: every prompt starts with the same ~5K tokens."""
        if self._prefix is None:
            system = self.prompt.messages("", "", "")[:1]
            ids = encode_chat(self._tokenizer, system, add_generation_prompt=False)
            with self._torch.no_grad():
                cache = output_cache(self._lm(self._torch.tensor([ids], device=self._lm.device), use_cache=True))
            self._prefix = (ids, cache)
        return self._prefix

    def _inputs(self, batch: list[TeacherRequest]) -> tuple[dict[str, Any], int]:
        """generate() inputs for a batch and the prompt length; rows are [shared prefix, padding, own suffix]."""
        torch = self._torch
        pad_id = self._tokenizer.pad_token_id
        prompts = [self._prompt_ids(r) for r in batch]
        prefix_ids, cache = self._shared_prefix()
        if not all(ids[: len(prefix_ids)] == prefix_ids for ids in prompts):
            # A chat template that does not render the system turn on its own (e.g. one that folds it into the
            # user turn): no shared cache, plain left padding.
            longest = max(map(len, prompts))
            input_ids = [[pad_id] * (longest - len(ids)) + ids for ids in prompts]
            mask = [[0] * (longest - len(ids)) + [1] * len(ids) for ids in prompts]
            extra = {}
        else:
            # Padding sits between the cached prefix and each suffix; generate() derives position ids from the
            # mask, so every suffix continues right after the prefix.
            suffixes = [ids[len(prefix_ids) :] for ids in prompts]
            longest = max(map(len, suffixes))
            input_ids = [prefix_ids + [pad_id] * (longest - len(s)) + s for s in suffixes]
            mask = [[1] * len(prefix_ids) + [0] * (longest - len(s)) + [1] * len(s) for s in suffixes]
            batch_cache = copy.deepcopy(cache)  # generate() extends the cache in place
            batch_cache.batch_repeat_interleave(len(batch))
            extra = {CACHE_ARGUMENT: batch_cache}
        device = self._lm.device
        inputs = {
            "input_ids": torch.tensor(input_ids, device=device),  # [B, S]
            "attention_mask": torch.tensor(mask, device=device),  # [B, S]
            **extra,
        }
        return inputs, len(input_ids[0])

    def _generate(self, batch: list[TeacherRequest]) -> list[TeacherReply]:
        torch = self._torch
        tokenizer = self._tokenizer
        inputs, prompt_length = self._inputs(batch)
        budget = max(self._budget(r.response) for r in batch)
        watcher = None
        if self.cfg.stop_when_diverged:
            watcher = _DivergenceStop(tokenizer, prompt_length, [r.response for r in batch])
        with torch.no_grad():
            output = self._lm.generate(
                **inputs,
                max_new_tokens=budget,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                stopping_criteria=StoppingCriteriaList([watcher]) if watcher is not None else None,
            )  # [B, S + new]
        new_ids = output[:, prompt_length:].tolist()  # [B, new]
        replies = []
        for row, (request, ids) in enumerate(zip(batch, new_ids, strict=True)):
            finished = tokenizer.eos_token_id in ids
            if finished:
                ids = ids[: ids.index(tokenizer.eos_token_id)]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if watcher is not None and watcher.diverged[row]:
                reason = f"{DIVERGED}: stopped after {len(ids)} new tokens, the answer had left the response's text"
            elif not finished:
                reason = f"{TRUNCATED}: no end of answer within {budget} new tokens"
            else:
                reason = None
            replies.append(TeacherReply(request.id, text=text, reject_reason=reason))
        return replies
