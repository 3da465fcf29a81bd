"""The one additive attention mask: a bool visibility table in, the float mask attention adds to its scores out; and
the one sliding-window rule, which narrows that table on the layers that slide.

Training's layout (pasta/lang/layout.py) and the decoder's packed steps (pasta/decoding/packing.py) both say what
each row sees as a bool table and turn it into the mask here, so both attend through the same numbers. The mask is
additive and float, not bool: a bool mask takes another path through eager attention, and `finfo(dtype).min`
rather than -inf keeps a fully hidden row finite (every caller still gives each row at least one visible column: a
row that sees nothing turns softmax into NaN).

A sliding window is a rule over positions, not over rows or cache slots: on a layer that slides with window W, a
query at position q keeps a key it sees at position k only while q - k < W. That is transformers' own rule
(`sliding_window_overlay`: kv_idx > q_idx - W) read over position ids, so on a plain sequence (positions 0, 1, ...)
it is exactly the mask `generate` applies; in a PASTA layout it is the mask the model would apply to each thread's
own view (a chunk's view is a plain sequence), and the positions a promise reserves count as tokens: they only shrink
what a main-thread token sees after a fork. The window cuts from below only: a key at a later position than its
query (an overrunning chunk's, seen after its join) stays as visibility says. Training (the layout attention) and
the decoder (packing.py) both narrow with `within_window`, so they keep agreeing.
"""

from __future__ import annotations

import torch


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `visible` is True, `finfo(dtype).min` elsewhere; same shape and device as `visible`."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def within_window(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """Whether a layer sliding with `window` lets each query keep each key: query_positions [..., q] and
    key_positions [..., k] in, bool [..., q, k] out (q - k < window)."""
    return (query_positions[..., :, None] - key_positions[..., None, :]) < window


def windowed_mask(mask: torch.Tensor, position_ids: torch.Tensor, window: int) -> torch.Tensor:
    """An additive mask [B, 1, S, S] over rows with these position_ids [B, S], narrowed to `window`: every key
    outside a query's window hidden (a row always keeps itself, so no row is left seeing nothing)."""
    outside = ~within_window(position_ids, position_ids, window)  # [B, S, S]
    return mask.masked_fill(outside[:, None], torch.finfo(mask.dtype).min)
