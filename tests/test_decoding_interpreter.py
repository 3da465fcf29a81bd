"""The interpreter alone, no model: scripted token streams through fork, join, limits and malformed tags.

A fake vocabulary (tests/helpers/fake_vocab.py) stands in for the tokenizer, and `drive` plays each thread's
script, checking the bookkeeping the runner would hand to the model.
"""

from __future__ import annotations

import pytest
import torch

from helpers.fake_vocab import AB, AE, AS, EOS, PE, PT, SY, TAGS, WORDS, P, decode, promise
from helpers.packing import group_visible
from pasta.decoding import DecodeConfig
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.packing import pack_step
from pasta.decoding.visibility import MAIN_ROW, PAD_ROW
from pasta.lang import ReservationPolicy, parse, plain_text, schedule


def interpreter(config=None, policy=None, prompt=(1, 4)):
    return Interpreter(list(prompt), tag_ids=TAGS, eos_ids={EOS}, policy=policy or ReservationPolicy("exact"),
                       config=config or DecodeConfig(max_new_tokens=64), decode=decode, capacity=8)


def drive(it, main, chunks=(), max_steps=500, on_plan=None):
    """Play the scripts (main-thread tokens, then each chunk's tokens in fork order). Returns the plans;
    `on_plan(plan)` sees each plan before its tokens are committed."""
    scripts = {0: list(main), **{k + 1: list(c) for k, c in enumerate(chunks)}}
    plans = []
    while not it.done and len(plans) < max_steps:
        plan = it.plan()
        plans.append(plan)
        if on_plan:
            on_plan(plan)
        it.commit(plan, [scripts[thread].pop(0) for thread in plan.sample_threads])
    assert it.done, "the interpreter never finished"
    return plans


# --- fork, join, positions ------------------------------------------------------------------------------------


def test_chunk_opener_rides_with_its_promise_end_and_starts_one_position_later():
    it = interpreter(policy=ReservationPolicy("exact"))
    main = [1, *promise([5], 3), 2, EOS]
    plans = drive(it, main, [[6, 7, AE]])
    fork_step = next(p for p in plans if PE in p.token_ids)
    pe = fork_step.token_ids.index(PE)
    assert fork_step.token_ids[pe + 1 :] == [AS, 5, AB]
    pe_position = fork_step.positions[pe]
    assert fork_step.positions[pe + 1 :] == [pe_position + 1, pe_position + 2, pe_position + 3]
    # main goes on after the reservation: opener (3) + N (3) + async_end (1)
    next_main = next(p for p in plans[plans.index(fork_step) + 1 :] if 2 in p.token_ids)
    assert next_main.positions[next_main.token_ids.index(2)] == pe_position + 1 + 3 + 3 + 1
    # the fork step samples for the main thread and for the chunk
    assert fork_step.sample_threads == [0, 1]


def test_an_uncounted_promise_forks_its_chunk_and_reserves_the_fixed_span():
    it = interpreter(policy=ReservationPolicy("uncounted", fixed=10))
    plans = drive(it, [1, P, 5, PE, 2, EOS], [[6, 7, AE]])
    fork_step = next(p for p in plans if PE in p.token_ids)
    pe_position = fork_step.positions[fork_step.token_ids.index(PE)]
    assert fork_step.token_ids[fork_step.token_ids.index(PE) + 1 :] == [AS, 5, AB]
    next_main = next(p for p in plans[plans.index(fork_step) + 1 :] if 2 in p.token_ids)
    assert next_main.positions[next_main.token_ids.index(2)] == pe_position + 1 + 3 + 10 + 1
    assert it.malformed == {} and it.text() == "Tips early walk one"
    assert it.document().promises[0].num_tokens is None


def test_sync_waits_for_the_chunk_and_feeds_its_async_end_before_the_sync():
    it = interpreter()
    main = [*promise([5], 4), SY, 2, EOS]
    plans = drive(it, main, [[6, 6, 6, 7, AE]])
    join = next(p for p in plans if SY in p.token_ids)
    assert join.token_ids == [AE, SY]
    assert join.sample_threads == [0]
    # while the chunk runs after the sync was sampled, only the chunk feeds
    waiting = plans[plans.index(join) - 1]
    assert waiting.threads == [1]


