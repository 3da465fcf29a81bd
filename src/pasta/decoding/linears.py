"""Linear layers of CPU decoding steps, computed as one matrix product over every thread.

PyTorch's float32 `F.linear(x, W)` on CPU hands MKL `x @ W^T`. For one row that is a matrix-vector product, and
for fewer than about four rows MKL computes one matrix-vector product per row; on the development machine (AMD
EPYC, 2 torch threads, MKL 2024.2) those run on a single thread, and one thread cannot stream a model's weights
from memory as fast as two. So a one-row decoding step is slow, and a step that feeds q rows costs about q times
as much. The same numbers, up to float rounding, come from `W @ x^T`, a tall matrix product that MKL splits over
every thread; a single row is given a copy of itself, since one column would be a matrix-vector product again.

One forward of the embedded SmolLM2-135M that appends q rows to a 256-token cache took 39.5 / 61.0 / 76.1 / 57.7 /
56.1 ms with F.linear and 25.7 / 24.2 / 29.4 / 25.6 / 46.9 ms with this form, for q = 1, 2, 3, 4, 8
(`scripts/bench_decode.py` prints both curves). Timing one layer alone says much less: its weights then sit in
the cache, and the lm_head (113 MB) is the only layer where the form wins by itself (7.2 against 2.9 ms for one
row). Above MAX_ROWS rows the form stops paying (it was slower at 10-14 rows), so those steps, like the prompt's
prefill, stay on F.linear: both decoders enter this block only after the prefill, so the prompt's cache is
computed as `generate` computes it.

Both decoders use it, so the sequential baseline every speedup is measured against is as fast as this machine
allows (about 1.5x `generate` here). It is CPU only, and off with a single torch thread. Its rounding differs from
F.linear's, so a near-tie in the logits could in principle change a greedy token against `generate`;
`DecodeConfig.cpu_multirow_linears=false` keeps transformers' own kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

MAX_ROWS = 8


def multirow_linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` as `(W @ x^T)^T` for up to MAX_ROWS rows; F.linear beyond."""
    num_rows = x.numel() // x.shape[-1]
    if num_rows > MAX_ROWS:
        return torch.nn.functional.linear(x, self.weight, self.bias)
    rows = x.reshape(num_rows, -1)  # [n, in]
    if num_rows == 1:
        rows = rows.repeat(2, 1)  # [2, in]: two columns keep MKL on its threaded matrix product
    # The copy to a contiguous [n, out] is cheap next to the product and keeps the next layers' inputs fast.
    out = torch.mm(self.weight, rows.T)[:, :num_rows].T.contiguous()  # [n, out]
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _swappable(model) -> list[torch.nn.Linear]:
    if model.device.type != "cpu" or torch.get_num_threads() < 2:
        return []
    # Exactly nn.Linear: subclasses (quantized layers) have forwards of their own. A layer whose forward is
    # already replaced (a nested block) is left to its owner.
    return [
        m for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32 and "forward" not in m.__dict__
    ]


@contextmanager
def multirow_linears(model, enabled: bool = True) -> Iterator[None]:
    """Within the block, the model's float32 nn.Linear layers on CPU use `multirow_linear_forward`."""
    layers = _swappable(model) if enabled else []
    for layer in layers:
        layer.forward = multirow_linear_forward.__get__(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
