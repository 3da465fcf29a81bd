"""The attention functions the decoders install while they decode: grouped-query SDPA for batched steps, and the
ragged attention that unpacks a packed step (pasta/decoding/packing.py).

Both are registered with transformers' AttentionInterface and installed with `model.set_attn_implementation` for
the duration of a decode (restored afterwards), so the model's own attention layers call them after their
projections and RoPE.

- `pasta_sdpa_gqa` (`grouped_query_sdpa`): transformers' `sdpa` attention copies every key/value head
  `num_heads / num_kv_heads` times (`repeat_kv`) when a step has several query rows and a mask, which is every
  asynchronous step with more than one live thread; the copy grows with the cache and, on CPU, costs more than the
  attention itself. PyTorch's SDPA takes grouped heads directly (`enable_gqa=True`) and gives the same numbers, so
  on CPU a batched decode step (the sequential decoder's) runs this function instead. On CUDA transformers' choice
  stays: there, SDPA with a mask and `enable_gqa` falls back to its slowest kernel.
- `pasta_ragged` (`ragged_attention`): the step runner's forward sees every request's rows packed into one
  [1, N] block; the model's layers compute queries, keys and values for those N rows, the cache writes each key and
  value into its own request's cache row (pasta/decoding/cache.py), and this function attends: for each
  `AttentionGroup` it gathers the group's queries into [G, H, w, D], runs SDPA against the group's cache rows
  [G, H_kv, kv, D] with the group's additive mask [G, 1, w, kv], and `RaggedAttention.output_index` puts every
  packed row's output back in place, [1, N, H, D]. It is installed on every device and for every model the runner
  decodes (it is what unpacks the step); grouped heads go to SDPA as grouped on CPU and repeated on CUDA, as above.
  transformers builds no mask for it (the groups carry theirs).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "pasta_sdpa_gqa"
RAGGED_NAME = "pasta_ragged"


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


@dataclass(frozen=True)
class AttentionGroup:
    """Query rows that attend in one SDPA call: G requests, w query rows each.

    `query_index` [G, w] picks each query's packed row (a padding query picks any row: its output is never read);
    `mask` [G, 1, w, kv] is additive over the first kv slots (a padding query sees one slot: a query that sees
    nothing turns softmax into NaN); `cache_rows` names the G requests' cache rows: None = every cache row, as it
    lies (a view); an int = that row alone (a view); a tensor [G] = those rows, gathered (a copy)."""

    query_index: torch.Tensor
    mask: torch.Tensor
    cache_rows: torch.Tensor | int | None = None


@dataclass(frozen=True)
class RaggedAttention:
    """How a packed step's queries attend: the groups, and where each of the N packed rows finds its output in the
    groups' outputs, flattened ([G * w] each) and concatenated in group order (`output_index` [N])."""

    groups: list[AttentionGroup]
    output_index: torch.Tensor


def _group_key_values(key: torch.Tensor, value: torch.Tensor, group: AttentionGroup):
    """The group's cache rows, over the slots its mask covers: [G, H_kv, kv, D] each."""
    num_slots = group.mask.shape[-1]
    rows = group.cache_rows
    if rows is None:
        return key[:, :, :num_slots], value[:, :, :num_slots]
    if isinstance(rows, int):
        return key[rows : rows + 1, :, :num_slots], value[rows : rows + 1, :, :num_slots]
    return key.index_select(0, rows)[:, :, :num_slots], value.index_select(0, rows)[:, :, :num_slots]


def _repeat_heads(states: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[G, H_kv, kv, D] -> [G, H_kv * num_groups, kv, D], each head repeated in place (transformers' repeat_kv)."""
    if num_groups == 1:
        return states
    rows, heads, slots, size = states.shape
    return states[:, :, None].expand(rows, heads, num_groups, slots, size).reshape(rows, heads * num_groups, slots, size)


def ragged_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, ragged=None,
                          **kwargs):
    """transformers' attention-function signature over a packed step: query [1, H, N, D], key/value the cache rows
    [B, H_kv, kv, D] (pasta/decoding/cache.py); `ragged` (a RaggedAttention) says how the N rows attend. Returns
    [1, N, H, D]."""
    if ragged is None:
        raise ValueError(f"the {RAGGED_NAME} attention needs the step's `ragged` layout (pasta.decoding.packing)")
    num_groups = getattr(module, "num_key_value_groups", 1)
    grouped = query.device.type == "cpu" and num_groups > 1  # SDPA's own grouped heads pay on CPU only (above)
    queries = query[0].transpose(0, 1)  # [N, H, D]
    outputs = []
    for group in ragged.groups:
        group_queries = queries[group.query_index].transpose(1, 2)  # [G, H, w, D]
        group_keys, group_values = _group_key_values(key, value, group)  # [G, H_kv, kv, D]
        if not grouped:
            group_keys, group_values = _repeat_heads(group_keys, num_groups), _repeat_heads(group_values, num_groups)
        output = torch.nn.functional.scaled_dot_product_attention(
            group_queries, group_keys, group_values, attn_mask=group.mask, dropout_p=dropout, scale=scaling,
            enable_gqa=grouped,
        )  # [G, H, w, D]
        outputs.append(output.transpose(1, 2).flatten(0, 1))  # [G * w, H, D]
    flat = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return flat.index_select(0, ragged.output_index).unsqueeze(0), None  # [1, N, H, D]


AttentionInterface.register(NAME, sdpa_grouped_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
# No mask function for the ragged one: transformers then builds no mask (the groups carry theirs).
AttentionInterface.register(RAGGED_NAME, ragged_sdpa_attention)


def _attention_owner(model):
    """The module that switches the attention implementation: the model, or the one it wraps (a test's wrapper
    shares its config with the wrapped model, which is what the attention layers read)."""
    if hasattr(model, "set_attn_implementation"):
        return model
    return next((m for m in model.modules() if hasattr(m, "set_attn_implementation")), None)


def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def _uses_grouped_query_sdpa(model) -> bool:
    config = _text_config(model)
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
def _attention_implementation(owner, name: str) -> Iterator[None]:
    previous = owner.config._attn_implementation
    owner.set_attn_implementation(name)
    try:
        yield
    finally:
        owner.set_attn_implementation(previous)


@contextmanager
def grouped_query_sdpa(model) -> Iterator[None]:
    """Within the block, a CPU sdpa model with grouped key/value heads uses `sdpa_grouped_attention`."""
    if not _uses_grouped_query_sdpa(model):
        yield
        return
    with _attention_implementation(model, NAME):
        yield


@contextmanager
def ragged_attention(model) -> Iterator[None]:
    """Within the block the model attends with `ragged_sdpa_attention`: every forward must pass `ragged`."""
    owner = _attention_owner(model)
    if owner is None:
        raise ValueError("the model has no set_attn_implementation: the step runner cannot install its attention")
    with _attention_implementation(owner, RAGGED_NAME):
        yield