def test_steps_and_tokens_match_the_schedule():
    from pasta.lang import TokenChunk, TokenDoc

    main = [1, *promise([5], 2), *promise([6], 9), 3, SY, 2, *promise([7], 1), 4, EOS]
    chunks = [[6, AE], [7, 7, 7, 7, 7, AE], [2, 2, AE]]
    it = interpreter()
    plans = drive(it, main, chunks)
    doc = TokenDoc(main, [TokenChunk([AS, 0, AB], c, 1) for c in chunks], TAGS)
    expected = schedule(doc)
    assert (it.num_steps, it.num_sampled) == (expected.num_steps, expected.num_tokens) == (len(plans), doc.num_tokens)


def test_main_rows_never_see_unjoined_chunks_and_chunks_never_see_each_other():
    it = interpreter()
    main = [*promise([5], 2), *promise([6], 2), 3, 3, SY, 2, EOS]
    owner = {}  # slot -> thread
    joined = []

    def check(plan):
        for i, thread in enumerate(plan.threads):
            owner[plan.start_slot + i] = thread
        used = plan.start_slot + len(plan.token_ids)
        packed = pack_step([plan], [it.vis], 0, capacity=used, bucketed=False, dtype=torch.float32,
                           device=torch.device("cpu"))
        (group,) = packed.ragged.groups  # one request: its rows attend in one group
        visible = group_visible(group, len(plan.token_ids))  # [q, used]
        for i, thread in enumerate(plan.threads):
            seen = {owner[s] for s in range(visible.shape[1]) if visible[i, s]}
            if thread != 0:
                assert seen <= {0, thread}, (thread, seen)
            elif plan.token_ids[i] == SY or joined:
                joined.append(True)
                assert seen == {0, 1, 2}, seen
            else:
                assert seen == {0}, seen

    drive(it, main, [[6, 6, AE], [7, 7, AE]], on_plan=check)
    assert joined


def test_queued_promises_start_when_a_running_chunk_closes():
    it = interpreter(DecodeConfig(max_new_tokens=64, max_threads=1))
    main = [*promise([5], 2), *promise([6], 2), SY, EOS]
    plans = drive(it, main, [[6, 6, 6, 6, AE], [7, AE]])
    running = [sum(1 for t in p.sample_threads if t > 0) for p in plans]
    assert max(running) == 1
    last_chunk_step = max(i for i, p in enumerate(plans) if 1 in p.sample_threads)
    second_opener = next(i for i, p in enumerate(plans) if 2 in p.threads)
    assert second_opener == last_chunk_step + 1
    assert it.text() == decode([6, 6, 6, 6]) + decode([7])
    assert it.num_threads == 2


def test_promise_end_as_the_last_allowed_main_token_still_forks():
    # a total budget above the main thread's, so that the chunk may run after the main thread's last token
    it = interpreter(DecodeConfig(max_new_tokens=len(promise([5], 2)), max_total_tokens=64, free_tag_tokens=0))
    drive(it, promise([5], 2), [[6, 6, AE]])
    assert it.finish_reason == "max_new_tokens"
    assert it.text() == decode([6, 6])
    assert it.num_threads == 1


def test_visibility_rows_are_reused_after_a_join():
    it = interpreter()
    main = []
    chunks = []
    for topic in (5, 6, 7, 5, 6, 7):
        main += [*promise([topic], 1), SY]
        chunks.append([topic, AE])
    drive(it, [*main, EOS], chunks)
    assert it.vis.shape[0] == 2 + it.config.max_threads  # never grew
    assert it.vis[PAD_ROW].sum() == 1 and it.vis[PAD_ROW, 0]


# --- text, annotated, token_doc ---------------------------------------------------------------------------------


def test_text_splices_chunks_at_their_promises_and_annotated_parses_back():
    it = interpreter()
    main = [1, 4, *promise([5], 2), *promise([6], 2), SY, 9, 7, EOS]
    drive(it, main, [[2, 3, AE], [3, AE]])
    assert it.text() == "Tips: one two two\n walk"
    doc = parse(it.annotated())
    assert plain_text(doc) == it.text()
    assert [p.topic for p in doc.promises] == [" sleep", " early"]
    assert [p.num_tokens for p in doc.promises] == [2, 2]
    token_doc = it.token_doc()
    assert token_doc.main_ids == main
    assert [c.body_ids for c in token_doc.chunks] == [[2, 3, AE], [3, AE]]


