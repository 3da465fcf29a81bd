"""Constrained decoding (`decode.constrain`) with a model that writes random tokens: never malformed, counted.

`RandomLogits` runs the real tiny model (so the decoder's cache, masks and steps are exercised) and replaces its
logits with seeded random ones, raising the tokens PASTA-LANG is made of (tags, eos, digits, quotes, brackets,
newlines, blanks) so that every rule of the grammar comes up within a few dozen tokens.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.models import RandomLogits, Scripted
from pasta.decoding import DecodeConfig, SamplingConfig, decode_async
from pasta.evaluation.degenerate import topics_loop
from pasta.lang import ReservationPolicy, TagIds, add_tag_tokens, encode_text, parse, serialize
from pasta.models import build_tiny_model, encode_prompt


@pytest.fixture(scope="module")
def tagged(tiny_model_and_tokenizer):
    """A private tiny model and tokenizer with the tag tokens added."""
    _, tokenizer = tiny_model_and_tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    model = build_tiny_model(tokenizer)
    add_tag_tokens(tokenizer, model)
    return model.eval(), tokenizer


def structural_ids(tokenizer) -> list[int]:
    pieces = [*"0123456789", '"', "<", ">", "\n", " ", " the", " topic"]
    return sorted({*TagIds.from_tokenizer(tokenizer).all, tokenizer.eos_token_id,
                   *(i for p in pieces for i in encode_text(tokenizer, p))})


def decode_random(tagged, seed: int, boost: float, config: DecodeConfig):
    model, tokenizer = tagged
    fake = RandomLogits(model, structural_ids(tokenizer), boost, seed)
    return decode_async(fake, tokenizer, [encode_prompt(tokenizer, "Tips")], config, ReservationPolicy())[0]


def assert_well_formed(result, tokenizer):
    tags = TagIds.from_tokenizer(tokenizer)
    assert result.stats.malformed == {}
    # Nothing the model sampled in the main thread was cleaned away: the structure is the sampled ids.
    assert result.token_doc.main_ids == result.token_ids
    for chunk in result.token_doc.chunks:
        assert chunk.body_ids[-1] == tags.async_end and not set(chunk.body_ids[:-1]) & tags.all
    assert serialize(parse(result.annotated)) == result.annotated  # counted or uncounted promises


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31),
    boost=st.floats(1.5, 7.0),
    max_new_tokens=st.integers(1, 40),
    max_chunk_tokens=st.integers(2, 12),
    max_threads=st.integers(1, 3),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_constrained_decoding_of_random_logits_is_never_malformed(tagged, seed, boost, max_new_tokens,
                                                                  max_chunk_tokens, max_threads, temperature):
    # The per-thread caps alone: a total budget cut stops threads where they stand (its own tests), never binding here.
    config = DecodeConfig(max_new_tokens=max_new_tokens, max_chunk_tokens=max_chunk_tokens, max_threads=max_threads,
                          max_total_tokens=10_000, sampling=SamplingConfig(temperature=temperature, top_k=50, seed=seed))
    assert_well_formed(decode_random(tagged, seed, boost, config), tagged[1])


def test_constraint_masks_every_kind_of_event_that_random_logits_cause_unconstrained(tagged):
    masked, malformed, forked = Counter(), Counter(), 0
    for seed in range(8):
        config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=6)
        constrained = decode_random(tagged, seed, 4.0, config)
        assert_well_formed(constrained, tagged[1])
        masked.update(constrained.stats.masked)
        forked += constrained.stats.num_threads
        free = decode_random(tagged, seed, 4.0, DecodeConfig(max_new_tokens=40, max_chunk_tokens=6, constrain=False))
        assert free.stats.masked == {}
        malformed.update(free.stats.malformed)
    assert forked > 0
    # (bad_count is rare here: `<|promise|> topic <|promise_end|>` is the valid uncounted form)
    assert set(malformed) >= {"async_tag_in_main", "stray_promise_tag", "unclosed_promise", "bad_topic"}
    assert set(masked) >= set(malformed) - {"duplicate_topic"}, (masked, malformed)


def test_an_answer_makes_no_more_promises_than_max_promises_and_the_masked_ones_are_counted(tagged):
    capped, uncapped = Counter(), 0
    for seed in range(6):
        config = DecodeConfig(max_new_tokens=60, max_chunk_tokens=4, max_promises=1)
        result = decode_random(tagged, seed, 6.0, config)
        assert_well_formed(result, tagged[1])
        assert len(result.token_doc.chunks) <= 1
        capped.update(result.stats.masked)
        free = decode_random(tagged, seed, 6.0, DecodeConfig(max_new_tokens=60, max_chunk_tokens=4,
                                                                    max_promises=None))
        uncapped = max(uncapped, len(free.token_doc.chunks))
    assert capped["promise_cap"] > 0 and uncapped > 1  # the cap bit where the model wanted more


def test_a_topic_that_extends_an_earlier_one_word_by_word_ends_the_promise_list(tagged):
    """The study's looping student: it wants topic "alpha" again, the grammar masks the duplicate, and it writes
    "alpha beta", then would go on to "alpha beta gamma", ...; after the first extension no promise is opened."""
    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    (alpha,), (beta,), (gamma,), (newline,), (text,) = (encode_text(tokenizer, w)
                                                          for w in ("alpha", " beta", " gamma", "\n", " ok"))
    loop = Scripted(model, {tags.promise: alpha, alpha: (tags.promise_end, beta), beta: (tags.promise_end, gamma),
                            gamma: tags.promise_end, tags.promise_end: newline, newline: (tags.promise, text),
                            tags.async_body: text, text: (tags.async_end, tokenizer.eos_token_id)})
    prompt = [encode_prompt(tokenizer, "Tips")]

    def topics(stop_topic_loops: bool) -> tuple[list[str], dict[str, int]]:
        # max_total_tokens past reach: its cut stops threads where they stand (its own tests), mid-topic too
        config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=4, max_total_tokens=10_000,
                              stop_topic_loops=stop_topic_loops)
        result = decode_async(loop, tokenizer, prompt, config, ReservationPolicy())[0]
        assert_well_formed(result, tokenizer)
        return [tokenizer.decode(c.opener_ids[1:-1]).strip() for c in result.token_doc.chunks], result.stats.masked

    stopped, masked = topics(True)
    assert stopped == ["alpha", "alpha beta"] and masked["promise_cap"] > 0
    grown, _ = topics(False)
    assert grown[:3] == ["alpha", "alpha beta", "alpha beta gamma"]


def test_the_grammar_reads_every_tokens_text_as_batch_decode_does(tagged):
    """The grammar decodes the vocabulary in one call to the Rust tokenizer; a tokenizer class with a decode of its
    own goes through that decode."""
    from pasta.decoding.grammar import _decode_each

    _, tokenizer = tagged
    sequences = [[encode_text(tokenizer, "a")[0], i] for i in range(len(tokenizer))]
    expected = tokenizer.batch_decode(sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert _decode_each(tokenizer, sequences) == expected
    assert any(text.startswith("a ") for text in expected)  # the leading space the anchor keeps

    class Shouting(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    shouting = copy.copy(tokenizer)
    shouting.__class__ = Shouting
    assert _decode_each(shouting, sequences[:300]) == [text.upper() for text in expected[:300]]


def test_a_tokenizer_loaded_again_shares_the_grammar_of_its_vocabulary(tagged):
    """Each preference round loads its policy's tokenizer again: the grammar is built once per vocabulary."""
    from pasta.decoding.grammar import grammar_for

    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)

    def grammar(tok):
        return grammar_for(tok, tags, {tok.eos_token_id}, model.config.vocab_size, "cpu")

    again = copy.deepcopy(tokenizer)
    assert grammar(again) is grammar(tokenizer)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<|another_token|>"])
    assert grammar(other) is not grammar(tokenizer)


