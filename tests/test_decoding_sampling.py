"""The sampler's draw (pasta/decoding/sampling.py): each row's token follows its probabilities, never one of zero
probability, the same tokens for the same seed."""

from __future__ import annotations

import pytest
import torch

from pasta.decoding import sampling
from pasta.decoding.sampling import draw

PROBS = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])


def test_a_drawn_token_follows_its_rows_probabilities():
    num_draws = 4000
    generator = torch.Generator().manual_seed(0)
    token_ids = draw(PROBS.expand(num_draws, -1), generator)  # [num_draws]
    counts = torch.bincount(token_ids, minlength=len(PROBS)).double()
    assert counts[1] == counts[4] == 0
    expected = num_draws * PROBS[[0, 2, 3]].double()
    chi_square = float(((counts[[0, 2, 3]] - expected) ** 2 / expected).sum())
    assert chi_square < 13.8  # 2 degrees of freedom, p = 0.001


def test_a_draw_rounded_up_to_the_total_lands_on_the_last_possible_token(monkeypatch):
    # A uniform just below 1 times the total can round to the total itself, past every cumulative mass.
    monkeypatch.setattr(sampling.torch, "rand", lambda n, _, **kwargs: torch.ones(n, 1, dtype=kwargs["dtype"]))
    assert draw(PROBS[None], None).tolist() == [3]


def test_a_seed_draws_the_same_tokens():
    probs = torch.softmax(torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)), dim=-1)
    first = draw(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, draw(probs, torch.Generator().manual_seed(7)))
    assert not torch.equal(first, draw(probs, torch.Generator().manual_seed(8)))


def test_a_row_with_no_token_to_draw_is_refused():
    with pytest.raises(ValueError, match="no token to draw"):
        draw(torch.tensor([[0.5, 0.5], [float("nan"), 0.0]]), None)