def test_final_text_grows_as_a_prefix_and_holds_text_after_an_open_chunk():
    it = interpreter()
    main = [1, *promise([5], 2), 2, 3, EOS]
    scripts = {0: list(main), 1: [6, 6, 6, 6, 6, AE]}
    seen = []
    while not it.done:
        plan = it.plan()
        it.ensure_capacity(plan.start_slot + len(plan.token_ids))
        it.commit(plan, [scripts[t].pop(0) for t in plan.sample_threads])
        seen.append(it.final_text())
    for before, after in zip(seen, seen[1:], strict=False):
        assert after.startswith(before)
    assert "Tips" in seen[1] and " one" not in seen[-3]  # main text after the promise waits for the chunk
    assert seen[-1] == it.text() == "Tips" + " early" * 5 + " one two"


# --- malformed output ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "kind", "text"),
    [
        ([1, P, 5, 6, EOS], "unclosed_promise", "Tips sleep early"),
        ([1, P, 5, P, 6, PT, 12, PE, SY, EOS], "unclosed_promise", "Tips sleep early"),
        ([1, P, 5, SY, 2, EOS], "unclosed_promise", "Tips sleep one"),
        ([1, P, 5, 8, PT, 12, PE, 2, EOS], "bad_topic", 'Tips sleep"2 one'),
        ([1, P, PT, 12, PE, 2, EOS], "bad_topic", "Tips2 one"),
        ([1, P, *[5] * 101, PT, 12, PE, EOS], "bad_topic", "Tips" + " sleep" * 101 + "2"),
        ([1, P, 5, PT, 1, PE, 2, EOS], "bad_count", "Tips sleepTips one"),
        ([1, P, 5, PT, PE, 2, EOS], "bad_count", "Tips sleep one"),
        ([1, P, 5, PT, 10, PE, 2, EOS], "bad_count", "Tips sleep0 one"),
        ([1, AE, 2, AS, AB, EOS], "async_tag_in_main", "Tips one"),
        ([1, PT, 2, PE, EOS], "stray_promise_tag", "Tips one"),
    ],
)
def test_malformed_main_thread_falls_back_to_literal_text(main, kind, text):
    chunks = [[6, AE]] if main.count(PE) and kind == "unclosed_promise" and SY in main[main.index(PE) :] else []
    it = interpreter(DecodeConfig(max_new_tokens=200))
    drive(it, main, chunks)
    assert it.malformed[kind] >= 1
    assert it.text() == text
    assert it.num_threads == len(chunks)
    assert plain_text(parse(it.annotated())) == it.text()
    it.token_doc()  # a valid TokenDoc


def test_duplicate_topic_in_one_group_is_literal_and_allowed_after_a_sync():
    it = interpreter()
    main = [*promise([5], 1), *promise([5], 1), SY, *promise([5], 1), EOS]
    drive(it, main, [[6, AE], [7, AE]])
    assert it.malformed == {"duplicate_topic": 1}
    assert it.num_threads == 2
    assert it.text() == " early sleep1 walk"


@pytest.mark.parametrize(
    ("chunk", "kind", "content"),
    [
        ([6, P, 7, AE], "tag_in_chunk", " early walk"),
        ([6, SY, 7, AE], "tag_in_chunk", " early walk"),
        ([6, AB, 7, AE], "tag_in_chunk", " early walk"),
        ([6, 7, EOS], "eos_in_chunk", " early walk"),
        ([6, 7, 6, 7, 6, 7], "chunk_cap", " early walk early walk"),
        ([AE], "empty_chunk", ""),
    ],
)
def test_malformed_chunk_is_cleaned_and_counted(chunk, kind, content):
    it = interpreter(DecodeConfig(max_new_tokens=64, max_chunk_tokens=4))
    drive(it, [1, *promise([5], 2), SY, 2, EOS], [chunk])
    assert it.malformed[kind] == 1
    assert it.text() == "Tips" + content + " one"
    doc = it.token_doc()
    assert all(t not in TAGS.all for t in doc.main_ids if t not in (P, PT, PE, SY))
    for c in doc.chunks:
        assert c.body_ids[-1] == AE and not set(c.body_ids[:-1]) & TAGS.all


