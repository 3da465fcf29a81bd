"""The attention functions pasta installs in a model: the decoder's ragged attention, which unpacks a packed step
(pasta/decoding/packing.py), and the training layout's, which a model with a sliding window trains through.

Both are registered with transformers' AttentionInterface and installed with `model.set_attn_implementation` for
the duration of a decode or a training run (`ragged_attention`, `layout_attention`, restored afterwards), so the
model's own attention layers call them after their projections and RoPE, with what each layer passes: its
`sliding_window` (Gemma 2/3 and Qwen2/3 on their sliding layers, Mistral and Phi-3 on every layer, None or nothing
elsewhere) and its `softcap` (Gemma 2's attention logit soft-capping). transformers builds no mask for either.

The ragged attention. The step's forward sees every request's rows packed into one [1, N] block; the model's
layers compute queries, keys and values for those N rows, the cache writes each key and value into its own
request's cache row (pasta/decoding/cache.py), and `ragged_sdpa_attention` attends: for each `AttentionGroup` it
gathers the group's queries into [G, H, w, D], runs SDPA against the group's cache rows [G, H_kv, kv, D] with the
group's additive mask [G, 1, w, kv], and `RaggedAttention.output_index` puts every packed row's output back in
place, [1, N, H, D].

Two groups need no mask and no gathering, and take SDPA's plainest call, the one transformers' own `sdpa` attention
makes for `generate`: a request's prompt (causal from its first slot: `is_causal`), and a step whose one request
feeds one row that sees every slot (the sequential baseline's steps, and a PASTA answer's steps until it forks).
So the sequential baseline attends as `generate` does, and its greedy tokens stay `generate`'s.

Sliding windows and soft-capping, where a model has them (a model without either runs exactly the calls above):
- a layer that passes `sliding_window` attends with its group's `window_mask` where the step's packing built one
  (the window hides something there: some query sits at a position >= the window), the group's own mask (or none)
  where the window hides nothing. The window is the model's one `sliding_window` (`attention_window`), which the
  packing applied over positions (pasta/lang/mask.py); a layer passing another window raises;
- a layer that passes `softcap` attends through the math eager attention runs (`softcapped_attention`: scores
  scaled, tanh(s / cap) * cap, masked, softmax, values), since SDPA has no soft-capping.

The layout attention (`layout_sdpa_attention`) takes a training layout's 4-D additive mask (pasta/lang/layout.py)
and, on a layer that passes `sliding_window`, narrows it to the window over the batch's position ids (the same rule,
pasta/lang/mask.py), once per forward for every sliding layer; then SDPA, or the soft-capped math. `layout_attention`
installs it only on a model some layer of which slides: every other model trains through its own attention
(SDPA, or eager for Gemma 2, which applies its soft-capping), as before.

Grouped key/value heads go to SDPA as grouped (`enable_gqa`) on CPU, where transformers' repeat of every key/value
head would cost more than the attention itself, and on any device when a group has no mask; on CUDA a masked group
repeats them, since SDPA with a mask and `enable_gqa` falls back to its slowest kernel there.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from pasta.errors import PastaError
from pasta.lang import additive_mask, windowed_mask

RAGGED_NAME = "pasta_ragged"
LAYOUT_NAME = "pasta_layout"
SLIDING = "sliding_attention"


def attention_window(model) -> int | None:
    """The sliding window of `model`'s sliding layers (its config's `sliding_window`), or None when no layer slides.
    Families with per-layer types (Gemma 2/3, Qwen2/3) slide the layers typed sliding; those without (Mistral,
    Phi-3) slide every layer once a window is set (Qwen2's older configs say whether with use_sliding_window)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if SLIDING in layer_types else None
    return window if getattr(config, "use_sliding_window", True) else None


@dataclass(frozen=True)
class AttentionGroup:
    """Query rows that attend in one SDPA call: G requests, w query rows each, over the first `num_slots` slots.

    `query_index` [G, w] picks each query's packed row (a padding query picks any row: its output is never read);
    None = the packed rows themselves, in order (one group of G = 1 covering every row). `mask` [G, 1, w, kv] is
    additive (pasta/lang/mask.py; a padding query sees one slot: a query that sees nothing turns softmax into NaN);
    None = every row sees every slot, or with `causal` the causal order from slot 0 (a prompt). `cache_rows` names
    the G requests' cache rows: None = every cache row, as it lies (a view); an int = that row alone (a view); a
    tensor [G] = those rows, gathered (a copy). `window_mask` [G, 1, w, kv]: what the layers that slide attend
    with instead of `mask` and `causal` (those narrowed to the step's window); None = the window hides nothing
    here."""

    query_index: torch.Tensor | None
    mask: torch.Tensor | None
    num_slots: int
    cache_rows: torch.Tensor | int | None = None
    causal: bool = False
    window_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class RaggedAttention:
    """How a packed step's queries attend: the groups, and where each of the N packed rows finds its output in the
    groups' outputs, flattened ([G * w] each) and concatenated in group order (`output_index` [N]; None = they are
    the packed rows in order already). `window`: the sliding window the groups' window masks apply (the model's,
    `attention_window`; None when no layer slides)."""

    groups: list[AttentionGroup]
    output_index: torch.Tensor | None
    window: int | None = None


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


def softcapped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                         *, causal: bool, scaling: float | None, softcap: float, dropout: float = 0.0) -> torch.Tensor:
    """Attention with logit soft-capping, as transformers' eager attention computes it (SDPA has none): query
    [G, H, w, D], key/value [G, H, kv, D] (heads repeated), the additive `mask` [G, 1, w, kv] or None (`causal`: the
    causal order from slot 0, as SDPA's is_causal). Returns [G, H, w, D]."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale  # [G, H, w, kv]
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        order = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()  # [w, kv]
        mask = additive_mask(order, scores.dtype)
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout:
        weights = torch.nn.functional.dropout(weights, p=dropout)
    return torch.matmul(weights, value)


def ragged_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, ragged=None,
                          sliding_window=None, softcap=None, **kwargs):
    """transformers' attention-function signature over a packed step: query [1, H, N, D], key/value the cache rows
    [B, H_kv, kv, D] (pasta/decoding/cache.py); `ragged` (a RaggedAttention) says how the N rows attend, and the
    layer's own `sliding_window` and `softcap` which masks and which math (the module docstring). Returns
    [1, N, H, D]."""
    if ragged is None:
        raise ValueError(f"the {RAGGED_NAME} attention needs the step's `ragged` layout (pasta.decoding.packing)")
    if sliding_window is not None and sliding_window != ragged.window:
        raise ValueError(f"a layer slides with a window of {sliding_window} tokens, but the step was packed for "
                         f"{ragged.window}: the model's config.sliding_window is not what its layers pass")
    num_groups = getattr(module, "num_key_value_groups", 1)
    cpu = query.device.type == "cpu"
    outputs = []
    for group in ragged.groups:
        mask, causal = group.mask, group.causal
        if sliding_window is not None and group.window_mask is not None:
            mask, causal = group.window_mask, False
        if group.query_index is None:
            group_queries = query  # [1, H, N, D]
        else:
            group_queries = query[0].transpose(0, 1)[group.query_index].transpose(1, 2)  # [N, H, D] -> [G, H, w, D]
        group_keys, group_values = _group_key_values(key, value, group)  # [G, H_kv, kv, D]
        if softcap is not None:
            output = softcapped_attention(
                group_queries, _repeat_heads(group_keys, num_groups), _repeat_heads(group_values, num_groups), mask,
                causal=causal, scaling=scaling, softcap=softcap, dropout=dropout,
            )  # [G, H, w, D]
            outputs.append(output.transpose(1, 2))  # [G, w, H, D]
            continue
        grouped = num_groups > 1 and (cpu or mask is None)
        if not grouped:
            group_keys, group_values = _repeat_heads(group_keys, num_groups), _repeat_heads(group_values, num_groups)
        output = torch.nn.functional.scaled_dot_product_attention(
            group_queries, group_keys, group_values, attn_mask=mask, dropout_p=dropout, scale=scaling,
            is_causal=causal, enable_gqa=grouped,
        )  # [G, H, w, D]
        outputs.append(output.transpose(1, 2))  # [G, w, H, D]
    if ragged.output_index is None:
        return outputs[0].contiguous(), None  # [1, N, H, D]
    flat = [output.flatten(0, 1) for output in outputs]  # [G * w, H, D] each
    flat = flat[0] if len(flat) == 1 else torch.cat(flat)
    return flat.index_select(0, ragged.output_index).unsqueeze(0), None  # [1, N, H, D]


class _WindowedMasks:
    """The last layout mask narrowed to a window, kept while that mask and those positions live (the same objects,
    not equal ones): every sliding layer of one forward receives the same mask and position_ids, and so shares one
    narrowed mask (one [B, 1, S, S] tensor, which autograd keeps once rather than once per layer)."""

    def __init__(self):
        self._key: tuple[weakref.ref, weakref.ref, int] | None = None
        self._mask: torch.Tensor | None = None

    def get(self, mask: torch.Tensor, position_ids: torch.Tensor, window: int) -> torch.Tensor:
        key = self._key
        if key is None or key[0]() is not mask or key[1]() is not position_ids or key[2] != window:
            self._mask = windowed_mask(mask, position_ids.expand(mask.shape[0], -1), window)
            self._key = (weakref.ref(mask), weakref.ref(position_ids), window)
        return self._mask


_windowed_masks = _WindowedMasks()


def layout_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                          softcap=None, position_ids=None, **kwargs):
    """transformers' attention-function signature over a training layout: `attention_mask` the layout's additive
    mask [B, 1, S, S] (pasta/lang/layout.py), narrowed to the layer's `sliding_window` over `position_ids` [B, S];
    soft-capped where the layer passes `softcap`. Returns [B, S, H, D]."""
    if attention_mask is None or attention_mask.dim() != 4:
        raise ValueError(f"the {LAYOUT_NAME} attention takes a training layout's 4-D additive mask "
                         "(pasta.lang.collate_layouts)")
    if sliding_window is not None:
        if position_ids is None:
            raise ValueError(f"the {LAYOUT_NAME} attention needs the layout's position_ids on a sliding layer")
        attention_mask = _windowed_masks.get(attention_mask, position_ids, sliding_window)
    if softcap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    num_groups = getattr(module, "num_key_value_groups", 1)
    output = softcapped_attention(query, _repeat_heads(key, num_groups), _repeat_heads(value, num_groups),
                                  attention_mask, causal=False, scaling=scaling, softcap=softcap, dropout=dropout)
    return output.transpose(1, 2).contiguous(), None  # [B, S, H, D]


# No mask function: transformers then builds no mask (the groups carry theirs; a layout passes its 4-D mask, which
# transformers hands on as it is).
AttentionInterface.register(RAGGED_NAME, ragged_sdpa_attention)
AttentionInterface.register(LAYOUT_NAME, layout_sdpa_attention)


def _attention_owner(model):
    """The module that switches the attention implementation: the model, or the one it wraps (a test's wrapper
    shares its config with the wrapped model, which is what the attention layers read)."""
    if hasattr(model, "set_attn_implementation"):
        return model
    return next((m for m in model.modules() if hasattr(m, "set_attn_implementation")), None)


@contextmanager
def _attending_with(model, name: str) -> Iterator[None]:
    owner = _attention_owner(model)
    if owner is None:
        raise ValueError(f"the model has no set_attn_implementation: pasta cannot install its {name} attention")
    if any(isinstance(getattr(module, "sinks", None), torch.Tensor) for module in owner.modules()):
        # Learned attention sinks (gpt-oss and other sliding-window families) add a logit per head to every
        # softmax; pasta's attention functions compute none, so the model would decode silently wrong.
        raise PastaError(f"model_type {owner.config.model_type}: its attention layers have attention sinks, which "
                         f"pasta's {name} attention does not apply. Refused rather than run silently wrong")
    previous = owner.config._attn_implementation
    owner.set_attn_implementation(name)
    try:
        yield
    finally:
        owner.set_attn_implementation(previous)


@contextmanager
def ragged_attention(model) -> Iterator[None]:
    """Within the block the model attends with `ragged_sdpa_attention`: every forward must pass `ragged`."""
    with _attending_with(model, RAGGED_NAME):
        yield


@contextmanager
def layout_attention(*models) -> Iterator[None]:
    """Within the block each model some layer of which slides (`attention_window`) attends with
    `layout_sdpa_attention`, its forwards taking a training layout's mask and position_ids; the others (and None)
    are left as they are."""
    with ExitStack() as stack:
        for model in models:
            if model is not None and attention_window(model) is not None:
                stack.enter_context(_attending_with(model, LAYOUT_NAME))
        yield
