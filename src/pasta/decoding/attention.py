"""Grouped-query attention inside SDPA's kernel while the asynchronous decoder runs on CPU.

transformers' `sdpa` attention copies every key/value head `num_heads / num_kv_heads` times (`repeat_kv`) when a
step has several query rows and a mask, which is every asynchronous step with more than one live thread; the
copy grows with the cache and, on CPU, costs more than the attention itself. PyTorch's SDPA takes grouped heads
directly (`enable_gqa=True`) and gives the same numbers, so while decoding on CPU the model runs this registered
attention function instead (`model.set_attn_implementation`, restored afterwards). On CUDA transformers' choice
stays: there, SDPA with a mask and `enable_gqa` falls back to its slowest kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "pasta_sdpa_gqa"


def sdpa_grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """transformers' attention-function signature: query [B, H, q, D], key/value [B, H_kv, kv, D]."""
    is_causal = attention_mask is None and query.shape[2] > 1 and (is_causal if is_causal is not None else True)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        # From the module, not from the shapes: under torch.compile(dynamic=True) a shape comparison is symbolic.
        enable_gqa=getattr(module, "num_key_value_groups", 1) > 1,
    )  # [B, H, q, D]
    return output.transpose(1, 2).contiguous(), None  # [B, q, H, D]


AttentionInterface.register(NAME, sdpa_grouped_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def _uses_grouped_query_sdpa(model) -> bool:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    num_heads = getattr(config, "num_attention_heads", None)
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    return (
        model.device.type == "cpu"
        and getattr(model.config, "_attn_implementation", None) == "sdpa"
        and num_heads is not None
        and num_kv_heads < num_heads
        and hasattr(model, "set_attn_implementation")
    )


@contextmanager
def grouped_query_sdpa(model) -> Iterator[None]:
    """Within the block, a CPU sdpa model with grouped key/value heads uses `sdpa_grouped_attention`."""
    if not _uses_grouped_query_sdpa(model):
        yield
        return
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