def test_overrun_of_the_reservation_is_counted_and_the_chunk_keeps_going():
    it = interpreter(policy=ReservationPolicy("exact"))
    drive(it, [*promise([5], 1), SY, EOS], [[6, 6, 6, 6, AE]])
    assert it.num_overruns == 1
    assert it.text() == " early" * 4
    assert not it.malformed


def test_eos_ends_the_main_thread_while_chunks_run_on():
    it = interpreter()
    plans = drive(it, [*promise([5], 1), EOS], [[6, 6, 6, AE]])
    assert it.finish_reason == "eos"
    assert plans[-1].threads == [1]
    assert it.text() == " early" * 3


def test_all_threads_together_get_a_sequential_answers_budget_by_default():
    config = DecodeConfig(max_new_tokens=10, free_tag_tokens=0)
    assert config.total_token_budget == 10
    it = interpreter(config)
    drive(it, [*promise([5], 2), SY, 8, 8, 8, 8, EOS], [[6] * 20 + [AE]])
    assert it.num_sampled == 10
    assert it.finish_reason == "max_total_tokens"


def test_a_forked_answer_holds_a_sequential_answers_text_by_default_its_tags_on_top():
    """The tags a fork costs (a promise's 5 tokens here) do not take words from an answer with the default budget."""
    it = interpreter(DecodeConfig(max_new_tokens=10))
    drive(it, [*promise([5], 2), *[2] * 20, EOS], [[6] * 20])  # 5 tags, then words in both threads
    assert it.finish_reason == "max_total_tokens"
    assert it.num_tag_tokens == 5 and it.num_sampled == 15
    assert len(it.text().split()) == 10


def test_tags_past_free_tag_tokens_spend_the_budget_as_text_does():
    it = interpreter(DecodeConfig(max_new_tokens=10, free_tag_tokens=2))
    drive(it, [*promise([5], 2), *[2] * 20, EOS], [[6] * 20])
    assert it.num_sampled == 12 and len(it.text().split()) == 7  # 5 tags, 3 of them spending


def test_free_tags_never_let_the_main_thread_past_its_own_cap_in_text():
    it = interpreter(DecodeConfig(max_new_tokens=6, max_total_tokens=64))
    drive(it, [1, *promise([5], 2), 2, 2, 2, 2, 2, 2, 2, EOS], [[6, AE]])
    assert it.finish_reason == "max_new_tokens"
    assert it.main_ids == [1, *promise([5], 2), 2, 2, 2, 2, 2]  # 6 text tokens, the promise's 5 on top


def test_max_total_tokens_stops_every_thread():
    it = interpreter(DecodeConfig(max_new_tokens=64, max_total_tokens=12, free_tag_tokens=0))
    drive(it, [*promise([5], 9), *promise([6], 9), 2, 2, 2, 2, 2, 2, 2], [[6] * 20, [7] * 20])
    assert it.num_sampled == 12
    assert it.finish_reason == "max_total_tokens"
    assert it.token_doc().chunks[0].body_ids[-1] == AE


def test_max_total_tokens_that_cuts_a_chunk_after_the_main_threads_eos_is_the_finish_reason():
    """A list of promises then eos, the chunks running on (the usual ending): a budget that cuts a chunk cuts the
    answer, which counts as cut (evaluations, pairing), and the main thread's eos stays in its token doc."""
    it = interpreter(DecodeConfig(max_new_tokens=10, free_tag_tokens=0))
    drive(it, [1, *promise([5], 1), EOS], [[6] * 20 + [AE]])
    assert it.finish_reason == "max_total_tokens" and it.num_sampled == 10
    assert it.token_doc().main_ids[-1] == EOS
    ended = interpreter(DecodeConfig(max_new_tokens=64, free_tag_tokens=0))
    drive(ended, [1, *promise([5], 1), EOS], [[6, 6, AE]])  # every chunk closed before the budget: eos
    assert ended.finish_reason == "eos" and ended.token_doc().main_ids[-1] == EOS


