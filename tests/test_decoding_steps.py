"""The step loop and its pieces: cache rows that leave and join a running batch, ragged steps (every request's rows
packed, pasta/decoding/packing.py), StepBatch with requests arriving and leaving between steps (continuous
batching), the timing record of a step, and a failure that ends one request alone.
"""

from __future__ import annotations

import pytest
import torch

from helpers.models import Scripted, lively_model
from pasta.decoding import (
    DecodeConfig,
    DecodeError,
    SamplingConfig,
    decode,
    decode_async,
    decode_sequential,
    runner,
    stream_async,
)
from pasta.decoding.cache import SlotCache, StorePool
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.packing import narrow_width, pack_step
from pasta.decoding.requests import new_request, request_stats
from pasta.decoding.runner import StepBatch
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward, model_step
from pasta.decoding.text import pad_token_id
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import ReservationPolicy, TagIds, encode_text
from pasta.models import encode_prompt


def written_cache(num_rows: int, capacity: int, offset: float = 0.0) -> SlotCache:
    """A one-layer cache whose row b holds the value b + offset in its first two slots."""
    cache = SlotCache(num_layers=1, capacity=capacity, num_rows=num_rows)
    values = (torch.arange(num_rows, dtype=torch.float32) + offset).repeat_interleave(2)  # [2 B]: row b's 2 slots
    cache.place(torch.arange(num_rows).repeat_interleave(2)[None], torch.tensor([[0, 1] * num_rows]), kv_length=2,
                seq_length=0)
    states = values.view(1, 1, 2 * num_rows, 1).expand(1, 1, 2 * num_rows, 2).clone()  # [1, H, N, D]
    cache.layers[0].update(states, states.clone())
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


def stores(cache: SlotCache) -> list[torch.Tensor]:
    return [store for layer in cache.layers for store in (layer._key_store, layer._value_store)]


def test_a_released_cache_hands_its_stores_to_the_next_cache_of_its_pool_zeroed_layer_by_layer():
    pool = StorePool(capacity_multiple=8)
    first = SlotCache(num_layers=2, capacity=5, num_rows=2, pool=pool)
    assert first.capacity == 8  # rounded up, so that caches of other prompt lengths share shapes
    first.place(torch.tensor([[0, 1]]), torch.tensor([[0, 0]]), kv_length=1, seq_length=0)
    for layer in first.layers:
        layer.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    beside = written_cache(2, capacity=8)  # no pool: stores of its own
    addresses = [store.data_ptr() for store in stores(first)]
    first.release()
    second = SlotCache(num_layers=2, capacity=3, num_rows=2, pool=pool)
    second.place(torch.tensor([[1]]), torch.tensor([[2]]), kv_length=3, seq_length=0)
    for layer in second.layers:
        keys, _ = layer.update(torch.full((1, 1, 1, 2), 5.0), torch.full((1, 1, 1, 2), 5.0))
        assert keys[:, 0, :, 0].tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]]  # the first cache's ones are gone
    assert [store.data_ptr() for store in stores(second)] == addresses  # each layer's key and value stores
    assert not set(addresses) & {store.data_ptr() for store in stores(beside)}
    third = SlotCache(num_layers=2, capacity=8, num_rows=2, pool=pool)  # while `second` holds them: new ones
    third.place(torch.tensor([[0]]), torch.tensor([[0]]), kv_length=1, seq_length=0)
    for layer in third.layers:
        layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
    assert not set(addresses) & {store.data_ptr() for store in stores(third)}
    second.reserve(9)  # outgrows them: they go back to the pool, for the next cache of their shape
    assert second.capacity == 16 and pool.num_bytes() == sum(t.numel() * 4 for t in stores(third))


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


def greedy(logits: torch.Tensor, plan: StepPlan) -> list[int]:
    return logits.argmax(dim=-1).tolist()


def async_request(model, tokenizer, ids, config):
    return new_request("async", model, tokenizer, ids, config, ReservationPolicy())


