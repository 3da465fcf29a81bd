"""The scheduler alone, no model and no parser: the thread records are set as the interpreter would set them from
sampled tokens, and each `plan` is checked for what it feeds, where, and when."""

from __future__ import annotations

from helpers.fake_vocab import AB, AE, AS, PE, SY
from pasta.decoding.scheduler import Scheduler
from pasta.decoding.threads import Chunk, ChunkState, MainState, MainThread
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import MAIN_THREAD, ReservationPolicy

PROMPT = [1, 4]
POLICY = ReservationPolicy("exact")


def prefilled_scheduler(max_threads=4):
    """A scheduler past its prefill (the prompt fed, the main thread's first token sampled)."""
    main = MainThread(position=len(PROMPT))
    scheduler = Scheduler(PROMPT, main, [], VisibilityTable(max_threads, 8), policy=POLICY,
                          max_threads=max_threads, sync_id=SY)
    prefill = scheduler.plan()
    assert (prefill.token_ids, prefill.sample_threads) == (PROMPT, [MAIN_THREAD])
    return scheduler


def promise_end_sampled(scheduler, topic_id, num_predicted=2):
    """What the interpreter records when a valid promise's <|promise_end|> is sampled."""
    chunk = Chunk(index=len(scheduler.chunks), topic_ids=[topic_id], num_predicted=num_predicted,
                  opener_ids=[AS, topic_id, AB])
    scheduler.chunks.append(chunk)
    scheduler.main.pending = PE
    return chunk


def test_a_chunk_forks_when_its_promise_end_is_fed_with_its_opener_in_the_same_forward():
    scheduler = prefilled_scheduler()
    chunk = promise_end_sampled(scheduler, 5, num_predicted=2)
    plan = scheduler.plan()
    assert plan.token_ids == [PE, AS, 5, AB]
    assert plan.positions == [2, 3, 4, 5]
    assert plan.threads == [MAIN_THREAD, 1, 1, 1] and plan.sample_threads == [MAIN_THREAD, 1]
    assert chunk.state == ChunkState.RUNNING and chunk.num_reserved == POLICY.num_reserved(2)
    assert scheduler.main.position == 3 + POLICY.span(3, 2)  # the main thread skips the reservation
    # the chunk's row saw the main thread up to its promise_end, then its own opener
    assert scheduler.visibility.rows[chunk.row, :6].tolist() == [True] * 6
    assert scheduler.visibility.rows[MAIN_ROW, :6].tolist() == [True, True, True, False, False, False]


def test_a_promised_chunk_waits_for_its_promise_end_to_be_fed():
    scheduler = prefilled_scheduler()
    promise_end_sampled(scheduler, 5)
    scheduler.main.pending = None  # the main thread has nothing to feed yet (as when eos was sampled earlier)
    plan = scheduler.plan()
    assert plan.token_ids == [] and scheduler.chunks[0].state == ChunkState.FORKING


def test_a_sync_waits_for_every_chunk_of_its_group_then_feeds_after_their_closing_tokens():
    scheduler = prefilled_scheduler()
    first = promise_end_sampled(scheduler, 5)
    scheduler.plan()
    second = promise_end_sampled(scheduler, 6)
    scheduler.plan()
    scheduler.main.state, scheduler.main.pending = MainState.WAITING, SY  # the sync was sampled
    first.state, first.pending = ChunkState.CLOSED, [AE]
    second.pending = [7]
    waiting = scheduler.plan()
    assert waiting.token_ids == [7] and waiting.threads == [2]  # the sync waits for the running chunk
    second.state, second.pending = ChunkState.CLOSED, [AE]
    join = scheduler.plan()
    assert join.token_ids == [AE, AE, SY] and join.threads == [1, 2, MAIN_THREAD]
    assert join.sample_threads == [MAIN_THREAD]
    assert scheduler.main.state == MainState.RUNNING and first.joined and second.joined
    rows = scheduler.visibility.rows
    assert (rows[MAIN_ROW] >= rows[first.row]).all() and (rows[MAIN_ROW] >= rows[second.row]).all()


def test_a_chunk_beyond_max_threads_waits_in_the_queue_and_starts_when_one_closes():
    scheduler = prefilled_scheduler(max_threads=1)
    first = promise_end_sampled(scheduler, 5)
    scheduler.plan()
    second = promise_end_sampled(scheduler, 6)
    first.pending = [6]
    plan = scheduler.plan()
    second_pe_position = plan.positions[plan.token_ids.index(PE)]
    assert second.state == ChunkState.QUEUED and 2 not in plan.threads
    first.state, first.pending = ChunkState.CLOSED, [AE]  # the running chunk closes: its slot is free
    plan = scheduler.plan()
    assert plan.token_ids == [AS, 6, AB] and plan.threads == [2, 2, 2] and plan.sample_threads == [2]
    assert plan.positions == [second_pe_position + 1, second_pe_position + 2, second_pe_position + 3]
    assert second.state == ChunkState.RUNNING