def test_max_total_tokens_inside_a_promise_cuts_it_without_a_malformed_event_or_its_topic_as_text():
    # The chunk spends the shared budget as well: it runs out while the main thread writes its second promise.
    first = [1, *promise([5], 9)]
    it = interpreter(DecodeConfig(max_new_tokens=64, max_total_tokens=len(first) + 4, free_tag_tokens=0))
    drive(it, [*first, P, 7, 7, 7, 7, 7, PT, 13, PE, EOS], [[6] * 20])
    assert it.finish_reason == "max_total_tokens"
    assert not it.malformed
    assert it.text() == "Tips" + " early" * 2 and " walk" not in it.text()


def test_stop_string_in_main_text_truncates_it():
    it = interpreter(DecodeConfig(max_new_tokens=64, stop_strings=(" two",)))
    drive(it, [1, 2, 3, 5, 6], [])
    assert it.finish_reason == "stop_string"
    assert it.text() == "Tips one"
    assert it.main_ids == [1, 2, 3]


def test_main_row_and_pad_row_are_reserved():
    it = interpreter()
    plan = it.plan()
    assert plan.rows == [MAIN_ROW, MAIN_ROW] and plan.positions == [0, 1] and plan.sample_feeds == [1]
    assert it.vis[PAD_ROW, 0]


# --- constraints (decode.constrain) ---------------------------------------------------------------------------------


def fake_grammar():
    from pasta.decoding.grammar import Grammar

    return Grammar([WORDS.get(i, "") for i in range(107)], TAGS, {EOS}, 107, "cpu")


def first_violation(it, main, chunks=(), grammar=None):
    """Play the scripts as `drive` does, asking each sampled thread's constraint before its token is committed.
    Returns the kind of the first token a constraint forbids (None if none), and checks that every state reached
    before it (as constrained decoding reaches states) leaves a token."""
    grammar = grammar or fake_grammar()
    scripts = {0: list(main), **{k + 1: list(c) for k, c in enumerate(chunks)}}
    found = None
    while not it.done:
        plan = it.plan()
        token_ids = [scripts[thread].pop(0) for thread in plan.sample_threads]
        for thread, token_id in zip(plan.sample_threads, token_ids, strict=True):
            if found is None:
                constraint = it.constraint(thread, grammar)
                assert constraint.allowed.any()
                if not constraint.allowed[token_id]:
                    found = constraint.violation(token_id)
        it.commit(plan, token_ids)
    return found


@pytest.mark.parametrize(
    ("main", "chunks", "kind"),
    [
        ([1, P, 5, 6, EOS], [], "unclosed_promise"),
        ([1, P, 5, SY, 2, EOS], [], "unclosed_promise"),
        ([1, P, 5, 8, PT, 12, PE, 2, EOS], [], "bad_topic"),
        ([1, P, 9, PT, 12, PE, 2, EOS], [], "bad_topic"),
        ([1, P, PT, 12, PE, 2, EOS], [], "bad_topic"),
        ([1, P, 5, *[11] * 100, PT, 12, PE, EOS], [], "bad_topic"),  # one word past 100 characters
        ([1, P, 5, PT, 1, PE, 2, EOS], [], "bad_count"),
        ([1, P, 5, PT, PE, 2, EOS], [], "bad_count"),
        ([1, P, 5, PT, 10, PE, 2, EOS], [], "bad_count"),
        ([1, P, 5, PT, *[11] * 9, PE, 2, EOS], [], "bad_count"),
        ([1, AE, 2, AS, AB, EOS], [], "async_tag_in_main"),
        ([1, PT, 2, PE, EOS], [], "stray_promise_tag"),
        ([*promise([5], 1), *promise([5], 1), SY, EOS], [[6, AE], [7, AE]], "duplicate_topic"),
        ([1, *promise([5], 2), SY, 2, EOS], [[6, P, 7, AE]], "tag_in_chunk"),
        ([1, *promise([5], 2), SY, 2, EOS], [[6, 7, EOS]], "eos_in_chunk"),
        ([1, *promise([5], 2), SY, 2, EOS], [[6, 7, 6, 7, 6, 7]], "chunk_cap"),
        ([1, *promise([5], 2), SY, 2, EOS], [[AE]], "empty_chunk"),
    ],
)
def test_constraint_forbids_the_first_token_of_each_malformed_event_the_interpreter_counts(main, chunks, kind):
    it = interpreter(DecodeConfig(max_new_tokens=200, max_chunk_tokens=4))
    assert first_violation(it, main, chunks) == kind
    assert it.malformed[kind] >= 1