def requests_of(batch: StepBatch) -> list:
    return [member.request for member in batch.members]


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
    interpreters = [async_request(model, tokenizer, ids, config) for ids in prompts]
    with StepBatch(model, pad_token_id(tokenizer)) as running:
        first = [running.join(interpreter, greedy, 64) for interpreter in interpreters[:2]]
        for _ in range(3):
            running.step()
        running.join(interpreters[2], greedy, 64)  # its prefill rides in the running requests' forward
        assert running.step().timing.prefill
        running.leave([first[0]])  # the first request leaves (cancelled); the last member takes its row
        assert requests_of(running) == [interpreters[2], interpreters[1]]
        finished = []
        while running.members:
            finished += [m.request for m in running.step().finished]  # finished members leave on their own
    assert [interpreters[1].main_ids, interpreters[2].main_ids] == [alone[1], alone[2]]
    assert sorted(map(id, finished)) == sorted(map(id, interpreters[1:]))
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
        mode = "sequential" if r in plain else "async"
        return new_request(mode, speaker, tokenizer, prompts[r], config, ReservationPolicy())

    groups_seen = set()

    def spy(*args, **kwargs):
        packed = pack_step(*args, **kwargs)
        kinds = {"narrow" if g.cache_rows is None else "alone" if isinstance(g.cache_rows, int) else "gathered"
                 for g in packed.ragged.groups}
        groups_seen.update(kinds if len(kinds) > 1 else set())
        return packed

    monkeypatch.setattr(runner, "pack_step", spy)
    requests = [request(r) for r in range(len(prompts))]
    with StepBatch(speaker, pad_token_id(tokenizer)) as batch:
        for r in (0, 1, 2):
            batch.join(requests[r], greedy, 64)
        for _ in range(2):
            batch.step()
        for r in (3, 4):
            batch.join(requests[r], greedy, 64)
        while batch.members:
            batch.step()
    assert [i.main_ids for i in requests] == alone
    assert [requests[r].num_threads for r in (0, 1, 3)] == [1, 0, 1]
    assert groups_seen == {"narrow", "alone", "gathered"}


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_a_capped_batch_admits_the_next_prompt_as_one_ends_and_each_samples_what_it_samples_alone(
        lively, monkeypatch, mode):
    """decode(max_batch=2) over five prompts: never more than two requests a step, a waiting prompt joins between
    steps as soon as one ends (the batch stays full while any wait), `on_result` hears each request once as it
    ends, and every request samples (temperature, its own seed) the tokens it samples alone."""
    _, tokenizer = lively
    speaker = forking_speaker(lively)
    config = DecodeConfig(max_new_tokens=12, max_chunk_tokens=6, sampling=SamplingConfig(temperature=1.0))
    texts = ["Tips Go", "Name a fruit.", "Hello there", "More tips, and a longer prompt here Go", "Give three tips."]
    prompts = [encode_prompt(tokenizer, text)[:-1] + encode_text(tokenizer, text[-3:]) if text.endswith("Go")
               else encode_prompt(tokenizer, text) for text in texts]
    seeds = [11, 12, 13, 14, 15]
    alone = [decode(speaker, tokenizer, [ids], config, mode=mode, policy=ReservationPolicy(), seeds=[seed])[0]
             for ids, seed in zip(prompts, seeds, strict=True)]
    sizes, ended = [], []
    step = StepBatch.step

    def counted(self):
        sizes.append(len(self.members))
        return step(self)

    monkeypatch.setattr(StepBatch, "step", counted)
    results = decode(speaker, tokenizer, prompts, config, mode=mode, policy=ReservationPolicy(), seeds=seeds,
                     max_batch=2, on_result=lambda i, result: ended.append((i, result)))
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]
    assert sizes == [2] * sizes.count(2) + [1] * sizes.count(1)  # full until the last prompt has joined
    assert sorted(i for i, _ in ended) == list(range(5)) and all(results[i] is r for i, r in ended)


def test_the_narrow_group_takes_the_width_with_the_fewest_query_rows():
    assert narrow_width([1] * 15 + [8], 16) == 1  # 16 + 1 * (7 + 2) query rows, where width 8 would take 128
    assert narrow_width([2] * 8, 8) == 2  # no wide group
    assert narrow_width([1, 4, 4, 4], 4) == 4  # three gathered rows would cost more than padding one request


