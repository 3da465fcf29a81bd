"""The decoders with a model: parity with `generate`, agreement with the training layout, batching, streaming.

The session's tiny model repeats its last input token (tied embeddings, tiny weights), so parity on it would prove
little: `lively` is a private copy with larger random weights, whose greedy output varies. `Scripted` wraps it and
biases chosen transitions (after token A comes B), so that a random model writes PASTA-LANG where a test needs it
while every forward still runs through the real model and the decoder's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from helpers.decoding import (
    assert_teacher_forcing_equals_the_layout_forward,
    generate_ids,
    pasta_speaker,
    prompt,
    token_doc,
    words,
)
from helpers.models import Scripted, lively_model
from helpers.packing import group_visible
from pasta.decoding import (
    DecodeConfig,
    SamplingConfig,
    decode_async,
    decode_sequential,
    packing,
    stream_async,
    teacher_forced_logprobs,
)
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.packing import pack_step
from pasta.decoding.text import text_decoder
from pasta.errors import PastaError
from pasta.lang import (
    ReservationPolicy,
    TagIds,
    build_layout,
    encode_text,
    parse,
    plain_text,
    schedule,
    within_window,
)
from pasta.models import build_tiny_model

POLICIES = [
    ReservationPolicy("exact"),
    ReservationPolicy("scale", scale=10.0),
    ReservationPolicy("round_up", multiple=16),
    ReservationPolicy("fixed", fixed=3),
    ReservationPolicy("uncounted", fixed=5),  # promises without tokens="N"
]
STRUCTURES = [
    'Intro: <promise topic="first tip"/>\n<promise topic="second tip"/> and main text'
    '<async topic="first tip">Drink water every morning.</async><async topic="second tip">Walk after lunch.</async>'
    '<sync/> Middle.\n<promise topic="only one"/> tail<async topic="only one">A lone chunk here.</async>',
    "No tags at all, just a sentence.",
    '<promise topic="x"/><async topic="x">A chunk right at the start that runs long.</async><sync/>',
    'A<promise topic="a"/><promise topic="b"/><promise topic="c"/><async topic="a">one</async>'
    '<async topic="b">two two</async><async topic="c">three three three</async><sync/>B<sync/>C',
]


@pytest.fixture(scope="module")
def lively(tiny_model_and_tokenizer):
    """A tiny Llama whose greedy output varies, with the tag tokens added."""
    return lively_model(tiny_model_and_tokenizer[1])


# --- sequential: exactly generate's tokens ----------------------------------------------------------------------


@pytest.mark.parametrize("torch_threads", [1, 2], indirect=True)
@pytest.mark.parametrize("text", ["Give three tips for sleeping well.", "Hi"])
def test_sequential_greedy_equals_generate_on_the_tiny_model(lively, text, torch_threads):
    model, tokenizer = lively
    ids = prompt(tokenizer, text)
    result = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=48))[0]
    assert result.token_ids == generate_ids(model, ids, max_new_tokens=48)
    assert len(set(result.token_ids)) > 10  # a varied answer, not one token repeated
    assert result.stats.finish_reason == "max_new_tokens"
    assert result.stats.num_steps == result.stats.num_tokens == 48
    assert result.stats.step_rows == [len(ids)] + [1] * 47  # what the cost model prices


@pytest.mark.slow
@pytest.mark.parametrize("torch_threads", [1, 2], indirect=True)
def test_sequential_greedy_equals_generate_on_the_embedded_model(embedded_model_and_tokenizer, torch_threads):
    model, tokenizer = embedded_model_and_tokenizer
    ids = prompt(tokenizer, "Give three tips for staying healthy.")
    result = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=48))[0]
    assert result.token_ids == generate_ids(model, ids, max_new_tokens=48)
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)


def test_sequential_stops_where_generate_stops_on_a_stop_string(lively):
    model, tokenizer = lively
    ids = prompt(tokenizer, "Give three tips for sleeping well.")
    free = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=32))[0]
    stop = tokenizer.decode(free.token_ids[10:12])[1:6]  # a piece of the text that starts inside a token
    result = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=32, stop_strings=(stop,)))[0]
    assert result.token_ids == generate_ids(model, ids, max_new_tokens=32, stop_strings=[stop], tokenizer=tokenizer)
    assert result.stats.finish_reason == "stop_string"
    assert free.text.startswith(result.text) and stop not in result.text
    assert free.text[len(result.text) :].startswith(stop)


def test_sequential_stops_at_eos(lively):
    model, tokenizer = lively
    speaker = Scripted(model, {words(tokenizer, " Go")[0]: tokenizer.eos_token_id})
    result = decode_sequential(speaker, tokenizer, [prompt(tokenizer, "x", words(tokenizer, " Go")[0])],
                               DecodeConfig(max_new_tokens=8))[0]
    assert result.token_ids == [tokenizer.eos_token_id] and result.text == ""
    assert result.stats.finish_reason == "eos"


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, seed=3)])
def test_sequential_batch_gives_each_request_its_answer_alone(lively, sampling):
    model, tokenizer = lively
    prompts = [prompt(tokenizer, "Hi"), prompt(tokenizer, "Give three tips for sleeping well, please.")]
    config = DecodeConfig(max_new_tokens=24, sampling=sampling)
    batch = decode_sequential(model, tokenizer, prompts, config)
    for i, ids in enumerate(prompts):
        alone = decode_sequential(model, tokenizer, [ids], config, seeds=[3 + i])[0]
        assert batch[i].token_ids == alone.token_ids


# --- async: the decoder agrees with the training layout ----------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.policy)
@pytest.mark.parametrize("text", STRUCTURES, ids=range(len(STRUCTURES)))
def test_teacher_forced_logprobs_equal_the_layout_forward(lively, text, policy):
    model, tokenizer = lively
    doc = token_doc(tokenizer, text, policy)
    stats = assert_teacher_forcing_equals_the_layout_forward(model, tokenizer, prompt(tokenizer, "Give tips."), doc,
                                                             policy)

    expected = schedule(doc)
    assert (stats.num_steps, stats.num_tokens) == (expected.num_steps, expected.num_tokens)
    assert stats.theoretical_speedup == pytest.approx(expected.theoretical_speedup)
    assert stats.num_threads == len(doc.chunks)


@pytest.mark.parametrize("window", [None, 6], ids=["full", "window-6"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.policy)
def test_decoder_positions_and_visibility_equal_the_layout(lively, policy, window):
    """Replay a structure through the interpreter and the runner's mask builder; compare token by token. With a
    sliding window, what a sliding layer sees: the layout's visibility narrowed to the window over its positions."""
    _, tokenizer = lively
    doc = token_doc(tokenizer, STRUCTURES[0], policy)
    prompt_ids = encode_text(tokenizer, "Tips please:")
    config = DecodeConfig(max_new_tokens=len(doc.main_ids), max_total_tokens=doc.num_tokens, max_chunk_tokens=64)
    interpreter = Interpreter(prompt_ids, tag_ids=doc.tag_ids, eos_ids={tokenizer.eos_token_id}, policy=policy,
                              config=config, decode=text_decoder(tokenizer), capacity=16)
    scripts = {0: list(doc.main_ids), **{k + 1: list(c.body_ids) for k, c in enumerate(doc.chunks)}}
    counts: dict[int, int] = {}
    identity_of_slot = {}
    decoded = {}  # identity -> (token id, position, identities it sees)
    while not interpreter.done:
        plan = interpreter.plan()
        used = plan.start_slot + len(plan.token_ids)
        interpreter.ensure_capacity(used)
        packed = pack_step([plan], [interpreter.vis], 0, capacity=used, bucketed=False, dtype=torch.float32,
                           device=torch.device("cpu"), window=window, slot_positions=[interpreter.slot_positions()])
        (group,) = packed.ragged.groups  # one request: its rows attend in one group
        visible = group_visible(group, len(plan.token_ids), sliding=window is not None)  # [q, used]
        for i, (token_id, position, thread) in enumerate(zip(plan.token_ids, plan.positions, plan.threads,
                                                             strict=True)):
            n = counts[thread] = counts.get(thread, 0) + 1
            if thread == 0:
                identity = ("p", n - 1) if n <= len(prompt_ids) else ("m", n - 1 - len(prompt_ids))
            else:
                identity = ("c", thread - 1, n - 1)
            identity_of_slot[plan.start_slot + i] = identity
            seen = {identity_of_slot[s] for s in range(used) if visible[i, s]}
            decoded[identity] = (token_id, position, seen)
        interpreter.commit(plan, [scripts[t].pop(0) for t in plan.sample_threads])

    layout = build_layout(prompt_ids, doc, policy)
    layout_visible = layout.visible
    if window is not None:
        positions = torch.tensor(layout.position_ids)
        layout_visible = layout_visible & within_window(positions, positions, window)
        assert not torch.equal(layout_visible, layout.visible)  # the window hides something
    counts = {}
    identities = []
    for thread in layout.thread_ids:
        n = counts[thread] = counts.get(thread, 0) + 1
        identities.append(("p", n - 1) if thread == -1 else ("m", n - 1) if thread == 0 else ("c", thread - 1, n - 1))
    # The decoder never feeds what nothing reads: the final eos and the last group's <|async_end|>.
    last_chunk = len(doc.chunks) - 1
    unread = {("m", len(doc.main_ids) - 1), ("c", last_chunk, len(doc.chunks[last_chunk].opener_ids)
                                                          + len(doc.chunks[last_chunk].body_ids) - 1)}
    assert set(identities) - set(decoded) == unread
    for row, identity in enumerate(identities):
        if identity not in decoded:
            continue
        seen = {identities[c] for c in range(len(identities)) if layout_visible[row, c]}
        assert decoded[identity] == (layout.input_ids[row], layout.position_ids[row], seen), identity