@pytest.mark.parametrize(
    ("main", "chunks"),
    [
        ([1, *promise([5], 2), SY, 2, EOS], [[6, 7, AE]]),
        # a new topic after the sync: the grammar keeps every topic of an answer apart, though the language allows
        # a list to repeat an earlier list's (tests/test_decoding_constrain.py)
        ([*promise([5], 1), *promise([5, 6], 12), SY, *promise([7], 3), EOS], [[6, AE], [7, AE], [2, AE]]),
        ([1, SY, SY, 2, 3, EOS], []),
    ],
)
def test_constraint_allows_every_token_of_well_formed_output(main, chunks):
    it = interpreter()
    assert first_violation(it, main, chunks) is None
    assert not it.malformed


@pytest.mark.parametrize(
    ("main", "max_new_tokens"),
    [
        ([1, 2, 3, P, 5, PT, 12], 7),  # <|promise|> with 4 tokens left could not close
        ([1, 2, P, 5, 6, PT, 12], 7),  # a topic token with 3 left
        ([1, P, 5, PT, 12, 13], 6),  # a second digit with 1 left
    ],
)
def test_constraint_closes_a_promise_before_max_new_tokens(main, max_new_tokens):
    it = interpreter(DecodeConfig(max_new_tokens=max_new_tokens, free_tag_tokens=0))
    assert first_violation(it, main) == "unclosed_promise"
    assert it.malformed == {"unclosed_promise": 1}


@pytest.mark.parametrize("max_total_tokens", [17, 18])  # 17: <|promise|> on the last 3 tokens, 1 left after the step
def test_constraint_leaves_a_topic_token_where_the_chunks_spent_the_budget_the_promise_needed_to_close(
        max_total_tokens):
    """The main thread opens a promise with room to close it, and in the same steps its chunk spends what
    max_total_tokens had left: the topic then has neither budget nor text to close on. A topic token stays legal
    there (a state with no legal token failed the whole decode: a preference round's sampling died of it), and the
    shared budget cuts the promise, as it cuts a chunk mid-sentence."""
    it = interpreter(DecodeConfig(max_new_tokens=64, max_total_tokens=max_total_tokens, free_tag_tokens=0))
    assert first_violation(it, [1, *promise([5], 9), 2, 2, 2, 2, P, 7, 7, PE, *[2] * 20, EOS], [[6] * 30]) is None
    assert it.finish_reason == "max_total_tokens"
    assert not it.malformed


@pytest.mark.parametrize("budget", [0, 1])
def test_with_no_budget_left_a_promise_that_can_close_must_close_and_one_that_cannot_may_go_on(budget):
    grammar = fake_grammar()
    closable_topic, empty_topic = grammar.topic([5], " sleep", set(), budget), grammar.topic([], "", set(), budget)
    assert closable_topic.allowed[PE] and not closable_topic.allowed[7]
    assert empty_topic.allowed[7] and not empty_topic.allowed[PE] and not empty_topic.allowed[EOS]
    closable_count, empty_count = grammar.count([12], "2", budget), grammar.count([], "", budget)
    assert closable_count.allowed[PE] and not closable_count.allowed[13]
    assert empty_count.allowed[13] and not empty_count.allowed[PE] and not empty_count.allowed[EOS]


def test_constraint_lets_a_promise_open_on_the_last_text_tokens_when_its_tags_are_free():
    """The same promise as above, opened with 4 text tokens left: 4 of its 5 tags are free, so it closes in time."""
    it = interpreter(DecodeConfig(max_new_tokens=7, free_tag_tokens=4))
    assert first_violation(it, [1, 2, 3, *promise([5], 2), 2, 2, 2, 2], [[6, AE]]) is None
    assert not it.malformed and it.num_threads == 1


