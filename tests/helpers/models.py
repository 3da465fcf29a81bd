"""Tiny models for decoding and serving tests: a random Llama whose greedy output varies (`lively_model`), twins of
the other families alike (`lively_twin`), and wrappers that steer a real model's logits while its forward still
runs through the decoder's cache."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch

from pasta.lang import add_tag_tokens, encode_text
from pasta.models import build_tiny_model
from pasta.models.tiny import scale_weights


def cut_checkpoint(model, tokenizer, folder: Path, size: int) -> Path:
    """`model` saved into `folder` with its model.safetensors cut to its first `size` bytes: a copy, download or
    save that stopped early."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    os.truncate(folder / "model.safetensors", size)
    return folder


def lively_model(tokenizer):
    """A private tiny Llama with larger random weights, whose greedy output varies, with the tag tokens added.

    Every weight comes from seeded generators: the tag rows that `add_tag_tokens` appends are drawn from the
    global RNG, which is seeded here too, so the model is the same whatever ran before it in the session."""
    tokenizer = copy.deepcopy(tokenizer)
    model = build_tiny_model(tokenizer)
    scale_weights(model, 0.3, seed=0, gains=False)  # the matrices only, as the tests were written against
    return _with_tag_tokens(model, tokenizer)


def looping_model(tokenizer, trigger_id: int):
    """`lively_model` scripted to loop on three words once it sees `trigger_id` (" red green blue red green ..."), the
    way a small model loops until its budget: (model, tokenizer, the loop's three ids)."""
    model, tokenizer = lively_model(tokenizer)
    loop = tuple(encode_text(tokenizer, word)[0] for word in (" red", " green", " blue"))
    red, green, blue = loop
    return Scripted(model, {trigger_id: red, red: green, green: blue, blue: red}), tokenizer, loop


def lively_twin(tokenizer, family: str):
    """A private tiny twin of `family` (pasta.models.tiny.FAMILIES) whose greedy output varies, with the tag tokens
    added, seeded as `lively_model` is."""
    tokenizer = copy.deepcopy(tokenizer)
    return _with_tag_tokens(build_tiny_model(tokenizer, family=family, weight_std=0.3), tokenizer)


def _with_tag_tokens(model, tokenizer):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        add_tag_tokens(tokenizer, model)
    return model.eval(), tokenizer


class WrappedModel(torch.nn.Module):
    """What the decoders read of a model (config, device, dtype, embeddings), passed through to `model`."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.generation_config = model.generation_config

    @property
    def device(self):
        return self.model.device

    @property
    def dtype(self):
        return self.model.dtype

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()


class Scripted(WrappedModel):
    """A model whose next token after each `transitions` key is that key's value (a large logit bias), so that a
    random model writes PASTA-LANG where a test needs it; each forward takes at least `delay_s` (a request that
    stays running while a test looks at it). The bias is tensor arithmetic, so the decoders' compiled step
    (decode.compile) compiles this forward too."""

    def __init__(self, model, transitions: dict[int, int | tuple[int, ...]], delay_s: float = 0.0):
        super().__init__(model)
        self.transitions, self.delay_s = transitions, delay_s  # tests may extend the transitions later

    def forward(self, input_ids, logits_to_keep=0, **kwargs):
        if self.delay_s:
            time.sleep(self.delay_s)
        out = self.model(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        logits = out.logits  # [N, V] (the decoders' prefill: its kept rows) or [B, q, V]
        if isinstance(logits_to_keep, torch.Tensor):
            fed_ids = input_ids[logits_to_keep]  # [N]
        else:  # generate keeps the last row (logits_to_keep=1); the decoders' decode steps keep every row
            fed_ids = input_ids[:, -logits.shape[1] :]  # [B, q]
        # A tuple ranks its targets: the second is the choice where the constrained decoder masks the first.
        edges = [(source, target, 1e4 - rank) for source, targets in self.transitions.items()
                 for rank, target in enumerate(targets if isinstance(targets, tuple) else (targets,))]
        sources = torch.tensor([e[0] for e in edges], device=input_ids.device)  # [T]
        targets = torch.tensor([e[1] for e in edges], device=input_ids.device)  # [T]
        biases = torch.tensor([e[2] for e in edges], device=input_ids.device, dtype=logits.dtype)  # [T]
        hits = (fed_ids[..., None] == sources).to(logits.dtype) * biases  # [..., T]
        logits += hits @ torch.nn.functional.one_hot(targets, logits.shape[-1]).to(logits.dtype)
        return out


class RandomLogits(WrappedModel):
    """The wrapped model's forward, with its logits replaced by N(0, 1) noise plus `boost` on `boosted_ids`."""

    def __init__(self, model, boosted_ids: list[int], boost: float, seed: int):
        super().__init__(model)
        self.boosted_ids = boosted_ids
        self.boost = boost
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        noise = torch.randn(out.logits.shape, generator=self.generator)
        noise[..., self.boosted_ids] += self.boost
        out.logits.copy_(noise)
        return out
