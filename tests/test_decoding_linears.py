"""The CPU multi-row linears (pasta/decoding/linears.py): the numbers of F.linear, swapped in only where they help,
and undone afterwards. The decoders' answers with them are checked in test_decoding.py."""

from __future__ import annotations

import pytest
import torch

from pasta.decoding.linears import MAX_ROWS, multirow_linear_forward, multirow_linears
from pasta.models import build_tiny_model


@pytest.fixture(scope="module")
def model(tiny_model_and_tokenizer):
    return build_tiny_model(tiny_model_and_tokenizer[1]).eval()


def swapped(model) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, MAX_ROWS, MAX_ROWS + 1])
def test_multirow_forward_gives_f_linear_numbers_for_any_row_count(rows, bias):
    layer = torch.nn.Linear(48, 96, bias=bias)
    for shape in [(rows, 48), (1, rows, 48), (2, rows, 48)]:
        x = torch.randn(shape)
        torch.testing.assert_close(multirow_linear_forward(layer, x), layer(x), atol=1e-5, rtol=1e-5)


def test_every_float32_linear_is_swapped_inside_the_block_and_restored_after(model, torch_threads):
    linears = [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    assert linears
    with multirow_linears(model):
        assert swapped(model) == linears
    assert swapped(model) == []


def test_nothing_is_swapped_on_one_thread_or_when_disabled(model, torch_threads):
    with multirow_linears(model, enabled=False):
        assert swapped(model) == []
    torch.set_num_threads(1)
    with multirow_linears(model):
        assert swapped(model) == []


def test_a_nested_block_leaves_the_outer_swap_in_place(model, torch_threads):
    with multirow_linears(model):
        outer = swapped(model)
        with multirow_linears(model):
            pass
        assert swapped(model) == outer
    assert swapped(model) == []


def test_the_swap_is_undone_when_the_block_raises(model, torch_threads):
    with pytest.raises(RuntimeError), multirow_linears(model):
        raise RuntimeError("decoding failed")
    assert swapped(model) == []
