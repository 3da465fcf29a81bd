"""The skeleton draft (`decode.draft_skeleton`): guessed main-thread tokens fed beside the main thread's own, kept when
the model chooses them. A greedy answer must be the same token for token, every kept token and every chunk must see
what it sees without the draft (the model's raw logits at each position are compared), and it must take fewer
steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.decoding import POLICY, PositionScripted, prompt, scripted_list, words
from helpers.models import lively_model, lively_twin
from pasta.decoding import DecodeConfig, SamplingConfig, decode_async
from pasta.decoding.draft import SkeletonDraft
from pasta.decoding.text import text_decoder
from pasta.lang import TagIds, encode_text


@pytest.fixture(scope="module")
def speaker(tiny_model_and_tokenizer):
    return scripted_list(*lively_model(tiny_model_and_tokenizer[1]))


def decode(speaker, **config):
    tokenizer, prompt_ids, _, scripted = speaker
    model = scripted()
    decode_config = DecodeConfig(**{"max_new_tokens": 64, **config})
    result = decode_async(model, tokenizer, [prompt_ids], decode_config, POLICY)[0]
    return result, model.raw


@pytest.mark.parametrize("max_threads", [8, 1])
def test_a_drafted_list_is_the_same_answer_with_the_same_logits_in_fewer_steps(speaker, max_threads):
    _, _, main, _ = speaker
    plain, plain_raw = decode(speaker, max_threads=max_threads)
    drafted, drafted_raw = decode(speaker, max_threads=max_threads, draft_skeleton=True)
    assert plain.token_ids == main and not plain.stats.malformed  # the script holds
    assert drafted.token_ids == plain.token_ids
    assert (drafted.text, drafted.annotated, drafted.token_doc) == (plain.text, plain.annotated, plain.token_doc)
    assert drafted.stats.num_tokens == plain.stats.num_tokens and drafted.stats.num_threads == 4
    # Every position the plain decode computed, the drafted one computed alike: the main thread's kept guesses and
    # the chunks forked from a kept promise_end saw what they see without the draft.
    for position, logits in plain_raw.items():
        torch.testing.assert_close(drafted_raw[position], logits, atol=1e-4, rtol=1e-4)
    # Kept: apple's and bread's promise_end, then "\n" "3" "." <|promise|> after bread's; dates' promise_end (not
    # cheese's: its topic goes on) and "\n" after it (the next marker is "-", not "4"); eggs' promise_end.
    assert drafted.stats.num_draft_kept == 9 and plain.stats.num_drafted == 0
    assert drafted.stats.num_drafted > drafted.stats.num_draft_kept  # the guesses the model did not choose
    # Each kept guess is a step the main thread does not take, but eggs' promise_end: the sync after it waits for
    # eggs' chunk, which starts at the same step either way.
    assert drafted.stats.num_steps == plain.stats.num_steps - 8
    # Every token is fed once, as a kept guess or as the next step's token; the guesses not kept come on top.
    assert (sum(drafted.stats.step_rows) - sum(plain.stats.step_rows)
            == drafted.stats.num_drafted - drafted.stats.num_draft_kept)


def test_a_drafted_list_under_a_sliding_window_keeps_every_logit(tiny_model_and_tokenizer):
    # Mistral's twin slides a window shorter than the prompt over every layer: the window reads each slot's position,
    # and a guess the model did not choose leaves a slot behind.
    speaker = scripted_list(*lively_twin(tiny_model_and_tokenizer[1], "mistral"))
    plain, plain_raw = decode(speaker)
    drafted, drafted_raw = decode(speaker, draft_skeleton=True)
    assert drafted.token_ids == plain.token_ids == speaker[2] and drafted.stats.num_draft_kept == 9
    for position, logits in plain_raw.items():
        torch.testing.assert_close(drafted_raw[position], logits, atol=1e-4, rtol=1e-4)


def test_a_draft_after_the_list_marker_is_the_next_number(speaker):
    tokenizer, _, main, _ = speaker
    tags = TagIds.from_tokenizer(tokenizer)
    draft = SkeletonDraft(tags, text_decoder(tokenizer), lambda text: encode_text(tokenizer, text))
    bread = main.index(tags.promise_end, main.index(tags.promise_end) + 1) - 1
    assert tokenizer.decode(draft(main[: bread + 1], in_topic=True)) == "<|promise_end|>\n3.<|promise|>"
    assert tokenizer.decode(draft(main[: bread + 2], in_topic=False)) == "\n3.<|promise|>"
    assert draft(main[:5], in_topic=True) == [tags.promise_end]  # the first item: no marker before it to copy
    assert draft(main[:3], in_topic=False) == []


def test_an_unconstrained_drafted_decode_is_the_same_answer(speaker):
    plain, _ = decode(speaker, constrain=False)
    drafted, _ = decode(speaker, constrain=False, draft_skeleton=True)
    assert drafted.token_ids == plain.token_ids and drafted.token_doc == plain.token_doc
    assert drafted.stats.num_steps < plain.stats.num_steps


def test_a_kept_promise_end_that_closes_no_promise_keeps_nothing_guessed_after_it(tiny_model_and_tokenizer):
    # Unconstrained, the second topic is a quote: its guessed promise_end is the model's choice and is kept, but the
    # parser refuses the promise (bad_topic), so no chunk forks and the marker guessed past its span is not kept.
    speaker = scripted_list(*lively_model(tiny_model_and_tokenizer[1]), bad_topic=True)
    plain, plain_raw = decode(speaker, constrain=False)
    drafted, drafted_raw = decode(speaker, constrain=False, draft_skeleton=True)
    assert plain.stats.malformed == drafted.stats.malformed == {"bad_topic": 1}
    assert drafted.token_ids == plain.token_ids == speaker[2] and drafted.token_doc == plain.token_doc
    assert drafted.stats.num_threads == plain.stats.num_threads == 3 and drafted.stats.num_draft_kept > 0
    for position, logits in plain_raw.items():
        torch.testing.assert_close(drafted_raw[position], logits, atol=1e-4, rtol=1e-4)


def test_a_sampled_drafted_answer_is_distributed_as_without_the_draft(speaker):
    # The list's second marker is "2" or "9" and its third "3." or "3)": both drafted positions ("\n2." is guessed
    # after the first item, "\n3." after the second). 100 seeded samples a side against the exact probabilities:
    # a guess kept whatever the draw, or a row drawn from the wrong position's distribution, moves them.
    tokenizer, prompt_ids, main, scripted = speaker
    nine, paren = words(tokenizer, "9", ")")
    first = scripted()
    positions = sorted(first.script)  # the row that chooses main[i] is positions[i]
    two_at, dot_at = positions[7], positions[14]
    assert (first.script[two_at], first.script[dot_at]) == (main[7], main[8])  # the list's "2" and its third "."
    choices = {two_at: {main[7]: 0.6, nine: 0.4}, dot_at: {main[8]: 0.7, paren: 0.3}}
    expected = {(main[7], main[8]): 0.42, (main[7], paren): 0.18, (nine, main[8]): 0.28, (nine, paren): 0.12}
    num_samples = 100
    sampling = SamplingConfig(temperature=1.0)

    def sample(draft_skeleton: bool):
        model = PositionScripted(first.model, first.script, first.chunk_transitions, choices)
        config = DecodeConfig(max_new_tokens=64, sampling=sampling, draft_skeleton=draft_skeleton)
        return decode_async(model, tokenizer, [prompt_ids] * num_samples, config, POLICY,
                            seeds=list(range(num_samples)))

    def chi_square(results) -> float:
        counts = {key: 0 for key in expected}
        for result in results:
            key = (result.token_ids[7], result.token_ids[14])
            assert result.token_ids == [*main[:7], key[0], *main[8:14], key[1], *main[15:]]  # nothing else moves
            counts[key] += 1
        return sum((counts[k] - num_samples * p) ** 2 / (num_samples * p) for k, p in expected.items())

    plain, drafted = sample(False), sample(True)
    assert chi_square(plain) < 16.27 and chi_square(drafted) < 16.27  # 3 degrees of freedom, p = 0.001
    assert [r.token_ids for r in drafted] != [r.token_ids for r in plain]  # a seed draws another sample
    assert sum(r.stats.num_draft_kept for r in drafted) > 0 and not any(r.stats.num_drafted for r in plain)
    assert sum(r.stats.num_steps for r in drafted) < sum(r.stats.num_steps for r in plain)


@pytest.mark.parametrize("max_new_tokens", [5, 7, 9])
def test_the_main_threads_budget_ends_a_drafted_answer_where_it_ends_the_plain_one(speaker, max_new_tokens):
    # max_new_tokens counts the main thread's text (its tags are free): budgets that stop it inside the list, where
    # a kept guess ("\n", "3", ".") may spend the last of it.
    plain, _ = decode(speaker, max_new_tokens=max_new_tokens, max_total_tokens=200)
    drafted, _ = decode(speaker, max_new_tokens=max_new_tokens, max_total_tokens=200, draft_skeleton=True)
    assert plain.stats.finish_reason == drafted.stats.finish_reason == "max_new_tokens"
    assert drafted.token_ids == plain.token_ids and drafted.token_doc == plain.token_doc


def test_a_batch_decodes_each_drafted_request_as_alone(speaker):
    tokenizer, prompt_ids, _, scripted = speaker
    config = DecodeConfig(max_new_tokens=64, draft_skeleton=True)
    alone = decode_async(scripted(), tokenizer, [prompt_ids], config, POLICY)[0]
    other = prompt(tokenizer, "Something else entirely.")
    batch = decode_async(scripted(), tokenizer, [other, prompt_ids], config, POLICY)
    assert batch[1].token_ids == alone.token_ids and batch[1].stats.num_steps == alone.stats.num_steps
    assert dataclasses.replace(batch[1].stats, prefill_s=0, decode_s=0, wall_s=0, bookkeeping_s=0, forward_s=0,
                               choose_s=0) == dataclasses.replace(alone.stats, prefill_s=0, decode_s=0, wall_s=0,
                                                                  bookkeeping_s=0, forward_s=0, choose_s=0)
