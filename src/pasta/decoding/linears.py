"""Linear layers of CPU decoding steps, computed as one matrix product over every thread.

PyTorch's float32 `F.linear(x, W)` on CPU hands MKL `x @ W^T`. For one row that is a matrix-vector product, and
for a few rows MKL computes one matrix-vector product per row, on a single thread; one thread cannot stream a
model's weights from memory as fast as several. So a one-row decoding step is slower than the machine allows, and
a step of q rows costs about q times as much. The same numbers, up to float rounding, come from `W @ x^T`, a tall
matrix product that MKL splits over every thread; a single row is given a copy of itself, since one column would
be a matrix-vector product again. Above MAX_ROWS rows the form stops paying, so larger steps stay on F.linear.
docs/results/benchmarks.md has the measured curves of both forms (`scripts/bench_decode.py` prints them).

The step loop (pasta/decoding/runner.py) runs every step that feeds no prompt through this form and every step that
feeds one through transformers' own F.linear, so a prompt's cache is computed as `generate` computes it, and the
sequential baseline every speedup is measured against is as fast as the machine allows. It is CPU only, and off
with a single torch thread. Its rounding differs from F.linear's, so a near-tie in the logits could in principle
change a greedy token against `generate`; `DecodeConfig.cpu_multirow_linears=false` keeps transformers' own kernels.
"""

from __future__ import annotations

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


class MultirowLinears:
    """The model's float32 nn.Linear layers on CPU, switched between `multirow_linear_forward` (`use(True)`) and
    their own forward; `close` (or leaving the `with` block) restores them all."""

    def __init__(self, model, enabled: bool = True):
        self._layers = _swappable(model) if enabled else []
        self._on = False

    def use(self, on: bool) -> None:
        if on == self._on or not self._layers:
            return
        for layer in self._layers:
            if on:
                layer.forward = multirow_linear_forward.__get__(layer)
            else:
                del layer.forward
        self._on = on

    def close(self) -> None:
        self.use(False)

    def __enter__(self) -> MultirowLinears:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def multirow_linears(model, enabled: bool = True) -> MultirowLinears:
    """A block within which the model's float32 nn.Linear layers on CPU use `multirow_linear_forward`."""
    linears = MultirowLinears(model, enabled)
    linears.use(True)
    return linears
