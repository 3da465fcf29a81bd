"""What a packed step's attention group lets each query row see, read back from the group (tests compare it with
the training layout and with the interpreter's tables)."""

from __future__ import annotations

import torch

from pasta.decoding.attention import AttentionGroup


def group_visible(group: AttentionGroup, num_rows: int, *, sliding: bool = False) -> torch.Tensor:
    """[w, kv] bool for a group of one request, as a layer attends with it (`sliding`: one that slides, which takes
    the group's window mask where it has one): its mask's visible slots, or, without a mask, every slot (one row)
    or the causal order from slot 0 (a prompt)."""
    if sliding and group.window_mask is not None:
        return group.window_mask[0, 0] == 0
    if group.mask is not None:
        return group.mask[0, 0] == 0
    if group.causal:
        return torch.ones(num_rows, group.num_slots, dtype=torch.bool).tril()
    assert num_rows == 1, "a group without a mask or the causal order feeds one row"
    return torch.ones(1, group.num_slots, dtype=torch.bool)
