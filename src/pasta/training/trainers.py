"""TRL's SFTTrainer and DPOTrainer, taught the two things the PASTA-LANG layout needs.

Both trainers compute log-probs through TRL's fused LM head, which scores `shift_labels` (our targets, already
aligned to rows) without shifting, so their losses, metrics, PEFT handling, checkpoints and distributed code run
unchanged. What differs:
- Token counting: TRL counts a batch's tokens as `attention_mask.sum()`, meaningless on an additive 4-D mask
  (a sum of finfo.min); the collator reports each example's row count as `num_rows` and the count uses that.
- DPOTrainer tokenizes text `prompt`/`chosen`/`rejected` columns itself; our pairs arrive already tokenized as
  PASTA-LANG threads, so its dataset preparation is skipped (SFTTrainer has `skip_prepare_dataset` for this).
- Sliding windows: the layout's one mask would replace the window transformers builds for a sliding layer, so while
  a model some layer of which slides (Gemma 2/3, Mistral, Phi-3...) trains, it attends through pasta's layout
  attention, which narrows the mask to each sliding layer's window over the layout's positions
  (pasta.decoding.layout_attention); every other model trains through its own attention, untouched.
- On a CPU the fused LM head scores only the rows with a target, in the autocast dtype (pasta.training.lm_head).
- The preference trainer scores every pair under the reference once, when training starts, rather than on every
  step of every epoch (`stage.precompute_ref_log_probs`). TRL's own precompute runs in the trainer's constructor,
  before the CPU LM head and the layout attention are in place, so it stays off and the trainer does it here.
"""

from __future__ import annotations

import logging

import torch
from peft import PeftModel
from torch.utils.data import DataLoader
from trl import DPOTrainer, SFTTrainer

from pasta.decoding import layout_attention
from pasta.training.lm_head import add_cpu_lm_head

log = logging.getLogger(__name__)


class _LayoutTraining:
    """Counts trained-on tokens from the collator's `num_rows` [B], and trains a windowed model through the layout
    attention (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.accelerator.device.type == "cpu":
            policy = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
            patched = [add_cpu_lm_head(policy, self.lm_head_outputs())]
            if getattr(self, "ref_model", None) is not None:
                patched.append(add_cpu_lm_head(self.ref_model))  # TRL reads only its log-probs
            if all(patched):
                log.info("training on a CPU: the LM head scores the target rows only (pasta.training.lm_head)")

    def lm_head_outputs(self) -> tuple[str, ...]:
        """The per-token fields the trainer's losses and metrics read: what it asks TRL's fused head for."""
        raise NotImplementedError

    def train(self, *args, **kwargs):
        # The reference model of full finetuning is a copy with a config of its own; under LoRA it is None.
        with layout_attention(self.model, getattr(self, "ref_model", None)):
            self.before_training()
            return super().train(*args, **kwargs)

    def before_training(self) -> None:
        """Work done once, under the layout attention, before the first step."""

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


class LayoutSFTTrainer(_LayoutTraining, SFTTrainer):
    """SFTTrainer on PASTA-LANG layout batches (`pasta.training.collator.LayoutCollator`)."""

    def lm_head_outputs(self) -> tuple[str, ...]:
        return ("log_probs", "entropy", "is_top1")  # as SFTTrainer.__init__ asks add_fused_lm_head


class LayoutDPOTrainer(_LayoutTraining, DPOTrainer):
    """DPOTrainer on PASTA-LANG layout pairs (`pasta.training.collator.PairCollator`)."""

    def __init__(self, *args, precompute_ref_log_probs: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.precompute_ref_at_start = precompute_ref_log_probs

    def before_training(self) -> None:
        if self.precompute_ref_at_start and not self.precompute_ref_logps:
            self.train_dataset = self.with_ref_log_probs(self.train_dataset)
            self.precompute_ref_logps = True  # TRL's _compute_loss then reads them from the batch

    def with_ref_log_probs(self, dataset):
        """`dataset` with the reference's log-prob of each pair's chosen and rejected side (TRL's column names).

        The processes share the pass, each scoring its batches, and every one gathers all of them, in order (as TRL's
        own precompute does). A resumed run scores them again: the reference, the round's starting policy, is the
        same."""
        # Shortest pairs first, so a batch pads little; the log-probs go back to the dataset's order.
        lengths = list(dataset["length"])
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        loader = self.accelerator.prepare(DataLoader(dataset.select(order), shuffle=False, collate_fn=self.data_collator,
                                                     batch_size=self.args.per_device_train_batch_size))
        model = self.ref_model or self.model
        chosen, rejected = [], []
        for batch in loader:
            batch.pop("num_rows")
            chosen_logps, rejected_logps = self.accelerator.gather_for_metrics(
                self.compute_ref_log_probs(model, batch)
            )  # [B x processes] each
            chosen.append(chosen_logps.float().cpu())
            rejected.append(rejected_logps.float().cpu())
        restore = torch.tensor(order).argsort()  # [N] each pair's place in the sorted order
        return (dataset.add_column("ref_chosen_logps", torch.cat(chosen)[restore].tolist())
                .add_column("ref_rejected_logps", torch.cat(rejected)[restore].tolist()))

    def lm_head_outputs(self) -> tuple[str, ...]:
        # as DPOTrainer.__init__ asks add_fused_lm_head; log_sum_sq_probs feeds the WPO weights
        outputs = ("log_probs", "entropy", "mean_logits", "is_top1")
        return outputs + ("log_sum_sq_probs",) if self.use_weighting else outputs

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset
