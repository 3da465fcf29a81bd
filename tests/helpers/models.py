"""Tiny models for decoding and serving tests: a random Llama whose greedy output varies, and a scripted wrapper."""

from __future__ import annotations

import copy
import time

import torch

from pasta.lang import add_tag_tokens
from pasta.models import build_tiny_model


def lively_model(tokenizer):
    """A tiny Llama whose greedy output varies (tests/test_decoding.py's `lively`), with the tag tokens."""
    tokenizer = copy.deepcopy(tokenizer)
    model = build_tiny_model(tokenizer)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() >= 2 and "embed" not in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    add_tag_tokens(tokenizer, model)
    return model.eval(), tokenizer


class Scripted(torch.nn.Module):
    """A model whose next token after each `transitions` key is that key's value (a large logit bias); each
    forward takes at least `delay_s` (a request that stays running while a test looks at it)."""

    def __init__(self, model, transitions: dict[int, int], delay_s: float = 0.0):
        super().__init__()
        self.model, self.transitions, self.delay_s = model, transitions, delay_s
        self.config, self.generation_config = model.config, model.generation_config

    @property
    def device(self):
        return self.model.device

    @property
    def dtype(self):
        return self.model.dtype

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def forward(self, input_ids, logits_to_keep=0, **kwargs):
        time.sleep(self.delay_s)
        out = self.model(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        for row, token_id in enumerate(input_ids[logits_to_keep].tolist()):
            if token_id in self.transitions:
                out.logits[row, self.transitions[token_id]] += 1e4
        return out