def test_a_topic_stops_growing_at_max_topic_chars_and_can_still_close(tagged):
    from pasta.decoding.grammar import grammar_for

    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    grammar = grammar_for(tokenizer, tags, {tokenizer.eos_token_id}, model.config.vocab_size, "cpu")
    (word,) = encode_text(tokenizer, "hello")
    (longer,) = encode_text(tokenizer, " world")
    capped = grammar.topic([word], "hello", set(), budget=50, max_chars=8)
    assert capped.violation(longer) == "bad_topic" and bool(capped.allowed[tags.promise_end])
    assert bool(grammar.topic([word], "hello", set(), budget=50, max_chars=64).allowed[longer])


def test_a_count_stops_at_what_a_chunk_can_hold(tagged):
    """tokens="N" reserves N positions for the chunk (counted policies): a count past max_chunk_tokens would leave
    the main thread past positions no chunk writes."""
    from pasta.decoding.grammar import grammar_for

    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    grammar = grammar_for(tokenizer, tags, {tokenizer.eos_token_id}, model.config.vocab_size, "cpu")
    digit = {d: encode_text(tokenizer, str(d))[0] for d in range(10)}
    first = grammar.count([], "", budget=50, max_count=64)
    assert [bool(first.allowed[digit[d]]) for d in range(10)] == [False] + [True] * 9  # no leading zero
    second = grammar.count([digit[6]], "6", budget=50, max_count=64)
    assert [bool(second.allowed[digit[d]]) for d in range(10)] == [True] * 5 + [False] * 5  # 60-64 only
    assert second.violation(digit[5]) == "bad_count" and bool(second.allowed[tags.promise_end])
    assert bool(grammar.count([digit[6]], "6", budget=50).allowed[digit[9]])  # no bound given: none


