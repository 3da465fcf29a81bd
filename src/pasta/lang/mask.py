"""The one additive attention mask: a bool visibility table in, the float mask attention adds to its scores out.

Training's layout (pasta/lang/layout.py) and the decoder's packed steps (pasta/decoding/packing.py) both say what
each row sees as a bool table and turn it into the mask here, so both attend through the same numbers. The mask is
additive and float, not bool: a bool mask takes another path through eager attention, and `finfo(dtype).min`
rather than -inf keeps a fully hidden row finite (every caller still gives each row at least one visible column: a
row that sees nothing turns softmax into NaN).

A restriction that depends on the layer (a sliding window, say) belongs here too, as one more bool factor on
`visible` before the conversion, so that training and decoding keep agreeing.
"""

from __future__ import annotations

import torch


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `visible` is True, `finfo(dtype).min` elsewhere; same shape and device as `visible`."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)
