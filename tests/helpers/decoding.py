"""Decoding checks shared by the decoder tests and the architecture matrix: prompts, `generate`'s own greedy answer,
a model scripted to fork, one scripted by position to write a numbered promise list (the skeleton draft's tests and
the preference stage's), and the comparison of teacher forcing with one forward over the training layout."""

from __future__ import annotations

import math

import torch

from helpers.models import Scripted, WrappedModel
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


POLICY = ReservationPolicy()


class PositionScripted(WrappedModel):
    """A model whose next token at a row of position p is `script[p]` (a large logit bias), or at the positions of
    `choices` one drawn from {token: probability}, and a chunk's tokens after `<|async_body|>` are `chunk_ids` then
    `<|async_end|>`. It records the wrapped model's own logits of every row it computes, by position (a later row at
    a position replaces an earlier one: a guess the model did not choose is fed again there)."""

    def __init__(self, model, script: dict[int, int], chunk_transitions: dict[int, int],
                 choices: dict[int, dict[int, float]] | None = None):
        super().__init__(model)
        self.script, self.chunk_transitions, self.choices = script, chunk_transitions, choices or {}
        self.raw: dict[int, torch.Tensor] = {}

    def forward(self, input_ids, position_ids=None, logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        logits = out.logits  # [1, n, V] or [n, V]
        if isinstance(logits_to_keep, torch.Tensor):
            fed, positions = input_ids[logits_to_keep], position_ids[logits_to_keep]  # [n]
        else:
            fed, positions = input_ids[0, -logits.shape[-2]:], position_ids[0, -logits.shape[-2]:]  # [n]
        rows = logits.view(-1, logits.shape[-1])  # [n, V]
        for i, (token_id, position) in enumerate(zip(fed.tolist(), positions.tolist(), strict=True)):
            self.raw[position] = rows[i].detach().clone()
            target = self.script.get(position, self.chunk_transitions.get(token_id))
            if position in self.choices:
                rows[i] = -1e9
                for choice_id, probability in self.choices[position].items():
                    rows[i, choice_id] = math.log(probability)
            elif target is not None:
                rows[i, target] += 1e4
        return out


def main_positions(main_ids: list[int], num_prompt: int, tags: TagIds, refused: int | None = None) -> list[int]:
    """The position each main-thread token is fed at: one after another, past each promise's chunk span (not a
    promise whose topic holds `refused`: it forks nothing)."""
    positions, position, topic = [], num_prompt, []
    for token_id in main_ids:
        positions.append(position)
        position += 1
        if token_id == tags.promise:
            topic = []
        elif token_id == tags.promise_end and refused not in topic:
            position += POLICY.span(2 + len(topic), None)
        else:
            topic.append(token_id)
    return positions


def scripted_list(model, tokenizer, bad_topic=False):
    """(tokenizer, prompt ids, the main thread's script as ids, a fresh scripted `model` each call). `bad_topic`: the
    second item's topic is a quote, which an unconstrained decode writes and the parser refuses at its promise_end."""
    tags = TagIds.from_tokenizer(tokenizer)
    nl, one, two, three, dot, dash, a, b, c, d, e, done, red, quote = words(
        tokenizer, "\n", "1", "2", "3", ".", "-", " apple", " bread", " cheese", " dates", " eggs", " done",
        " red", '"')
    # Three numbered items (the third topic two tokens long), a fourth item with another marker, a sync, text, eos.
    main = [nl, one, dot, tags.promise, a, tags.promise_end, nl, two, dot, tags.promise, quote if bad_topic else b,
            tags.promise_end, nl, three, dot, tags.promise, c, d, tags.promise_end, nl, dash, tags.promise, e,
            tags.promise_end, tags.sync, done, tokenizer.eos_token_id]
    prompt_ids = prompt(tokenizer, "List some food.")
    rows = [len(prompt_ids) - 1] + main_positions(main, len(prompt_ids), tags, quote)[:-1]
    script = dict(zip(rows, main, strict=True))

    def scripted():
        return PositionScripted(model, script, {tags.async_body: red, red: tags.async_end})

    return tokenizer, prompt_ids, main, scripted