# --- async: decoding what a model writes --------------------------------------------------------------------------


def test_async_forks_joins_and_splices_a_chunk_the_model_writes(lively):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer)
    result = decode_async(speaker, tokenizer, [prompt(tokenizer, "Tips", go)], DecodeConfig(max_new_tokens=32),
                          ReservationPolicy())[0]
    assert result.text == " First red fruit after end"
    assert result.annotated == (' First<promise topic=" apple" tokens="3"/> after'
                                '<async topic=" apple"> red fruit</async><sync/> end')
    assert plain_text(parse(result.annotated)) == result.text
    stats = result.stats
    assert (stats.num_threads, stats.finish_reason, stats.malformed) == (1, "eos", {})
    assert (stats.num_steps, stats.num_tokens) == (schedule(result.token_doc).num_steps, 13)
    assert stats.theoretical_speedup > 1
    assert 0 < stats.bookkeeping_s < stats.wall_s


def test_async_without_tags_written_decodes_what_sequential_decodes(lively):
    model, tokenizer = lively
    ids = prompt(tokenizer, "Give three tips for sleeping well.")
    config = DecodeConfig(max_new_tokens=32)
    sequential = decode_sequential(model, tokenizer, [ids], config)[0]
    asynchronous = decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0]
    assert asynchronous.token_ids == sequential.token_ids
    assert asynchronous.text == asynchronous.annotated == sequential.text
    assert asynchronous.stats.num_steps == 32 and asynchronous.stats.theoretical_speedup == 1.0


