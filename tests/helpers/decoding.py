"""Decoding checks shared by the decoder tests and the architecture matrix: prompts, `generate`'s own greedy answer,
a model scripted to fork, and the comparison of teacher forcing with one forward over the training layout."""

from __future__ import annotations

import torch

from helpers.models import Scripted
from pasta.decoding import layout_attention, teacher_forced_logprobs
from pasta.lang import (
    IGNORE_INDEX,
    ReservationPolicy,
    TagIds,
    build_layout,
    collate_layouts,
    encode_text,
    parse,
    sequence_logprobs,
    tokenize_document,
    written_counts,
)
from pasta.models import encode_prompt


def words(tokenizer, *texts):
    """The one token id of each text (each must be one token)."""
    ids = [encode_text(tokenizer, text) for text in texts]
    assert all(len(i) == 1 for i in ids), ids
    return [i[0] for i in ids]


def pasta_speaker(model, tokenizer, *, free_chunks=False):
    """Scripted to answer `... Go` with: First <promise topic=" apple" tokens="3"/> after <sync/> end eos,
    the chunk writing " red fruit" then </async> (or anything it likes when `free_chunks`)."""
    tags = TagIds.from_tokenizer(tokenizer)
    go, intro, apple, three, after, red, fruit, end = words(
        tokenizer, " Go", " First", " apple", "3", " after", " red", " fruit", " end"
    )
    transitions = {
        go: intro, intro: tags.promise, tags.promise: apple, apple: tags.promise_tokens,
        tags.promise_tokens: three, three: tags.promise_end, tags.promise_end: after, after: tags.sync,
        tags.sync: end, end: tokenizer.eos_token_id, tags.async_body: red,
    }
    if not free_chunks:
        transitions.update({red: fruit, fruit: tags.async_end})
    return Scripted(model, transitions), go


def prompt(tokenizer, text, go=None):
    """The chat prompt of `text`, and the token `go` after it when given (what `pasta_speaker` answers)."""
    ids = encode_prompt(tokenizer, text)
    return ids + ([go] if go is not None else [])


def generate_ids(model, ids, **kwargs):
    """transformers' own greedy answer to the prompt `ids` (its own masks and cache)."""
    input_ids = torch.tensor([ids])
    out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, **kwargs)
    return out[0, len(ids) :].tolist()


def token_doc(tokenizer, text, policy=ReservationPolicy()):
    """The structure as training data writes it under `policy` (counted, or uncounted)."""
    return tokenize_document(written_counts(parse(text), tokenizer, policy.counts), tokenizer)


def layout_forward(model, prompt_ids, doc, policy):
    """One forward over the training layout of `doc`, as training runs it (each layer's window applied): (the layout,
    its logits [S, V], each row's log-probability of its target [S], 0 where it has none)."""
    layout = build_layout(prompt_ids, doc, policy)
    batch = collate_layouts([layout], pad_id=0)
    with torch.no_grad(), layout_attention(model):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits  # [1, S, V]
    return layout, logits[0], sequence_logprobs(logits, batch["target_ids"])[0]


def assert_teacher_forcing_equals_the_layout_forward(model, tokenizer, prompt_ids, doc, policy):
    """The decoder's teacher-forced log-probabilities of `doc` equal one forward over its training layout, thread
    by thread; returns the replay's stats."""
    logprobs, stats = teacher_forced_logprobs(model, tokenizer, prompt_ids, doc, policy)
    layout, _, per_row = layout_forward(model, prompt_ids, doc, policy)
    threads = torch.tensor(layout.thread_ids)
    trained = torch.tensor(layout.target_ids) != IGNORE_INDEX
    torch.testing.assert_close(logprobs.main, per_row[(threads <= 0) & trained], atol=1e-4, rtol=1e-4)
    for k, chunk_logprobs in enumerate(logprobs.chunks):
        torch.testing.assert_close(chunk_logprobs, per_row[(threads == k + 1) & trained], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logprobs.total(), per_row.sum(), atol=1e-3, rtol=1e-4)
    return stats
