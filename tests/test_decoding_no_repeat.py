"""`decode.sampling.no_repeat_ngram_size`: a thread never writes the same n tokens twice, in either decoder, and a
constrained answer stays well-formed under it."""

from __future__ import annotations

import pytest

from helpers.models import Scripted, looping_model
from pasta.decoding import DecodeConfig, SamplingConfig, decode_async, decode_sequential
from pasta.decoding.sampling import repeated_ngram_tokens
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, TagIds, encode_text
from pasta.models import encode_prompt


def ngrams(ids: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def test_the_tokens_that_would_repeat_an_ngram_are_the_ones_that_followed_its_prefix():
    assert repeated_ngram_tokens([1, 2, 3, 1, 2], 3) == {3}
    assert repeated_ngram_tokens([5, 6, 5, 7, 5], 2) == {6, 7}
    assert repeated_ngram_tokens([4, 4], 1) == {4}
    assert repeated_ngram_tokens([1, 2], 3) == set()
    with pytest.raises(PastaError, match="no_repeat_ngram_size: must be >= 0"):
        SamplingConfig(no_repeat_ngram_size=-1)


@pytest.fixture(scope="module")
def looping(tiny_model_and_tokenizer):
    """A tiny model scripted to loop on three words ("a b c a b c ..."), its prompt and the loop's ids."""
    prompt_ids = encode_prompt(tiny_model_and_tokenizer[1], "Say it again")
    scripted, tokenizer, loop = looping_model(tiny_model_and_tokenizer[1], prompt_ids[-1])
    return scripted, tokenizer, prompt_ids, loop


@pytest.mark.parametrize("mode", ["sequential", "async"])
def test_a_looping_model_repeats_no_ngram_with_the_guard_and_loops_without_it(looping, mode):
    model, tokenizer, prompt_ids, loop = looping
    eos = {tokenizer.eos_token_id}

    def answer(n: int) -> list[int]:
        config = DecodeConfig(max_new_tokens=30, sampling=SamplingConfig(no_repeat_ngram_size=n))
        if mode == "sequential":
            result = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
        else:
            result = decode_async(model, tokenizer, [prompt_ids], config, ReservationPolicy())[0]
        return [i for i in result.token_ids if i not in eos]

    looped = answer(0)
    assert looped[:6] == [*loop, *loop]
    guarded = answer(3)
    assert guarded[:3] == list(loop) and len(set(ngrams(guarded, 3))) == len(ngrams(guarded, 3))


def test_a_constrained_forking_answer_stays_well_formed_and_its_chunks_stop_repeating(looping):
    """Every chunk of a scripted forking answer loops on one word: unguarded they run to max_chunk_tokens (the grammar closes them); with the
    guard each closes after its first bigram, since tags are never banned, and the answer stays well-formed."""
    model, tokenizer, prompt_ids, _ = looping
    tags = TagIds.from_tokenizer(tokenizer)
    topic_a, topic_b = encode_text(tokenizer, " x")[0], encode_text(tokenizer, " y")[0]
    red = encode_text(tokenizer, " red")[0]
    script = Scripted(model.model, {prompt_ids[-1]: tags.promise, tags.promise: (topic_a, topic_b),
                                    topic_a: tags.promise_end, topic_b: tags.promise_end,
                                    tags.promise_end: (tags.promise, tags.sync), tags.async_body: red,
                                    red: (red, tags.async_end), tags.sync: tokenizer.eos_token_id})

    def answer(n: int):
        config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=8, max_total_tokens=200,
                              sampling=SamplingConfig(no_repeat_ngram_size=n))
        return decode_async(script, tokenizer, [prompt_ids], config, ReservationPolicy())[0]

    unguarded, guarded = answer(0), answer(2)
    assert unguarded.token_doc.chunks and all(c.body_ids.count(red) >= 6 for c in unguarded.token_doc.chunks)
    assert guarded.stats.malformed == {} and guarded.stats.num_threads >= 2
    assert all(chunk.body_ids == [red, red, tags.async_end] for chunk in guarded.token_doc.chunks)