def test_constrained_async_leaves_plain_text_greedy_decoding_equal_to_generate(lively):
    model, tokenizer = lively
    ids = prompt(tokenizer, "Give three tips for sleeping well.")
    result = decode_async(model, tokenizer, [ids], DecodeConfig(max_new_tokens=32, constrain=True),
                          ReservationPolicy())[0]
    assert result.token_ids == generate_ids(model, ids, max_new_tokens=32)
    assert result.stats.masked == {} and result.stats.malformed == {}


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_p=0.95, seed=11)],
                         ids=["greedy", "seeded"])
def test_async_batch_gives_each_request_its_answer_alone(lively, sampling):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    prompts = [prompt(tokenizer, "Tips", go), prompt(tokenizer, "Give three tips for sleeping well."),
               prompt(tokenizer, "More tips, longer prompt here", go)]
    config = DecodeConfig(max_new_tokens=20, max_chunk_tokens=7, sampling=sampling)
    batch = decode_async(speaker, tokenizer, prompts, config, ReservationPolicy())
    assert [r.stats.num_threads for r in batch] == [1, 0, 1]
    for i, ids in enumerate(prompts):
        alone = decode_async(speaker, tokenizer, [ids], config, ReservationPolicy(), seeds=[11 + i])[0]
        assert (batch[i].token_ids, batch[i].text) == (alone.token_ids, alone.text)
        assert batch[i].token_doc == alone.token_doc
        assert batch[i].stats.num_steps == alone.stats.num_steps


