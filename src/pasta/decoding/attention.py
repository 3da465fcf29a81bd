"""The attention the decoder installs while it steps: the ragged attention that unpacks a packed step
(pasta/decoding/packing.py).

It is registered with transformers' AttentionInterface and installed with `model.set_attn_implementation` for the
duration of a decode (`ragged_attention`, restored afterwards), so the model's own attention layers call it after
their projections and RoPE. The step's forward sees every request's rows packed into one [1, N] block; the model's
layers compute queries, keys and values for those N rows, the cache writes each key and value into its own
request's cache row (pasta/decoding/cache.py), and `ragged_sdpa_attention` attends: for each `AttentionGroup` it
gathers the group's queries into [G, H, w, D], runs SDPA against the group's cache rows [G, H_kv, kv, D] with the
group's additive mask [G, 1, w, kv], and `RaggedAttention.output_index` puts every packed row's output back in
place, [1, N, H, D]. transformers builds no mask for it (the groups carry theirs).

Two groups need no mask and no gathering, and take SDPA's plainest call, the one transformers' own `sdpa` attention
makes for `generate`: a request's prompt (causal from its first slot: `is_causal`), and a step whose one request
feeds one row that sees every slot (the sequential baseline's steps, and a PASTA answer's steps until it forks).
So the sequential baseline attends as `generate` does, and its greedy tokens stay `generate`'s.

Grouped key/value heads go to SDPA as grouped (`enable_gqa`) on CPU, where transformers' repeat of every key/value
head would cost more than the attention itself, and on any device when a group has no mask; on CUDA a masked group
repeats them, since SDPA with a mask and `enable_gqa` falls back to its slowest kernel there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

RAGGED_NAME = "pasta_ragged"


@dataclass(frozen=True)
class AttentionGroup:
    """Query rows that attend in one SDPA call: G requests, w query rows each, over the first `num_slots` slots.

    `query_index` [G, w] picks each query's packed row (a padding query picks any row: its output is never read);
    None = the packed rows themselves, in order (one group of G = 1 covering every row). `mask` [G, 1, w, kv] is
    additive (pasta/lang/mask.py; a padding query sees one slot: a query that sees nothing turns softmax into NaN);
    None = every row sees every slot, or with `causal` the causal order from slot 0 (a prompt). `cache_rows` names
    the G requests' cache rows: None = every cache row, as it lies (a view); an int = that row alone (a view); a
    tensor [G] = those rows, gathered (a copy)."""

    query_index: torch.Tensor | None
    mask: torch.Tensor | None
    num_slots: int
    cache_rows: torch.Tensor | int | None = None
    causal: bool = False


@dataclass(frozen=True)
class RaggedAttention:
    """How a packed step's queries attend: the groups, and where each of the N packed rows finds its output in the
    groups' outputs, flattened ([G * w] each) and concatenated in group order (`output_index` [N]; None = they are
    the packed rows in order already)."""

    groups: list[AttentionGroup]
    output_index: torch.Tensor | None


def _group_key_values(key: torch.Tensor, value: torch.Tensor, group: AttentionGroup):
    """The group's cache rows, over the slots it attends: [G, H_kv, kv, D] each."""
    num_slots = group.num_slots
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
    cpu = query.device.type == "cpu"
    outputs = []
    for group in ragged.groups:
        if group.query_index is None:
            group_queries = query  # [1, H, N, D]
        else:
            group_queries = query[0].transpose(0, 1)[group.query_index].transpose(1, 2)  # [N, H, D] -> [G, H, w, D]
        group_keys, group_values = _group_key_values(key, value, group)  # [G, H_kv, kv, D]
        grouped = num_groups > 1 and (cpu or group.mask is None)
        if not grouped:
            group_keys, group_values = _repeat_heads(group_keys, num_groups), _repeat_heads(group_values, num_groups)
        output = torch.nn.functional.scaled_dot_product_attention(
            group_queries, group_keys, group_values, attn_mask=group.mask, dropout_p=dropout, scale=scaling,
            is_causal=group.causal, enable_gqa=grouped,
        )  # [G, H, w, D]
        outputs.append(output.transpose(1, 2))  # [G, w, H, D]
    if ragged.output_index is None:
        return outputs[0].contiguous(), None  # [1, N, H, D]
    flat = [output.flatten(0, 1) for output in outputs]  # [G * w, H, D] each
    flat = flat[0] if len(flat) == 1 else torch.cat(flat)
    return flat.index_select(0, ragged.output_index).unsqueeze(0), None  # [1, N, H, D]


# No mask function: transformers then builds no mask (the groups carry theirs).
AttentionInterface.register(RAGGED_NAME, ragged_sdpa_attention)


def _attention_owner(model):
    """The module that switches the attention implementation: the model, or the one it wraps (a test's wrapper
    shares its config with the wrapped model, which is what the attention layers read)."""
    if hasattr(model, "set_attn_implementation"):
        return model
    return next((m for m in model.modules() if hasattr(m, "set_attn_implementation")), None)


@contextmanager
def ragged_attention(model) -> Iterator[None]:
    """Within the block the model attends with `ragged_sdpa_attention`: every forward must pass `ragged`."""
    owner = _attention_owner(model)
    if owner is None:
        raise ValueError("the model has no set_attn_implementation: the step runner cannot install its attention")
    previous = owner.config._attn_implementation
    owner.set_attn_implementation(RAGGED_NAME)
    try:
        yield
    finally:
        owner.set_attn_implementation(previous)
