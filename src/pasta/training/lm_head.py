"""The LM head of training on a CPU: only the rows with a target, in the autocast dtype.

TRL's trainers score every batch through a fused LM head (`trl.trainer.utils.add_fused_lm_head`): the vocabulary in
tiles, never the whole logits at once. Off Triton devices that head scores every row (prompt and padding included, so
tile shapes stay fixed for compilers such as Neuron's), multiplies its gradients in float32 whatever the autocast
dtype, and computes the tiles twice (forward, then again in the backward): on a CPU a large share of a step
(measured in docs/stages/train-sft.md#speed-on-a-cpu). `add_cpu_lm_head` patches the model once more, after TRL:
with `fused_lm_head=True` it runs the backbone, projects only the rows whose label is not -100 through the head
(autocast's dtype; the softmax in float32) and returns TRL's `FusedCausalLMOutput`, so the trainers' losses and
metrics read it unchanged. Like TRL's head it computes only the per-token fields its trainer reads (`outputs`), the
others None. The logits of those rows exist at once, [num_targets, vocab], which a CPU batch affords.

Models whose logits TRL's head rescales (soft-capping, a logit scale: Gemma 2, Cohere, Granite...) and mixtures of
experts keep TRL's head.
"""

from __future__ import annotations

import functools
import types

import torch

from pasta.lang import IGNORE_INDEX

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# TRL reads these from a model's config to rescale its logits; a model with any of them keeps TRL's head.
_LOGIT_RESCALING = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                    "logits_scaling")


def supports_cpu_lm_head(model) -> bool:
    """Whether the model's logits are its head's output as is (no rescaling, no experts' router loss)."""
    text_config = model.config.get_text_config()
    if getattr(text_config, "output_router_logits", False):
        return False
    return all(getattr(text_config, name, None) is None for name in _LOGIT_RESCALING)


def add_cpu_lm_head(model, outputs: tuple[str, ...] = ("log_probs",)) -> bool:
    """Patch `model` (the base model TRL patched with its fused head) with the CPU head computing `outputs`, the
    fields TRL's trainer asked its own head for (`add_fused_lm_head(..., outputs=...)`); False, and the model left
    as it was, where `supports_cpu_lm_head` says no."""
    unknown = set(outputs) - set(OUTPUTS)
    if unknown:
        raise ValueError(f"unknown LM head outputs {sorted(unknown)}; known: {', '.join(OUTPUTS)}")
    if not supports_cpu_lm_head(model):
        return False
    trl_forward = model.forward  # TRL's fused forward; it still serves fused_lm_head=False (generation, logits)

    @functools.wraps(trl_forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            return trl_forward(*args, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)
        return target_rows_forward(self, args, kwargs, labels, shift_labels, num_items_in_batch, outputs)

    model.forward = types.MethodType(forward, model)
    return True


def target_rows_forward(model, args, kwargs, labels, shift_labels, num_items_in_batch, outputs):
    """The backbone, then the head on the target rows only; TRL's FusedCausalLMOutput (each field in `outputs` [B, S],
    zero where the label is -100, the others None; log_probs and loss carry the gradient)."""
    from trl.trainer.utils import FusedCausalLMOutput

    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state  # [B, S, D]
    if shift_labels is None:
        hidden, targets = hidden[:, :-1], labels[:, 1:]
    else:
        targets = shift_labels  # already aligned to the rows (pasta's layouts)
    mask = targets != IGNORE_INDEX  # [B, S]
    target_ids = targets[mask]  # [N], N = mask.sum()
    logits = model.get_output_embeddings()(hidden[mask]).float()  # [N, V]
    log_softmax = torch.log_softmax(logits, dim=-1)  # [N, V]
    picked = log_softmax.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)  # [N]

    def per_row(values: torch.Tensor) -> torch.Tensor:  # [N] -> [B, S], zero off the targets
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    extra = {}
    with torch.no_grad():  # TRL's head gives these without a gradient too
        if "entropy" in outputs:
            extra["entropy"] = per_row(-(log_softmax.exp() * log_softmax).sum(-1))
        if "log_sum_sq_probs" in outputs:
            extra["log_sum_sq_probs"] = per_row(torch.logsumexp(2 * log_softmax, dim=-1))
        if "mean_logits" in outputs:
            extra["mean_logits"] = per_row(logits.mean(-1))
        if "is_top1" in outputs:
            extra["is_top1"] = per_row(logits.argmax(-1) == target_ids)

    log_probs = per_row(picked)
    num_targets = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(
        loss=-log_probs.sum() / num_targets, log_probs=log_probs, label_mask=mask, **extra
    )