def test_streaming_yields_the_final_text_in_order(lively):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer)
    ids = prompt(tokenizer, "Tips", go)
    config = DecodeConfig(max_new_tokens=32)
    pieces = list(stream_async(speaker, tokenizer, ids, config, ReservationPolicy()))
    received: list[str] = []
    result = decode_async(speaker, tokenizer, [ids], config, ReservationPolicy(),
                          on_text=lambda request, piece: received.append(piece))[0]
    assert "".join(pieces) == "".join(received) == result.text
    assert len(pieces) > 2
    chunk_piece = next(i for i, p in enumerate(pieces) if "red" in p)
    assert "after" not in "".join(pieces[:chunk_piece])  # text after the promise waits for the chunk


def test_sequential_streaming_yields_the_final_text(lively):
    model, tokenizer = lively
    received: list[str] = []
    result = decode_sequential(model, tokenizer, [prompt(tokenizer, "Hi")], DecodeConfig(max_new_tokens=16),
                               on_text=lambda request, piece: received.append(piece))[0]
    assert "".join(received) == result.text and len(received) > 1


def malformed_speaker(model, tokenizer):
    """Scripted to write a promise whose count is a word, then </async> in the main thread, then a promise left
    open at eos."""
    tags = TagIds.from_tokenizer(tokenizer)
    go, intro, apple, after = words(tokenizer, " Go", " First", " apple", " after")
    speaker = Scripted(model, {
        go: intro, intro: tags.promise, tags.promise: apple, apple: tags.promise_tokens, tags.promise_tokens: after,
        after: tags.promise_end, tags.promise_end: tags.async_end, tags.async_end: tags.sync, tags.sync: tags.promise,
    })
    return speaker, prompt(tokenizer, "x", go)


def test_unconstrained_malformed_model_output_is_cleaned_not_fatal(lively):
    speaker, ids = malformed_speaker(*lively)
    config = DecodeConfig(max_new_tokens=40, constrain=False)
    result = decode_async(speaker, lively[1], [ids], config, ReservationPolicy())[0]
    assert result.stats.malformed["bad_count"] >= 1
    assert result.stats.malformed["async_tag_in_main"] >= 1
    assert result.stats.masked == {}
    assert result.stats.num_threads == 0
    assert result.text.startswith(" First apple after")
    assert "<" not in result.text
    assert plain_text(parse(result.annotated)) == result.text


def test_constrained_decoding_masks_the_malformed_choices_and_counts_them(lively):
    speaker, ids = malformed_speaker(*lively)
    result = decode_async(speaker, lively[1], [ids], DecodeConfig(max_new_tokens=40), ReservationPolicy())[0]
    assert result.stats.malformed == {}
    assert result.stats.masked["bad_count"] >= 1  # " after" as the count: a digit instead
    assert result.token_doc.main_ids == result.token_ids
    assert result.annotated.startswith(' First<promise topic=" apple" tokens="')


@pytest.mark.parametrize("constrain", [False, True])
def test_chunk_overrunning_its_reservation_is_capped_and_counted(lively, constrain):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    # the chunk cap alone: a total budget that never binds
    config = DecodeConfig(max_new_tokens=16, max_total_tokens=1000, max_chunk_tokens=9, constrain=constrain)
    result = decode_async(speaker, tokenizer, [prompt(tokenizer, "Tips", go)], config,
                          ReservationPolicy("exact"))[0]
    stats = result.stats
    assert stats.num_overruns == 1  # tokens="3" but the chunk wrote 9
    if constrain:  # the 9th token is <|async_end|>, sampled
        assert (stats.malformed, stats.masked) == ({}, {"chunk_cap": 1})
        assert len(result.token_doc.chunks[0].body_ids) == 9
    else:  # 9 sampled + the closing <|async_end|> the decoder adds
        assert (stats.malformed, stats.masked) == ({"chunk_cap": 1}, {})
        assert len(result.token_doc.chunks[0].body_ids) == 10


def test_async_needs_tag_tokens_and_says_how_to_add_them(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    with pytest.raises(PastaError, match="add_tag_tokens"):
        decode_async(model, tokenizer, [[1, 2, 3]], DecodeConfig(max_new_tokens=4), ReservationPolicy())


def test_empty_prompt_is_a_one_line_error(lively):
    model, tokenizer = lively
    with pytest.raises(PastaError, match="at least one token"):
        decode_sequential(model, tokenizer, [[]], DecodeConfig(max_new_tokens=4))


def test_teacher_forcing_rejects_a_chunk_without_its_closing_tag(lively):
    model, tokenizer = lively
    doc = token_doc(tokenizer, STRUCTURES[2])
    broken = type(doc)(doc.main_ids, [type(c)(c.opener_ids, c.body_ids[:-1], c.num_predicted) for c in doc.chunks],
                       doc.tag_ids)
    with pytest.raises(PastaError, match="async_end"):
        teacher_forced_logprobs(model, tokenizer, [1, 2], broken, ReservationPolicy())


def test_a_long_decoded_answer_replays_through_teacher_forcing_with_the_same_steps(lively):
    """The chunk outgrows the cache's first capacity; the decode and its replay still agree."""
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    red = words(tokenizer, " red")[0]
    chain = list(range(1000, 1090))
    speaker.transitions.update({red: chain[0], **dict(zip(chain, chain[1:], strict=False)),
                                chain[-1]: TagIds.from_tokenizer(tokenizer).async_end})
    ids = prompt(tokenizer, "Tips", go)
    config = DecodeConfig(max_new_tokens=12, max_total_tokens=1000, max_chunk_tokens=200)
    result = decode_async(speaker, tokenizer, [ids], config, ReservationPolicy("exact"))[0]
    assert len(result.token_doc.chunks[0].body_ids) == 92 and not result.stats.malformed
    assert result.stats.num_overruns == 1
    logprobs, stats = teacher_forced_logprobs(speaker, tokenizer, ids, result.token_doc, ReservationPolicy("exact"))
    assert (stats.num_steps, stats.num_tokens) == (result.stats.num_steps, result.stats.num_tokens)
    assert torch.isfinite(logprobs.total())


def test_slot_cache_writes_each_request_at_its_own_slots_and_grows():
    from pasta.decoding.cache import SlotCache

    cache = SlotCache(num_layers=1, capacity=4, num_rows=2)
    layer = cache.layers[0]
    first = torch.arange(6 * 2, dtype=torch.float32).view(1, 1, 6, 2)  # [1, H, N, D]: 3 rows of each request
    cache.place(torch.tensor([[0, 0, 0, 1, 1, 1]]), torch.tensor([[0, 1, 2, 1, 2, 3]]), kv_length=4, seq_length=1)
    keys, _ = layer.update(first, first.clone())
    assert keys.shape == (2, 1, 4, 2)
    torch.testing.assert_close(keys[0, 0, 0:3], first[0, 0, 0:3])
    torch.testing.assert_close(keys[1, 0, 1:4], first[0, 0, 3:6])
    second = -torch.ones(1, 1, 4, 2)
    cache.reserve(6)  # beyond the capacity of 4: it doubles, keeping what was written
    cache.place(torch.tensor([[0, 0, 1, 1]]), torch.tensor([[3, 4, 4, 5]]), kv_length=6, seq_length=4)
    keys, values = layer.update(second, second.clone())
    assert cache.capacity >= 6 and keys.shape == (2, 1, 6, 2)
    torch.testing.assert_close(keys[0, 0, 0:3], first[0, 0, 0:3])
    torch.testing.assert_close(keys[1, 0, 4:6], second[0, 0, 2:4])
    torch.testing.assert_close(values[0, 0, 3:5], second[0, 0, 0:2])
    assert cache.remove([0]) == [1]
    assert layer.keys.shape[0] == 1
    torch.testing.assert_close(layer.keys[0, 0, 1:4], first[0, 0, 3:6])


# --- CPU multi-row linears (pasta/decoding/linears.py) ------------------------------------------------------------


def test_multirow_linears_run_every_decode_step_never_the_prefill(lively, torch_threads, monkeypatch):
    from pasta.decoding import linears

    row_counts: list[int] = []
    multirow_forward = linears.multirow_linear_forward

    def spy(layer, x):
        row_counts.append(x.numel() // x.shape[-1])
        return multirow_forward(layer, x)

    monkeypatch.setattr(linears, "multirow_linear_forward", spy)
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer)
    ids = prompt(tokenizer, "Tips for a long and happy life, please", go)
    result = decode_async(speaker, tokenizer, [ids], DecodeConfig(max_new_tokens=32), ReservationPolicy())[0]
    assert result.stats.num_threads == 1
    assert max(row_counts) < len(ids) and max(row_counts) >= 2  # the fork's opener rows, not the prompt's

    row_counts.clear()
    decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=4))
    assert row_counts and set(row_counts) == {1}  # one request's decode steps; its prefill ran on F.linear


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_p=0.95, seed=11)],
                         ids=["greedy", "seeded"])