def plan(start_slot: int, num_rows: int, *, prefill: bool = False, causal: bool = False) -> StepPlan:
    """A main-thread plan feeding `num_rows` tokens from `start_slot`, the last one sampling."""
    plan = StepPlan(start_slot, prefill=prefill, causal=causal)
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
    plans = [plan(10, 1), plan(20, 3), plan(0, 5, prefill=True, causal=True)]
    tables = [table(11), table(23), table(5)]
    packed = pack_step(plans, tables, 0, capacity=64, bucketed=False, dtype=torch.float32, device=torch.device("cpu"))
    assert packed.input_ids.shape == (1, 9) and packed.row_ids.tolist() == [[0, 1, 1, 1, 2, 2, 2, 2, 2]]
    assert packed.slot_ids.tolist() == [[10, 20, 21, 22, 0, 1, 2, 3, 4]] and packed.kv_length == 23
    assert packed.sample_rows == [0, 3, 8]
    narrow, gathered, alone = packed.ragged.groups
    assert narrow.mask.shape == (3, 1, 1, 23) and narrow.cache_rows is None  # the used slots, exactly
    assert gathered.mask.shape == (1, 1, 2, 23) and gathered.cache_rows.tolist() == [1]
    assert alone.mask is None and alone.causal and alone.num_slots == 5 and alone.cache_rows == 2  # generate's
    assert (packed.num_rows, packed.num_slots, packed.prefill) == (9, 11 + 23 + 5, True)

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

    def compiled(model, cache, input_ids, position_ids, ragged):
        shapes.append((input_ids.shape[1], tuple(ragged.groups[0].mask.shape)))
        return model_step(model, cache, input_ids, position_ids, ragged)

    forward = StepForward(model, compile=True)
    monkeypatch.setattr(forward, "_compiled", compiled)
    ids = encode_prompt(tokenizer, "Give three tips.")
    config = DecodeConfig(max_new_tokens=8)
    interpreters = [async_request(model, tokenizer, ids, config) for _ in range(2)]
    with StepBatch(model, pad_token_id(tokenizer), forward) as batch:
        for interpreter in interpreters:
            batch.join(interpreter, greedy, 64)
        while batch.members:
            batch.step()
    assert shapes and all(shape == (2, (2, 1, 1, 256)) for shape in shapes)  # the prefill ran eagerly
    alone = decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0].token_ids
    assert [i.main_ids for i in interpreters] == [alone, alone]


def test_consecutive_compiled_decodes_write_into_the_same_cache_stores(lively, monkeypatch):
    """CUDA graphs replay on the stores' addresses: a compiled step's next decode call (a new batch, a new cache)
    gets the stores the last one released. Without compiling: the compiled function is the eager step."""
    model, tokenizer = lively
    addresses = []

    def compiled(model, cache, input_ids, position_ids, ragged):
        logits = model_step(model, cache, input_ids, position_ids, ragged)
        addresses[-1].append([store.data_ptr() for store in stores(cache)])
        return logits

    prompts = [encode_prompt(tokenizer, "Give three tips."), encode_prompt(tokenizer, "Name a fruit, please, now.")]
    config = DecodeConfig(max_new_tokens=8)
    answers = []
    for ids in prompts:  # prompts of other lengths: their capacities round up to the same slot bucket
        forward = StepForward(model, compile=True)
        monkeypatch.setattr(forward, "_compiled", compiled)
        interpreter = async_request(model, tokenizer, ids, config)
        addresses.append([])
        with StepBatch(model, pad_token_id(tokenizer), forward) as batch:
            batch.join(interpreter, greedy, len(ids) + 72)
            while batch.members:
                batch.step()
            assert batch.cache is None
        answers.append(interpreter.main_ids)
    first_step = addresses[0][0]
    assert all(steps and all(step == first_step for step in steps) for steps in addresses)
    assert answers == [decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0].token_ids
                       for ids in prompts]


