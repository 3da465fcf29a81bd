"""Data collators: examples -> padded PASTA-LANG layout batches, for SFT and for preference pairs.

Batches carry the layout's targets twice, as `labels` and `shift_labels`. `shift_labels` is what every loss reads:
the targets are already aligned to their rows (the usual shift-by-one cannot express interleaved threads), and
both transformers' causal-LM loss and TRL's fused LM head score `shift_labels` without shifting. `labels` is there
because transformers' Trainer counts the trained tokens of an accumulated batch (`num_items_in_batch`) only when a
batch has `labels`; it then counts them from `shift_labels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pasta.lang import IGNORE_INDEX, Layout, ReservationPolicy, build_layout, collate_layouts
from pasta.lang.tokens import TagIds
from pasta.training.examples import token_doc_of


@dataclass
class LayoutCollator:
    """SFT batches: input_ids, position_ids, labels, shift_labels [B, S], the additive mask [B, 1, S, S] and
    num_rows [B] (the trainers pop it before the forward: it only feeds the token count)."""

    tag_ids: TagIds
    pad_id: int
    policy: ReservationPolicy
    max_length: int
    pad_to_multiple_of: int | None = None
    mask_dtype: torch.dtype = (
        torch.float32
    )  # the model's compute dtype: the mask is added to attention scores

    def layout(self, example: dict[str, Any]) -> Layout:
        """The example's first `max_length` rows (what is cut was counted when the examples were built)."""
        doc = token_doc_of(example, self.tag_ids)
        return build_layout(example["prompt_ids"], doc, self.policy, max_rows=self.max_length)

    def collate(self, layouts: list[Layout]) -> dict[str, torch.Tensor]:
        pad_to = None
        if self.pad_to_multiple_of:
            longest = max(len(layout) for layout in layouts)
            pad_to = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = collate_layouts(layouts, self.pad_id, dtype=self.mask_dtype, pad_to=pad_to)
        target_ids = batch.pop("target_ids")  # [B, S]
        batch.pop("thread_ids")
        batch["labels"] = target_ids
        batch["shift_labels"] = target_ids
        batch["num_rows"] = torch.tensor(
            [len(layout) for layout in layouts]
        )  # [B] real rows, for token counts
        return batch

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.collate([self.layout(example) for example in examples])


@dataclass
class PairCollator(LayoutCollator):
    """Preference batches for TRL's DPOTrainer: the chosen layouts, then the rejected ones ([2B, S]).

    DPOTrainer scores the batch through the fused LM head; with `shift_labels` in the batch the head scores our
    aligned targets and returns one log-prob per row [2B, S], of which the trainer keeps rows 1..S-1 and reads
    `completion_mask[:, 1:]` as their trained-token mask. Row 0 is always a prompt row, never trained (a chat
    prompt is longer than one token; checked here), so nothing is lost, and `completion_mask` = target != -100
    gives the IPO length normalisation the number of trained tokens and the SFT term the chosen tokens.
    """

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        chosen = [self.layout({**e["prompt"], **e["chosen"]}) for e in examples]
        rejected = [self.layout({**e["prompt"], **e["rejected"]}) for e in examples]
        batch = self.collate(chosen + rejected)
        if (batch["shift_labels"][:, 0] != IGNORE_INDEX).any():
            raise ValueError(
                "a preference example's first row is trained: its prompt must be two tokens or more"
            )
        batch["completion_mask"] = (batch["shift_labels"] != IGNORE_INDEX).long()  # [2B, S]
        for key in ("ref_chosen_logps", "ref_rejected_logps"):  # the reference's, scored once (LayoutDPOTrainer)
            if key in examples[0]:
                batch[key] = torch.tensor([e[key] for e in examples])  # [B]
        del batch["labels"]  # DPOTrainer builds its own `labels`; ours stay in `shift_labels`, which win
        return batch
