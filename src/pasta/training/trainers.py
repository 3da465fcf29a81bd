"""TRL's SFTTrainer and DPOTrainer, taught the two things the PASTA-LANG layout needs.

Both trainers compute log-probs through TRL's fused LM head, which scores `shift_labels` (our targets, already
aligned to rows) without shifting, so their losses, metrics, PEFT handling, checkpoints and distributed code run
unchanged. What differs:
- Token counting: TRL counts a batch's tokens as `attention_mask.sum()`, meaningless on an additive 4-D mask
  (a sum of finfo.min); the collator reports each example's row count as `num_rows` and the count uses that.
- DPOTrainer tokenizes text `prompt`/`chosen`/`rejected` columns itself; our pairs arrive already tokenized as
  PASTA-LANG threads, so its dataset preparation is skipped (SFTTrainer has `skip_prepare_dataset` for this).
"""

from __future__ import annotations

from trl import DPOTrainer, SFTTrainer


class _LayoutTokenCount:
    """Counts trained-on tokens from the collator's `num_rows` [B] (see the module docstring)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        num_rows = inputs.pop("num_rows")  # [B]
        before = self._total_train_tokens
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        if self.model.training:
            self._total_train_tokens = before + int(
                self.accelerator.gather_for_metrics(num_rows.sum()).sum().item()
            )
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
        return result


class LayoutSFTTrainer(_LayoutTokenCount, SFTTrainer):
    """SFTTrainer on PASTA-LANG layout batches (`pasta.training.collator.LayoutCollator`)."""


class LayoutDPOTrainer(_LayoutTokenCount, DPOTrainer):
    """DPOTrainer on PASTA-LANG layout pairs (`pasta.training.collator.PairCollator`)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset
