"""The decoder's step pieces that continuous batching uses: cache rows that leave and join a running batch,
StepBatch with requests arriving and leaving between steps, and the sequential baseline as a step-planning request.
"""

from __future__ import annotations

import pytest
import torch

from helpers.models import lively_model
from pasta.decoding import DecodeConfig, decode_async, decode_sequential
from pasta.decoding.asynchronous import new_interpreter, request_stats
from pasta.decoding.cache import SlotCache
from pasta.decoding.plain import PlainInterpreter
from pasta.decoding.runner import RequestClock, StepBatch
from pasta.decoding.text import eos_token_ids, pad_token_id, text_decoder
from pasta.lang import ReservationPolicy
from pasta.models import encode_prompt


def written_cache(num_rows: int, capacity: int, offset: float = 0.0) -> SlotCache:
    """A one-layer cache whose row b holds the value b + offset in its first two slots."""
    cache = SlotCache(num_layers=1, capacity=capacity)
    rows = torch.arange(num_rows, dtype=torch.float32).view(num_rows, 1, 1, 1) + offset
    cache.begin_step([0] * num_rows, 2, kv_length=2)
    cache.layers[0].update(rows.expand(num_rows, 1, 2, 2).clone(), rows.expand(num_rows, 1, 2, 2).clone())
    return cache


def row_values(cache: SlotCache) -> list[float]:
    return cache.layers[0].keys[:, 0, 0, 0].tolist()


def test_cache_rows_leave_by_taking_the_last_row_and_join_into_the_freed_room():
    cache = written_cache(4, capacity=4)
    allocated = cache.num_bytes()
    assert cache.remove([0, 2], num_rows=4) == [3, 1]  # row 3 fills the hole at 0; row 2 was last but one
    assert row_values(cache) == [3.0, 1.0]
    cache.add_rows(1)  # into the room the removed rows left: nothing reallocated
    assert cache.num_bytes() == allocated and row_values(cache) == [3.0, 1.0, 0.0]
    other = written_cache(2, capacity=8, offset=10.0)
    cache.merge(other)  # more rows than the room left, and a larger capacity: both grow
    assert row_values(cache) == [3.0, 1.0, 0.0, 10.0, 11.0]
    assert cache.capacity == 8 and cache.layers[0].keys.shape == (5, 1, 9, 2)  # a spare slot (cache.py)
    assert cache.layers[0].values[4, 0, :2, 0].tolist() == [11.0, 11.0]


@pytest.fixture(scope="module")
def lively(tiny_model_and_tokenizer):
    return lively_model(tiny_model_and_tokenizer[1])


def step(batch: StepBatch) -> None:
    """One greedy step of every member."""
    plans = [interpreter.plan() for interpreter in batch.members]
    logits = batch.forward(batch.prepare(plans), plans)
    for interpreter, plan, rows in zip(batch.members, plans, logits, strict=True):
        interpreter.commit(plan, rows.argmax(dim=-1).tolist())


def test_requests_joining_and_leaving_a_running_batch_decode_what_they_decode_alone(lively):
    model, tokenizer = lively
    config = DecodeConfig(max_new_tokens=10)
    prompts = [encode_prompt(tokenizer, text) for text in ("Name a fruit.", "Give three tips.", "Hello there")]
    alone = [decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0].token_ids for ids in prompts]
    interpreters = [new_interpreter(model, tokenizer, ids, config, ReservationPolicy()) for ids in prompts]
    running, arriving = StepBatch(model, pad_token_id(tokenizer)), StepBatch(model, pad_token_id(tokenizer))
    for interpreter in interpreters[:2]:
        running.join(interpreter, 64)
    with torch.inference_mode():
        for _ in range(3):
            step(running)
        arriving.join(interpreters[2], 64)
        step(arriving)  # its prefill, on its own
        running.merge(arriving)
        step(running)
        running.remove([0])  # the first request leaves (cancelled); the last member takes its row
        assert running.members == [interpreters[2], interpreters[1]]
        while running.members:
            step(running)
            running.remove([b for b, i in enumerate(running.members) if i.done])
    assert [interpreters[1].main_ids, interpreters[2].main_ids] == [alone[1], alone[2]]
    assert running.cache is None


def test_the_sequential_baseline_as_a_step_planning_request_decodes_decode_sequentials_tokens(lively):
    model, tokenizer = lively
    ids = encode_prompt(tokenizer, "Give three tips for sleeping well.")
    expected = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=12))[0]
    text = expected.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a stop string inside the answer
    stopped = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=12, stop_strings=(stop,)))[0]
    for config, reference in ((DecodeConfig(max_new_tokens=12), expected),
                              (DecodeConfig(max_new_tokens=12, stop_strings=(stop,)), stopped)):
        request = PlainInterpreter(ids, eos_ids=eos_token_ids(model, tokenizer), config=config,
                                   decode=text_decoder(tokenizer), capacity=8)  # grows on demand
        batch = StepBatch(model, pad_token_id(tokenizer))
        batch.join(request, 8)
        with torch.inference_mode():
            while not request.done:
                step(batch)
        assert (request.main_ids, request.text(), request.finish_reason) == (
            reference.token_ids, reference.text, reference.stats.finish_reason)
        assert request_stats(request, RequestClock()).step_rows == reference.stats.step_rows  # what serving reports
