"""The decoder's step pieces that continuous batching uses: cache rows that leave and join a running batch, ragged
steps (every request's rows packed, pasta/decoding/packing.py), StepBatch with requests arriving and leaving between
steps, and the sequential baseline as a step-planning request.
"""

from __future__ import annotations

import pytest
import torch

from helpers.models import Scripted, lively_model
from pasta.decoding import DecodeConfig, decode_async, decode_sequential, runner
from pasta.decoding.asynchronous import new_interpreter, request_stats
from pasta.decoding.attention import ragged_attention
from pasta.decoding.cache import SlotCache
from pasta.decoding.packing import narrow_width, pack_step
from pasta.decoding.plain import PlainInterpreter
from pasta.decoding.runner import RequestClock, StepBatch
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward, model_step
from pasta.decoding.text import eos_token_ids, pad_token_id, text_decoder
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import ReservationPolicy, TagIds, encode_text
from pasta.models import encode_prompt


def written_cache(num_rows: int, capacity: int, offset: float = 0.0) -> SlotCache:
    """A one-layer cache whose row b holds the value b + offset in its first two slots."""
    cache = SlotCache(num_layers=1, capacity=capacity, num_rows=num_rows)
    rows = torch.arange(num_rows, dtype=torch.float32).view(num_rows, 1, 1, 1) + offset
    cache.begin_step([0] * num_rows, 2, kv_length=2)
    cache.layers[0].update(rows.expand(num_rows, 1, 2, 2).clone(), rows.expand(num_rows, 1, 2, 2).clone())
    return cache


def row_values(cache: SlotCache) -> list[float]:
    return cache.layers[0].keys[:, 0, 0, 0].tolist()


def test_cache_rows_leave_by_taking_the_last_row_and_join_into_the_freed_room():
    cache = written_cache(4, capacity=4)
    allocated = cache.num_bytes()
    assert cache.remove([0, 2]) == [3, 1]  # row 3 fills the hole at 0; row 2 was last but one
    assert row_values(cache) == [3.0, 1.0] and cache.num_rows == 2
    cache.add_rows(1)  # into the room the removed rows left: nothing reallocated
    assert cache.num_bytes() == allocated and row_values(cache) == [3.0, 1.0, 0.0]
    cache.add_rows(2)  # more rows than the room left: the stores double
    assert row_values(cache) == [3.0, 1.0, 0.0, 0.0, 0.0] and cache.num_bytes() == 2 * allocated


def test_packed_rows_are_written_at_their_own_requests_row_and_slot():
    cache = written_cache(3, capacity=4)
    keys = torch.tensor([10.0, 11.0, 12.0]).view(1, 1, 3, 1).expand(1, 1, 3, 2).clone()  # [1, H, N, D]
    # Packed rows: request 2 at its slot 2, request 0 at its slots 2 and 3.
    cache.place(torch.tensor([[2, 0, 0]]), torch.tensor([[2, 2, 3]]), kv_length=4, seq_length=2)
    attended, _ = cache.layers[0].update(keys, keys.clone())
    assert attended.shape == (3, 1, 4, 2)  # every cache row, over the first 4 slots
    assert attended[:, 0, :, 0].tolist() == [[0.0, 0.0, 11.0, 12.0], [1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 10.0, 0.0]]


@pytest.fixture(scope="module")
def lively(tiny_model_and_tokenizer):
    return lively_model(tiny_model_and_tokenizer[1])


def step(batch: StepBatch) -> None:
    """One greedy step of every member."""
    plans = [interpreter.plan() for interpreter in batch.members]
    logits = batch.forward(batch.prepare(plans), plans)
    for interpreter, plan, rows in zip(batch.members, plans, logits, strict=True):
        interpreter.commit(plan, rows.argmax(dim=-1).tolist())


def forking_speaker(lively):
    """The lively model scripted to answer `... Go` with `First<promise topic=" apple" tokens="3"/> after<sync/>
    end` eos, the chunk writing what it likes (pasta_speaker of tests/test_decoding.py)."""
    model, tokenizer = lively
    tags = TagIds.from_tokenizer(tokenizer)
    go, intro, apple, three, after, end = (encode_text(tokenizer, t)[0]
                                           for t in (" Go", " First", " apple", "3", " after", " end"))
    transitions = {go: intro, intro: tags.promise, tags.promise: apple, apple: tags.promise_tokens,
                   tags.promise_tokens: three, three: tags.promise_end, tags.promise_end: after, after: tags.sync,
                   tags.sync: end, end: tokenizer.eos_token_id}
    return Scripted(model, transitions)


