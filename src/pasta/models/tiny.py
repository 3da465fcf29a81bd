"""A small randomly initialised Llama built from a config: the model that heavy tests and smoke runs use.

It shares the real tokenizer (and so the vocabulary, special tokens and chat template) of the embedded model, so
every code path that tokenises runs as it would for a real model; only the weights are random.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A float32 LlamaForCausalLM with random weights drawn from `seed` (the global RNG is left untouched)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        attn_implementation=attn_implementation,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float()