def test_a_topic_with_the_words_of_one_this_list_promised_cannot_close(tagged):
    """The study's topic loops were one list promising 'he wore' and then 'He wore' or 'markdown syntax:': the
    same words, another case or a colon. The grammar treats them as the duplicate they are: the student that
    wants 'he wore' twice writes 'he wore:' and, where that cannot close either, 'he wore: hats'."""
    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    (he,), (wore,), (colon,), (hats,), (newline,), (text,) = (
        encode_text(tokenizer, w) for w in ("he", " wore", ":", " hats", "\n", " ok"))
    student = Scripted(model, {tags.promise: he, he: wore, wore: (tags.promise_end, colon),
                               colon: (tags.promise_end, hats), hats: tags.promise_end, tags.promise_end: newline,
                               newline: (tags.promise, text), tags.async_body: text,
                               text: (tags.async_end, tokenizer.eos_token_id)})
    config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=4, max_promises=2)
    result = decode_async(student, tokenizer, [encode_prompt(tokenizer, "Tips")], config, ReservationPolicy())[0]
    assert_well_formed(result, tokenizer)
    topics = [tokenizer.decode(c.opener_ids[1:-1]) for c in result.token_doc.chunks]
    assert topics == ["he wore", "he wore: hats"] and not topics_loop(topics)
    assert result.stats.masked["duplicate_topic"] == 2  # the second promise_end after ' wore', then after ':'


def test_a_list_cannot_close_a_topic_an_earlier_list_of_the_answer_promised(tagged):
    """The language allows a topic again after a sync; the grammar does not: the measured topic loops left after the
    list rules were a second list repeating the first one's topic ('Use SSH', then 'Use ssh'), which the evaluation
    counts as a topic loop, and no training record holds one."""
    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    (he,), (wore,), (colon,), (hats,), (newline,), (text,) = (
        encode_text(tokenizer, w) for w in ("he", " wore", ":", " hats", "\n", " ok"))
    student = Scripted(model, {newline: tags.promise, tags.promise: he, he: wore, wore: (tags.promise_end, colon),
                               colon: (tags.promise_end, hats), hats: tags.promise_end, tags.promise_end: tags.sync,
                               tags.sync: (tags.promise, text), tags.async_body: text,
                               text: (tags.async_end, tokenizer.eos_token_id)})
    config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=4, max_promises=2)
    result = decode_async(student, tokenizer, [encode_prompt(tokenizer, "Tips")], config, ReservationPolicy())[0]
    assert_well_formed(result, tokenizer)
    assert result.annotated.count("<sync/>") == 2  # two lists
    topics = [tokenizer.decode(c.opener_ids[1:-1]) for c in result.token_doc.chunks]
    assert topics == ["he wore", "he wore: hats"] and not topics_loop(topics)
    assert result.stats.masked["duplicate_topic"] == 2


