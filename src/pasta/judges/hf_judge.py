"""A local transformers model as judge (offline default: the embedded SmolLM2-135M-Instruct).

It never samples text, so it never fails to parse: each prompt ends with a short answer prefix ("Rating: "), one
forward pass gives the next-token distribution, and the judgement is read from the probabilities of the allowed
answer tokens there. `score` is the expected rating under the softmax over "1".."max_rating" mapped to [0, 1];
`compare` is the softmax over "1"/"2", asked in both orders and averaged, so that
compare(a vs b) + compare(b vs a) = 1 exactly and the model's position bias cancels. A 135M model is a weak judge;
expect its numbers to say little beyond a length or format preference.
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from pasta.errors import PastaError
from pasta.judges.base import JudgeItem, rating_to_unit
from pasta.judges.hf_config import HFJudgeConfig
from pasta.judges.prompts import (
    COMPARE_FIELDS,
    NO_REFERENCE,
    SCORE_FIELDS,
    ChatPrompt,
    load_prompt,
)
from pasta.models import encode_chat


class HFJudge:
    def __init__(self, config: HFJudgeConfig, model: Any, tokenizer: Any, model_name: str):
        config.validate("judge")  # a config built in code, not composed, is checked here
        self.config = config
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = f"hf:{model_name}"
        self._score_prompt = load_prompt(config.score_prompt, SCORE_FIELDS)
        self._compare_prompt = load_prompt(config.compare_prompt, COMPARE_FIELDS)
        self._rating_token_ids = self._answer_token_ids(
            config.score_prefix, config.max_rating
        )  # [max_rating]
        self._choice_token_ids = self._answer_token_ids(config.compare_prefix, 2)  # [2]
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )

    def _answer_token_ids(self, prefix: str, num_digits: int) -> list[int]:
        """The token that follows `prefix` for each digit 1..num_digits; the prefix's own tokens must not change."""
        prefix_ids = self.tokenizer.encode(prefix, add_special_tokens=False)
        token_ids = []
        for digit in range(1, num_digits + 1):
            ids = self.tokenizer.encode(prefix + str(digit), add_special_tokens=False)
            if ids[: len(prefix_ids)] != prefix_ids or len(ids) != len(prefix_ids) + 1:
                raise PastaError(
                    f"with this tokenizer the digit {digit} is not one token after the prefix {prefix!r}: "
                    "change judge.score_prefix / judge.compare_prefix"
                )
            token_ids.append(ids[-1])
        return token_ids

    def score(self, items: list[JudgeItem]) -> list[float | None]:
        prompts = [
            self._prompt_ids(
                self._score_prompt,
                self.config.score_prefix,
                instruction=item.instruction,
                candidate=self._cut(item.candidate),
                reference=NO_REFERENCE if item.reference is None else self._cut(item.reference),
                max_rating=str(self.config.max_rating),
            )
            for item in items
        ]
        probs = self._answer_probabilities(prompts, self._rating_token_ids, "judge score")  # [N, max_rating]
        ratings = torch.arange(1, self.config.max_rating + 1, dtype=probs.dtype)  # [max_rating]
        expected = (probs * ratings).sum(dim=-1)  # [N]
        return [rating_to_unit(float(r), self.config.max_rating) for r in expected]

    def compare(self, items: list[JudgeItem]) -> list[float | None]:
        if any(item.reference is None for item in items):
            raise PastaError("compare needs a reference answer for every item")
        prompts = []
        for item in items:
            candidate, reference = self._cut(item.candidate), self._cut(item.reference)
            for first, second in ((candidate, reference), (reference, candidate)):
                prompts.append(
                    self._prompt_ids(
                        self._compare_prompt,
                        self.config.compare_prefix,
                        instruction=item.instruction,
                        answer_1=first,
                        answer_2=second,
                    )
                )
        probs = self._answer_probabilities(prompts, self._choice_token_ids, "judge compare")  # [2N, 2]
        candidate_first = probs[0::2, 0]  # [N] P("1") with the candidate shown first
        candidate_second = probs[1::2, 1]  # [N] P("2") with the candidate shown second
        return [float(p) for p in (candidate_first + candidate_second) / 2]

    def _cut(self, text: str) -> str:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.config.max_answer_tokens:
            return text
        return self.tokenizer.decode(ids[: self.config.max_answer_tokens]) + " [...]"

    def _prompt_ids(self, prompt: ChatPrompt, prefix: str, **values: str) -> list[int]:
        # The prefix is tokenized on its own so that its last token is the one _answer_token_ids measured against.
        # An instruction or answer that spells a control token stays text (pasta.models.prompts).
        return encode_chat(self.tokenizer, prompt.messages(**values)) + self.tokenizer.encode(
            prefix, add_special_tokens=False
        )

    @torch.no_grad()
    def _answer_probabilities(
        self, prompts: list[list[int]], answer_ids: list[int], desc: str
    ) -> torch.Tensor:
        """Softmax over `answer_ids` of the next token after each prompt: [len(prompts), len(answer_ids)]."""
        probs = torch.zeros(len(prompts), len(answer_ids))
        device = next(self.model.parameters()).device
        # Similar lengths share a batch, so little compute goes to padding.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        batches = [
            order[i : i + self.config.batch_size] for i in range(0, len(order), self.config.batch_size)
        ]
        for batch in tqdm(batches, desc=desc, disable=not self.config.progress or len(batches) < 2):
            width = max(len(prompts[i]) for i in batch)
            input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)  # [B, S]
            attention_mask = torch.zeros(len(batch), width, dtype=torch.long)  # [B, S]
            for row, i in enumerate(batch):  # left padding: every row's last position is its real last token
                input_ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                attention_mask[row, width - len(prompts[i]) :] = 1
            # A plain forward numbers positions 0..S-1 regardless of padding; count real tokens instead.
            position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, S]
            logits = self.model(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device),
                logits_to_keep=1,
            ).logits[:, -1, :]  # [B, V]
            answer_logits = logits[:, answer_ids].float()  # [B, A]
            probs[batch] = torch.softmax(answer_logits, dim=-1).cpu()
        return probs
