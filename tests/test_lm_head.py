"""The CPU LM head (pasta.training.lm_head) against TRL's fused head: the same log-probs, loss, metrics and
gradients, from the target rows only."""

from __future__ import annotations

import torch
from trl.trainer.utils import add_fused_lm_head

from pasta.models import build_tiny_model
from pasta.training.lm_head import OUTPUTS, add_cpu_lm_head


def batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (2, 12), generator=generator)  # [B, S]
    targets = torch.randint(0, vocab_size, (2, 12), generator=generator)
    targets[0, :4] = -100  # a prompt
    targets[1, 9:] = -100  # padding
    return {"input_ids": input_ids, "shift_labels": targets}


def fused_outputs(model, inputs, num_items_in_batch=None):
    model.zero_grad()
    outputs = model(**inputs, fused_lm_head=True, num_items_in_batch=num_items_in_batch)
    outputs.loss.backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    return outputs, grads


def test_the_cpu_head_scores_what_trls_head_scores_with_the_same_gradients(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    trl_model = build_tiny_model(tokenizer)
    add_fused_lm_head(trl_model, outputs=OUTPUTS)
    cpu_model = build_tiny_model(tokenizer)
    add_fused_lm_head(cpu_model, outputs=OUTPUTS)
    assert add_cpu_lm_head(cpu_model, OUTPUTS)
    inputs = batch(trl_model.config.vocab_size)

    for num_items_in_batch in (None, torch.tensor(40)):
        expected, expected_grads = fused_outputs(trl_model, inputs, num_items_in_batch)
        got, grads = fused_outputs(cpu_model, inputs, num_items_in_batch)
        torch.testing.assert_close(got.loss, expected.loss)
        assert torch.equal(got.label_mask, expected.label_mask)
        for name in ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits"):
            torch.testing.assert_close(getattr(got, name), getattr(expected, name), msg=name)
        assert torch.equal(got.is_top1, expected.is_top1)
        assert (got.log_probs[~got.label_mask] == 0).all()
        assert expected_grads.keys() == grads.keys() and grads
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], msg=name)


def test_without_the_fused_flag_the_model_gives_its_own_logits(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    plain = build_tiny_model(tokenizer)
    patched = build_tiny_model(tokenizer)
    add_fused_lm_head(patched)
    add_cpu_lm_head(patched)
    input_ids = batch(plain.config.vocab_size)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(patched(input_ids=input_ids).logits, plain(input_ids=input_ids).logits)


def test_a_model_that_rescales_its_logits_keeps_trls_head(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    model = build_tiny_model(tokenizer)
    model.config.final_logit_softcapping = 30.0
    add_fused_lm_head(model)
    forward = model.forward
    assert not add_cpu_lm_head(model)
    assert model.forward is forward


def test_the_cpu_head_computes_only_the_fields_it_was_asked_for_as_trls_head_does(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    asked = ("log_probs", "is_top1")
    trl_model = build_tiny_model(tokenizer)
    add_fused_lm_head(trl_model, outputs=asked)
    cpu_model = build_tiny_model(tokenizer)
    add_fused_lm_head(cpu_model, outputs=asked)
    add_cpu_lm_head(cpu_model, asked)
    inputs = batch(trl_model.config.vocab_size)
    expected, got = trl_model(**inputs, fused_lm_head=True), cpu_model(**inputs, fused_lm_head=True)
    for name in OUTPUTS:
        assert (getattr(got, name) is None) == (getattr(expected, name) is None), name
    assert got.entropy is None and torch.equal(got.is_top1, expected.is_top1)