def test_a_step_is_timed_once_and_each_request_counts_its_prefill_and_decode_steps(lively):
    model, tokenizer = lively
    config = DecodeConfig(max_new_tokens=6)
    prompts = [encode_prompt(tokenizer, text) for text in ("Name a fruit.", "Hello there")]
    requests = [new_request("sequential", model, tokenizer, ids, config) for ids in prompts]
    timings = []
    with StepBatch(model, pad_token_id(tokenizer)) as batch:
        first = batch.join(requests[0], greedy, 64)
        timings.append(batch.step().timing)  # the first request's prompt alone
        second = batch.join(requests[1], greedy, 64)
        while batch.members:
            timings.append(batch.step().timing)
    assert [(t.prefill, t.num_requests) for t in timings[:3]] == [(True, 1), (True, 2), (False, 2)]
    assert timings[1].num_rows == 1 + len(prompts[1]) and timings[1].num_slots == len(prompts[0]) + 1 + len(prompts[1])
    for timing in timings:
        assert timing.step_s == pytest.approx(timing.host_s + timing.forward_s + timing.choose_s)
    assert first.clock.prefill_s == pytest.approx(timings[0].step_s)
    assert first.clock.decode_s == pytest.approx(sum(t.step_s for t in timings[1:6]))
    assert second.clock.prefill_s == pytest.approx(timings[1].step_s)
    assert first.clock.host_s == pytest.approx(sum(t.host_s for t in timings[:6]))
    stats = request_stats(second.request, second.clock)
    assert (stats.prefill_s, stats.wall_s, stats.bookkeeping_s) == (
        second.clock.prefill_s, second.clock.wall_s, second.clock.host_s)
    assert stats.wall_s == pytest.approx(stats.bookkeeping_s + stats.forward_s + stats.choose_s)
    assert second.clock.forward_s == pytest.approx(sum(t.forward_s for t in timings[1:]))


@pytest.mark.parametrize(("mode", "method", "reason"), [
    ("async", "commit", "sampling or committing"), ("sequential", "commit", "sampling or committing"),
    ("async", "plan", "planning"), ("sequential", "plan", "planning")])
def test_a_request_whose_step_fails_ends_alone_and_the_call_raises_its_reason(lively, monkeypatch, mode, method,
                                                                             reason):
    """The failing request leaves the batch with the reason every caller reports (the server's error body); the
    others decode what they decode alone, and the library call raises a DecodeError with them attached. One that
    fails planning leaves before the step's forward: the last request takes its cache row, and the plans follow."""
    model, tokenizer = lively
    config = DecodeConfig(max_new_tokens=8)
    texts = ("Name a fruit.", "Give three tips.", "Hello there", "Write a haiku about rain.")
    prompts = [encode_prompt(tokenizer, text) for text in texts]
    alone = decode(model, tokenizer, prompts, config, mode=mode, policy=ReservationPolicy())
    request_type = Interpreter if mode == "async" else type(new_request("sequential", model, tokenizer, [1], config))
    original = getattr(request_type, method)

    def fragile(self, *args):
        if self.prompt_ids == prompts[1] and len(self.main_ids) == 2:
            raise RuntimeError("injected failure")
        return original(self, *args)

    monkeypatch.setattr(request_type, method, fragile)
    with pytest.raises(DecodeError, match=f"^{reason} the step failed: injected failure$") as raised:
        decode(model, tokenizer, prompts, config, mode=mode, policy=ReservationPolicy())
    assert raised.value.failed_indices == [1]
    others = [member.request.main_ids for i, member in enumerate(raised.value.members) if i != 1]
    assert others == [alone[i].token_ids for i in (0, 2, 3)]


def test_streaming_a_request_whose_step_fails_yields_what_was_final_then_raises_its_reason(lively, monkeypatch):
    model, tokenizer = lively
    config = DecodeConfig(max_new_tokens=8)
    ids = encode_prompt(tokenizer, "Give three tips.")
    alone = decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0]
    commit = Interpreter.commit

    def fragile_commit(self, plan, token_ids):
        if len(self.main_ids) == 3:
            raise RuntimeError("injected failure")
        commit(self, plan, token_ids)

    monkeypatch.setattr(Interpreter, "commit", fragile_commit)
    pieces: list[str] = []
    with pytest.raises(DecodeError, match="^sampling or committing the step failed: injected failure$") as raised:
        pieces.extend(stream_async(model, tokenizer, ids, config, ReservationPolicy()))
    assert raised.value.failed_indices == [0]
    assert raised.value.members[0].request.main_ids == alone.token_ids[:3]
    assert alone.text.startswith("".join(pieces))


def test_a_forward_that_raises_is_raised_to_the_caller(lively, monkeypatch):
    model, tokenizer = lively

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(runner.StepForward, "__call__", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        decode_sequential(model, tokenizer, [encode_prompt(tokenizer, "Hi")], DecodeConfig(max_new_tokens=4))