def test_decoders_give_the_same_answers_with_and_without_multirow_linears(lively, torch_threads, sampling):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    prompts = [prompt(tokenizer, "Tips", go), prompt(tokenizer, "Give three tips for sleeping well.")]
    answers = {}
    for enabled in (True, False):
        config = DecodeConfig(max_new_tokens=20, max_chunk_tokens=7, sampling=sampling,
                              cpu_multirow_linears=enabled)
        answers[enabled] = (
            [r.token_ids for r in decode_async(speaker, tokenizer, prompts, config, ReservationPolicy())],
            [r.token_ids for r in decode_sequential(model, tokenizer, prompts, config)],
            decode_sequential(model, tokenizer, prompts[1:], config, seeds=[12])[0].token_ids,
        )
    assert answers[True] == answers[False]


def test_teacher_forced_logprobs_equal_the_layout_forward_with_multirow_linears(lively, torch_threads):
    test_teacher_forced_logprobs_equal_the_layout_forward(lively, STRUCTURES[0], POLICIES[1])


# --- static shapes and the compiled step (decode.compile; pasta/decoding/step.py) -----------------------------------


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process (the compiled step is shared by every decode)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_sequential_steps_attend_as_generate_does_without_a_mask(lively, monkeypatch):
    """The sequential baseline's packed steps: its prompt causal from slot 0, then one row that sees every slot,
    neither with a mask or a gather (SDPA's plainest call, as transformers' own attention makes it for generate);
    in a batch, the decode rows of every request in one masked group and each prompt alone."""
    from pasta.decoding import runner

    seen = []
    pack = runner.pack_step

    def spy(*args, **kwargs):
        packed = pack(*args, **kwargs)
        seen.append([(g.mask is None, g.causal, g.query_index is None) for g in packed.ragged.groups])
        # A model without a sliding window packs no window mask and reads no slot positions: today's path.
        assert kwargs["window"] is None and kwargs["slot_positions"] is None
        assert packed.ragged.window is None and all(g.window_mask is None for g in packed.ragged.groups)
        return packed

    monkeypatch.setattr(runner, "pack_step", spy)
    model, tokenizer = lively
    prompts = [prompt(tokenizer, "Tips"), prompt(tokenizer, "More tips, longer prompt here")]
    decode_sequential(model, tokenizer, prompts[:1], DecodeConfig(max_new_tokens=4))
    assert seen == [[(True, True, True)]] + [[(True, False, True)]] * 3
    seen.clear()
    decode_sequential(model, tokenizer, prompts, DecodeConfig(max_new_tokens=4))
    assert seen[0] == [(True, True, False), (True, True, False)]  # each prompt alone, causal
    assert seen[1:] == [[(False, False, False)]] * 3  # both requests' rows in one masked group


@pytest.mark.slow
# 2 threads: the CPU multi-row linears, compiled too; the plain linears compiled are the one-thread tests below (a
# chunked answer across slot buckets, teacher forcing), which make a 1-thread run of this one a repeat
@pytest.mark.parametrize("torch_threads", [2], indirect=True)
def test_compiled_decoders_give_the_eager_greedy_answers_on_the_tiny_model(lively, torch_threads):
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    prompts = [prompt(tokenizer, "Tips", go), prompt(tokenizer, "Give three tips for sleeping well."),
               prompt(tokenizer, "More tips, longer prompt here", go)]
    answers = {}
    for compile in (False, True):
        config = DecodeConfig(max_new_tokens=20, max_chunk_tokens=7, compile=compile)
        asynchronous = decode_async(speaker, tokenizer, prompts, config, ReservationPolicy())
        answers[compile] = (
            [(r.token_ids, r.token_doc, r.stats.num_steps) for r in asynchronous],
            [r.token_ids for r in decode_sequential(model, tokenizer, prompts, config)],
            decode_sequential(model, tokenizer, prompts[1:2], config)[0].token_ids,
        )
        assert [r.stats.num_threads for r in asynchronous] == [1, 0, 1]
    assert answers[True] == answers[False]