def test_requests_joining_and_leaving_a_running_batch_decode_what_they_decode_alone(lively):
    model, tokenizer = lively
    config = DecodeConfig(max_new_tokens=10)
    prompts = [encode_prompt(tokenizer, text) for text in ("Name a fruit.", "Give three tips.", "Hello there")]
    alone = [decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0].token_ids for ids in prompts]
    interpreters = [new_interpreter(model, tokenizer, ids, config, ReservationPolicy()) for ids in prompts]
    running = StepBatch(model, pad_token_id(tokenizer))
    for interpreter in interpreters[:2]:
        running.join(interpreter, 64)
    with torch.inference_mode(), ragged_attention(model):
        for _ in range(3):
            step(running)
        running.join(interpreters[2], 64)  # its prefill rides in the running requests' forward
        step(running)
        running.remove([0])  # the first request leaves (cancelled); the last member takes its row
        assert running.members == [interpreters[2], interpreters[1]]
        while running.members:
            step(running)
            running.remove([b for b, i in enumerate(running.members) if i.done])
    assert [interpreters[1].main_ids, interpreters[2].main_ids] == [alone[1], alone[2]]
    assert running.cache is None


def test_a_ragged_batch_of_forking_plain_and_arriving_requests_decodes_what_each_decodes_alone(lively, monkeypatch):
    """Async requests that fork and that do not, and sequential ones, in one batch; two arrive while the others
    decode (their prompts ride in the same forward); every request gets its greedy answer alone. The steps cover
    every attention group: a prompt alone beside decode rows, the narrow group, and a fork's rows gathered."""
    _, tokenizer = lively
    speaker = forking_speaker(lively)
    config = DecodeConfig(max_new_tokens=16, max_chunk_tokens=6)
    texts = ["Tips Go", "Name a fruit.", "Hello there", "More tips, and a longer prompt here Go",
             "Give three tips."]
    prompts = [encode_prompt(tokenizer, text)[:-1] + encode_text(tokenizer, text[-3:]) if text.endswith("Go")
               else encode_prompt(tokenizer, text) for text in texts]
    plain = {2, 4}  # the sequential baseline's requests
    alone = [decode_sequential(speaker, tokenizer, [ids], config)[0].token_ids if r in plain
             else decode_async(speaker, tokenizer, [ids], config, ReservationPolicy())[0].token_ids
             for r, ids in enumerate(prompts)]

    def request(r):
        if r in plain:
            return PlainInterpreter(prompts[r], eos_ids=eos_token_ids(speaker, tokenizer), config=config,
                                    decode=text_decoder(tokenizer), capacity=64)
        return new_interpreter(speaker, tokenizer, prompts[r], config, ReservationPolicy())

    groups_seen = set()

    def spy(*args, **kwargs):
        packed = pack_step(*args, **kwargs)
        kinds = {"narrow" if g.cache_rows is None else "alone" if isinstance(g.cache_rows, int) else "gathered"
                 for g in packed.ragged.groups}
        groups_seen.update(kinds if len(kinds) > 1 else set())
        return packed

    monkeypatch.setattr(runner, "pack_step", spy)
    requests = [request(r) for r in range(len(prompts))]
    batch = StepBatch(speaker, pad_token_id(tokenizer))
    for r in (0, 1, 2):
        batch.join(requests[r], 64)
    with torch.inference_mode(), ragged_attention(speaker):
        for _ in range(2):
            step(batch)
        for r in (3, 4):
            batch.join(requests[r], 64)
        while batch.members:
            step(batch)
            batch.remove([b for b, i in enumerate(batch.members) if i.done])
    assert [i.main_ids for i in requests] == alone
    assert [requests[r].num_threads for r in (0, 1, 3)] == [1, 0, 1]
    assert groups_seen == {"narrow", "alone", "gathered"}


def test_the_narrow_group_takes_the_width_with_the_fewest_query_rows():
    assert narrow_width([1] * 15 + [8], 16) == 1  # 16 + 1 * (7 + 2) query rows, where width 8 would take 128
    assert narrow_width([2] * 8, 8) == 2  # no wide group
    assert narrow_width([1, 4, 4, 4], 4) == 4  # three gathered rows would cost more than padding one request