def test_where_a_topic_cannot_grow_the_tokens_that_would_give_it_a_promised_topics_words_are_masked(tagged):
    from pasta.decoding.grammar import grammar_for

    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    grammar = grammar_for(tokenizer, tags, {tokenizer.eos_token_id}, model.config.vocab_size, "cpu")
    ids = {w: encode_text(tokenizer, w)[0] for w in ("He", " wore", " went", ":", "ok")}
    promised = {"he wore"}
    # Budget for one more topic token, then <|promise_end|>: ' wore' would leave 'He wore' no way on.
    last = grammar.topic([ids["He"]], "He", promised, budget=2)
    assert last.violation(ids[" wore"]) == "duplicate_topic" and bool(last.allowed[ids[" went"]])
    # With budget to spare it may write ' wore' (it can still grow past it), but not close there.
    spare = grammar.topic([ids["He"]], "He", promised, budget=10)
    assert bool(spare.allowed[ids[" wore"]])
    written = grammar.topic([ids["He"], ids[" wore"]], "He wore", promised, budget=10)
    assert written.violation(tags.promise_end) == "duplicate_topic" and bool(written.allowed[ids[":"]])
    # One character left: ':' would fill it with the promised words, a letter changes the last word.
    full = grammar.topic([ids["He"], ids[" wore"]], "He wore", promised, budget=10, max_chars=8)
    assert full.violation(ids[":"]) == "duplicate_topic" and bool(full.allowed[encode_text(tokenizer, "s")[0]])
    # Other words close as before.
    assert bool(grammar.topic([ids["ok"]], "ok", promised, budget=10).allowed[tags.promise_end])


def test_a_topic_cannot_repeat_a_pair_of_its_own_words(tagged):
    """The other loop shape: 'a plan and a plan and ...' inside one topic. The student that wants ' plan' after
    'a plan and a' writes its next choice, ' budget', and the list's topics do not loop."""
    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    (a,), (plan,), (and_,), (space_a,), (budget,), (newline,), (text,) = (
        encode_text(tokenizer, w) for w in ("a", " plan", " and", " a", " budget", "\n", " ok"))
    student = Scripted(model, {tags.promise: a, a: plan, plan: and_, and_: space_a, space_a: (plan, budget),
                               budget: tags.promise_end, tags.promise_end: newline, newline: (tags.promise, text),
                               tags.async_body: text, text: (tags.async_end, tokenizer.eos_token_id)})
    config = DecodeConfig(max_new_tokens=40, max_chunk_tokens=4, max_promises=1)
    result = decode_async(student, tokenizer, [encode_prompt(tokenizer, "Tips")], config, ReservationPolicy())[0]
    assert_well_formed(result, tokenizer)
    topics = [tokenizer.decode(c.opener_ids[1:-1]) for c in result.token_doc.chunks]
    assert topics == ["a plan and a budget"] and not topics_loop(topics)
    assert result.stats.masked["topic_loop"] == 1


def test_a_word_that_would_repeat_a_pair_is_masked_whether_it_starts_or_finishes_the_word(tagged):
    from pasta.decoding.grammar import grammar_for

    model, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    grammar = grammar_for(tokenizer, tags, {tokenizer.eos_token_id}, model.config.vocab_size, "cpu")
    (syntax,), (tax,), (colon,) = (encode_text(tokenizer, w) for w in (" syntax", "tax", ":"))
    new_word = grammar.topic([], "markdown syntax: use markdown", set(), budget=20)
    assert new_word.violation(syntax) == "topic_loop" and bool(new_word.allowed[encode_text(tokenizer, " rules")[0]])
    going_on = grammar.topic([], "markdown syntax: use markdown syn", set(), budget=20)
    assert going_on.violation(tax) == "topic_loop" and bool(going_on.allowed[encode_text(tokenizer, "onyms")[0]])
    # Nothing repeated yet: every word may follow, and the topic may close.
    fresh = grammar.topic([syntax], "markdown syntax", set(), budget=20)
    assert bool(fresh.allowed[colon]) and bool(fresh.allowed[tags.promise_end])