def test_constraint_keeps_a_chunk_from_ending_empty_at_its_cap():
    grammar = fake_grammar()
    blank_first = grammar.chunk(has_text=False, num_left=2)
    assert not blank_first.allowed[AE] and blank_first.allowed[6]
    assert grammar.chunk(has_text=True, num_left=1).allowed.nonzero().flatten().tolist() == [AE]
    assert grammar.chunk(has_text=False, num_left=1).allowed.nonzero().flatten().tolist() == [AE]


def test_constraint_never_lets_a_topic_become_a_duplicate_where_it_cannot_grow():
    grammar = fake_grammar()
    # 2 tokens left: " sleep" would make the topic " sleep" again, and only a closing tag could follow.
    assert not grammar.topic([], "", {" sleep"}, budget=2).allowed[5]
    assert grammar.topic([], "", {" sleep"}, budget=3).allowed[5]
    assert not grammar.topic([5], " sleep", {" sleep"}, budget=5).allowed[PT]
    assert not grammar.topic([5], " sleep", {" sleep"}, budget=5).allowed[PE]


def test_constraint_closes_a_promise_uncounted_when_no_count_fits():
    grammar = fake_grammar()
    assert grammar.topic([5], " sleep", set(), budget=3).allowed[PT]
    two_left = grammar.topic([5], " sleep", set(), budget=2)
    assert two_left.allowed[PE] and not two_left.allowed[PT] and two_left.allowed[6]
    one_left = grammar.topic([5], " sleep", set(), budget=1)
    assert one_left.allowed.nonzero().flatten().tolist() == [PE]
    assert one_left.forced and not two_left.forced  # the one step jump-forward could skip


# --- the renderer alone ---------------------------------------------------------------------------------------


def rendered_items():
    """Main text, a closed chunk with text, an empty closed chunk, a sync, then text still being written."""
    from pasta.decoding.threads import Chunk, ChunkState, PromiseItem, SyncItem, TextRun

    kept = Chunk(index=0, topic_ids=[5], num_predicted=2, opener_ids=[AS, 5, AB], state=ChunkState.CLOSED,
                 body_ids=[6, 7, AE])  # fmt: skip
    empty = Chunk(index=1, topic_ids=[7], num_predicted=1, opener_ids=[AS, 7, AB], state=ChunkState.CLOSED,
                  body_ids=[9, AE])  # fmt: skip
    return [TextRun([1, 4]), PromiseItem(kept, [12]), PromiseItem(empty, [11]), SyncItem(), TextRun([2, 3])]


def test_renderer_splices_chunks_with_text_and_leaves_empty_ones_out():
    from pasta.decoding.render import Renderer

    renderer = Renderer(decode, TAGS)
    items = rendered_items()
    assert renderer.text(items) == "Tips: early walk one two"
    assert plain_text(renderer.document(items)) == renderer.text(items)
    doc = renderer.token_doc(items, eos_id=EOS)
    assert doc.main_ids == [1, 4, *promise([5], 2), SY, 2, 3, EOS]
    assert [chunk.body_ids for chunk in doc.chunks] == [[6, 7, AE]]


def test_settled_text_stops_at_a_running_chunk_and_renders_each_final_item_once():
    from pasta.decoding.render import Renderer, SettledText
    from pasta.decoding.threads import ChunkState

    decoded = []

    def counting_decode(ids):
        decoded.append(list(ids))
        return decode(ids)

    items = rendered_items()
    items[1].chunk.state = ChunkState.RUNNING
    settled = SettledText(Renderer(counting_decode, TAGS), max_stop_len=0)
    assert settled.text(items) == "Tips:"
    items[1].chunk.state = ChunkState.CLOSED
    assert settled.text(items) == "Tips: early walk one two"
    decoded.clear()
    items[-1].ids.append(2)  # the open run grows: only it is decoded again
    assert settled.text(items) == "Tips: early walk one two one"
    assert decoded == [[2, 3, 2]]