def plan(start_slot: int, num_rows: int, *, prefill: bool = False) -> StepPlan:
    """A main-thread plan feeding `num_rows` tokens from `start_slot`, the last one sampling."""
    plan = StepPlan(start_slot, prefill=prefill)
    for i in range(num_rows):
        plan.feed(7, start_slot + i, MAIN_ROW, 0)
    plan.sample(0)
    return plan


def table(num_slots: int) -> torch.Tensor:
    visibility = VisibilityTable(0, 512)  # as wide as a compiled step's slot bucket
    for _ in range(num_slots):
        visibility.take_slot(MAIN_ROW)
    return visibility.rows


def test_an_eager_step_packs_exactly_the_rows_requests_feed_and_a_compiled_one_takes_buckets():
    plans = [plan(10, 1), plan(20, 3), plan(0, 5, prefill=True)]
    tables = [table(11), table(23), table(5)]
    packed = pack_step(plans, tables, 0, capacity=64, bucketed=False, dtype=torch.float32, device=torch.device("cpu"))
    assert packed.input_ids.shape == (1, 9) and packed.row_ids.tolist() == [[0, 1, 1, 1, 2, 2, 2, 2, 2]]
    assert packed.slot_ids.tolist() == [[10, 20, 21, 22, 0, 1, 2, 3, 4]] and packed.kv_length == 23
    assert packed.sample_rows == [0, 3, 8]
    narrow, gathered, alone = packed.ragged.groups
    assert narrow.mask.shape == (3, 1, 1, 23) and narrow.cache_rows is None  # the used slots, exactly
    assert gathered.mask.shape == (1, 1, 2, 23) and gathered.cache_rows.tolist() == [1]
    assert alone.mask.shape == (1, 1, 5, 5) and alone.cache_rows == 2

    decode_plans = plans[:2] + [plan(5, 1)]
    compiled = pack_step(decode_plans, [tables[0], tables[1], table(6)], 0, capacity=64, bucketed=True,
                         dtype=torch.float32, device=torch.device("cpu"))
    (group,) = compiled.ragged.groups
    assert compiled.input_ids.shape == (1, 5) and group.mask.shape == (3, 1, 3, 256)  # 5 rows, 3 wide: exact buckets
    many = [plan(10 + b, 3) for b in range(3)]  # 9 rows: the next multiple of 8, the padding at the spare slot
    compiled = pack_step(many, [table(13)] * 3, 0, capacity=300, bucketed=True, dtype=torch.float32,
                         device=torch.device("cpu"))
    assert compiled.input_ids.shape == (1, 16) and compiled.slot_ids[0, 9:].tolist() == [300] * 7


def test_a_compiled_step_runs_its_bucketed_shapes_through_the_compiled_forward(lively, monkeypatch):
    """The compiled path's shapes, without compiling: its compiled function is replaced by the eager step."""
    model, tokenizer = lively
    shapes = []

    def compiled(model, cache, input_ids, position_ids, attention_mask, ragged=None):
        shapes.append((input_ids.shape[1], tuple(ragged.groups[0].mask.shape)))
        return model_step(model, cache, input_ids, position_ids, attention_mask, ragged=ragged)

    forward = StepForward(model, compile=True)
    monkeypatch.setattr(forward, "_compiled", compiled)
    ids = encode_prompt(tokenizer, "Give three tips.")
    config = DecodeConfig(max_new_tokens=8)
    interpreters = [new_interpreter(model, tokenizer, ids, config, ReservationPolicy()) for _ in range(2)]
    batch = StepBatch(model, pad_token_id(tokenizer), forward)
    for interpreter in interpreters:
        batch.join(interpreter, 64)
    with torch.inference_mode(), ragged_attention(model):
        while not all(i.done for i in interpreters):
            step(batch)
    assert shapes and all(shape == (2, (2, 1, 1, 256)) for shape in shapes)  # the prefill ran eagerly
    alone = decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0].token_ids
    assert [i.main_ids for i in interpreters] == [alone, alone]


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
        with torch.inference_mode(), ragged_attention(model):
            while not request.done:
                step(batch)
        assert (request.main_ids, request.text(), request.finish_reason) == (
            reference.token_ids, reference.text, reference.stats.finish_reason)
        assert request_stats(request, RequestClock()).step_rows == reference.stats.step_rows  # what serving reports