@pytest.mark.slow
def test_compiled_teacher_forcing_gives_the_eager_logprobs_and_steps(lively):
    model, tokenizer = lively
    prompt_ids = prompt(tokenizer, "Give tips.")
    for text in (STRUCTURES[0], STRUCTURES[3]):
        doc = token_doc(tokenizer, text)
        eager, eager_stats = teacher_forced_logprobs(model, tokenizer, prompt_ids, doc, ReservationPolicy())
        compiled, stats = teacher_forced_logprobs(model, tokenizer, prompt_ids, doc, ReservationPolicy(),
                                                  compile=True)
        torch.testing.assert_close(compiled.main, eager.main, atol=1e-4, rtol=1e-4)
        for compiled_chunk, eager_chunk in zip(compiled.chunks, eager.chunks, strict=True):
            torch.testing.assert_close(compiled_chunk, eager_chunk, atol=1e-4, rtol=1e-4)
        assert (stats.num_steps, stats.num_tokens) == (eager_stats.num_steps, eager_stats.num_tokens)


@pytest.mark.slow
def test_a_compiled_answer_that_crosses_slot_buckets_compiles_nothing_after_its_warm_up(lively, monkeypatch):
    """A 100-token chunk outgrows the cache's first capacity and crosses slot buckets, and so does a long
    sequential answer: their second decode (the first one is the warm-up) compiles nothing. Buckets of 32 slots
    (256 in use) so that the answers cross three of them in a few seconds."""
    monkeypatch.setattr(packing, "SLOT_BUCKET", 32)
    model, tokenizer = lively
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    red = words(tokenizer, " red")[0]
    chain = list(range(1000, 1100))
    speaker.transitions.update({red: chain[0], **dict(zip(chain, chain[1:], strict=False)),
                                chain[-1]: TagIds.from_tokenizer(tokenizer).async_end})
    ids = prompt(tokenizer, "Tips", go)
    answers = {}
    for compile in (False, True, True):
        config = DecodeConfig(max_new_tokens=12, max_total_tokens=1000, max_chunk_tokens=150, compile=compile)
        graphs = graphs_compiled()
        chunked = decode_async(speaker, tokenizer, [ids], config, ReservationPolicy("exact"))[0]
        long = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=110, compile=compile))[0]
        answers.setdefault(compile, []).append((chunked.token_doc, long.token_ids))
        assert len(chunked.token_doc.chunks[0].body_ids) == 102 and len(long.token_ids) == 110
    assert graphs_compiled() == graphs  # the last decode, after a warm-up of the same answers
    assert answers[True] == [answers[False][0]] * 2


@pytest.mark.slow
def test_one_graph_serves_a_compiled_answer_across_slot_buckets(tiny_model_and_tokenizer):
    """A model of its own size, so that no earlier test compiled its graph: 300 one-row steps from a 20-token prompt
    attend over 256 slots, then 512, and compile one graph between them."""
    tokenizer = tiny_model_and_tokenizer[1]
    model = build_tiny_model(tokenizer, hidden_size=48, num_heads=4, num_kv_heads=2, intermediate_size=96).eval()
    forced = list(range(1000, 1300))
    graphs = graphs_compiled()
    result = decode_sequential(model, tokenizer, [list(range(100, 120))], DecodeConfig(max_new_tokens=300, compile=True),
                               forced_ids=[forced])[0]
    assert result.token_ids == forced and graphs_compiled() - graphs == 1


def test_compile_mode_is_one_of_torch_compiles():
    with pytest.raises(PastaError, match="compile_mode: one of default, reduce-overhead"):
        DecodeConfig(compile=True, compile_mode="fastest")


@pytest.mark.slow
def test_a_decode_step_that_cannot_be_compiled_stops_with_one_error_line_saying_how_to_turn_it_off(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CXX": "no-such-compiler",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # a fresh cache: nothing compiled before
    done = subprocess.run(
        [sys.executable, "-m", "pasta.generate", "model=tiny", "max_new_tokens=4", "num_threads=1", "prompt=Hi",
         "decode.compile=true", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "could not compile the decode step" in errors[0] and "C++ compiler" in errors[0]
    assert "decode.compile=false" in errors[0]
