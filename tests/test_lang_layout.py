"""PASTA-LANG tokens, schedule and training layout, checked against slow references written from the rules."""

import copy

import pytest
import torch

from pasta.lang import (
    IGNORE_INDEX,
    MAIN_THREAD,
    TAG_TOKENS,
    Document,
    Promise,
    ReservationPolicy,
    Sync,
    TagIds,
    Text,
    add_tag_tokens,
    build_layout,
    collate_layouts,
    drop_token_counts,
    encode_text,
    fill_token_counts,
    num_layout_rows,
    parse,
    row_targets,
    schedule,
    sequence_logprobs,
    tokenize_document,
)
from pasta.transformers_api import CACHE_ARGUMENT

TWO_GROUPS = (
    'Intro: <promise topic="first tip"/>\n<promise topic="second tip"/> and main text'
    '<async topic="first tip">Drink water every morning.</async><async topic="second tip">Walk after lunch.</async>'
    '<sync/> Middle.\n<promise topic="only one"/> tail<async topic="only one">A lone chunk here.</async>'
)


@pytest.fixture(scope="module")
def tagged(tiny_model_and_tokenizer):
    """A private copy of the tiny model and tokenizer with the tag tokens added."""
    model, tokenizer = tiny_model_and_tokenizer
    model, tokenizer = copy.deepcopy(model), copy.deepcopy(tokenizer)
    add_tag_tokens(tokenizer, model)
    model.eval()
    return model, tokenizer


def token_doc(text, tokenizer):
    return tokenize_document(fill_token_counts(parse(text), tokenizer), tokenizer)


# --- tokens ---------------------------------------------------------------------------------------------------


def test_add_tag_tokens_is_idempotent_and_grows_embeddings_once(tiny_model_and_tokenizer):
    model, tokenizer = (copy.deepcopy(x) for x in tiny_model_and_tokenizer)
    num_rows = model.get_input_embeddings().weight.shape[0]
    first = add_tag_tokens(tokenizer, model)
    second = add_tag_tokens(tokenizer, model)
    assert first == second
    assert model.get_input_embeddings().weight.shape[0] == max(first.all) + 1 >= num_rows + len(TAG_TOKENS)


def test_new_tag_embeddings_start_at_the_mean_of_their_inline_text(tagged):
    model, tokenizer = tagged
    weight = model.get_input_embeddings().weight
    row = tokenizer.convert_tokens_to_ids("<|async_end|>")
    expected = weight[encode_text(tokenizer, "</async>")].mean(dim=0)
    torch.testing.assert_close(weight[row], expected)


def test_tag_rows_in_a_padded_vocabulary_start_at_their_inline_text_and_a_checkpoints_stay(tiny_model_and_tokenizer):
    """A vocabulary padded past the tokenizer (Qwen2.5's) holds the new tag ids in untrained rows: they start at their
    inline text's mean all the same, without a resize; a tokenizer that has the tags keeps the model's rows."""
    from pasta.models import build_tiny_model

    _, tokenizer = tiny_model_and_tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    model = build_tiny_model(tokenizer)
    model.resize_token_embeddings(len(tokenizer) + 64, mean_resizing=False)  # padded, as Qwen2.5's
    num_rows = model.get_input_embeddings().weight.shape[0]
    tag_ids = add_tag_tokens(tokenizer, model)
    weight = model.get_input_embeddings().weight
    assert weight.shape[0] == num_rows > max(tag_ids.all)
    torch.testing.assert_close(weight[tag_ids.async_end], weight[encode_text(tokenizer, "</async>")].mean(dim=0))
    with torch.no_grad():
        weight[tag_ids.async_end] = 7.0  # trained
    add_tag_tokens(tokenizer, model)
    assert bool((model.get_input_embeddings().weight[tag_ids.async_end] == 7.0).all())


def test_tags_tokenize_identically_inside_a_response_and_alone(tagged):
    _, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    for chunk in doc.chunks:
        topic_ids = chunk.opener_ids[1:-1]
        start = doc.main_ids.index(topic_ids[0]) if topic_ids else 0
        assert doc.main_ids[start : start + len(topic_ids)] == topic_ids
    # The forced opener fed alone is the same ids the training layout holds.
    layout = build_layout([], doc, ReservationPolicy())
    first = doc.chunks[0]
    row = layout.input_ids.index(first.opener_ids[0])
    assert layout.input_ids[row : row + len(first.opener_ids)] == first.opener_ids


def test_text_that_looks_like_a_tag_never_becomes_a_tag_token(tagged):
    _, tokenizer = tagged
    tag_ids = set(tokenizer.convert_tokens_to_ids(list(TAG_TOKENS)))
    ids = encode_text(tokenizer, 'html <a href="x">y</a> and <|promise|> <|sync|> "/>')
    assert not tag_ids & set(ids)


def test_a_promise_without_a_count_tokenizes_to_the_uncounted_form(tagged):
    _, tokenizer = tagged
    tags = TagIds.from_tokenizer(tokenizer)
    doc = tokenize_document(parse('<promise topic="a"/><async topic="a">x</async>'), tokenizer, add_eos=False)
    assert doc.main_ids == [tags.promise, *encode_text(tokenizer, "a"), tags.promise_end]
    assert doc.chunks[0].num_predicted is None
    counted = tokenize_document(fill_token_counts(parse('<promise topic="a"/><async topic="a">x</async>'),
                                                  tokenizer), tokenizer, add_eos=False)
    assert tags.promise_tokens in counted.main_ids and len(counted.main_ids) > len(doc.main_ids)


def test_an_uncounted_chunk_reserves_the_fixed_span_in_the_layout(tagged):
    _, tokenizer = tagged
    doc = tokenize_document(drop_token_counts(parse(TWO_GROUPS)), tokenizer)
    policy = ReservationPolicy("uncounted", fixed=40)
    layout = build_layout([1, 2, 3], doc, policy)
    after_first_promise = doc.fork_indices[0] + 1  # the main thread's next token, after the first promise_end
    row = 3 + after_first_promise
    fork_position = layout.position_ids[3 + doc.fork_indices[0]]
    assert layout.position_ids[row] == fork_position + policy.span(len(doc.chunks[0].opener_ids), None) + 1
    assert policy.span(len(doc.chunks[0].opener_ids), None) == len(doc.chunks[0].opener_ids) + 40 + 1


def test_fill_token_counts_measures_chunk_content(tagged):
    _, tokenizer = tagged
    doc = fill_token_counts(parse(TWO_GROUPS), tokenizer)
    for promise in doc.promises:
        assert promise.num_tokens == len(encode_text(tokenizer, promise.content))


# --- schedule -------------------------------------------------------------------------------------------------


def reference_steps(main_kinds, chunk_lengths):
    """Step count by direct simulation of threads advancing one token per step."""
    threads = []  # remaining tokens of live chunks
    step = 0
    chunks = iter(chunk_lengths)
    index = 0
    waiting = False
    while index < len(main_kinds) or any(threads):
        step += 1
        advanced = [t - 1 for t in threads if t > 0]
        if index < len(main_kinds) and not (waiting and any(threads)):
            waiting = False
            kind = main_kinds[index]
            index += 1
            if kind == "fork":
                advanced.append(next(chunks))
            elif kind == "sync":
                waiting = True
        threads = advanced
    return step


@pytest.mark.parametrize(
    ("main_kinds", "chunk_lengths"),
    [
        (["t"] * 5, []),
        (["t", "fork", "t", "t"], [6]),
        (["t", "fork", "fork", "sync", "t"], [3, 5]),
        (["fork", "sync", "t", "fork", "t", "t", "t", "t", "t", "t", "t"], [4, 2]),
        (["fork", "fork", "fork", "fork"], [1, 1, 9, 1]),
    ],
)
def test_schedule_matches_a_step_by_step_simulation(tagged, main_kinds, chunk_lengths):
    _, tokenizer = tagged
    from pasta.lang import TagIds, TokenChunk, TokenDoc

    tag_ids = TagIds.from_tokenizer(tokenizer)
    ids = {"t": 5, "fork": tag_ids.promise_end, "sync": tag_ids.sync}
    chunks = [TokenChunk([tag_ids.async_start, tag_ids.async_body], [7] * n, n) for n in chunk_lengths]
    doc = TokenDoc([ids[k] for k in main_kinds], chunks, tag_ids)
    result = schedule(doc)
    assert result.num_steps == reference_steps(main_kinds, chunk_lengths)
    assert result.num_tokens == len(main_kinds) + sum(chunk_lengths)


def test_unannotated_response_has_speedup_one(tagged):
    _, tokenizer = tagged
    doc = tokenize_document(Document((Text("Just one plain sentence."),)), tokenizer)
    assert schedule(doc).theoretical_speedup == 1.0


# --- layout against a slow reference written from the rules ----------------------------------------------------


def reference_layout(prompt_ids, doc, policy):
    """Mask, positions and targets per token identity ("p", i) / ("m", j) / ("c", k, t), straight from the rules."""
    forks = doc.fork_indices
    syncs = [j for j, t in enumerate(doc.main_ids) if t == doc.tag_ids.sync]
    num_prompt = len(prompt_ids)

    def joined_before(main_index):  # chunks joined by a sync at or before this main index
        return {k for k, f in enumerate(forks) if any(f < s <= main_index for s in syncs)}

    tokens = [("p", i) for i in range(num_prompt)] + [("m", j) for j in range(len(doc.main_ids))]
    for k, chunk in enumerate(doc.chunks):
        tokens += [("c", k, t) for t in range(len(chunk.opener_ids) + len(chunk.body_ids))]

    def sees(a, b):
        if a[0] == "p":
            return b[0] == "p" and b[1] <= a[1]
        if a[0] == "m":
            limit, joined = a[1], joined_before(a[1])
        else:
            limit, joined = forks[a[1]], joined_before(forks[a[1]])
            if b[0] == "c" and b[1] == a[1]:
                return b[2] <= a[2]
        if b[0] == "p":
            return True
        if b[0] == "m":
            return b[1] <= limit
        return b[1] in joined

    main_positions = []
    position = num_prompt
    for j, token_id in enumerate(doc.main_ids):
        main_positions.append(position)
        position += 1
        if token_id == doc.tag_ids.promise_end:
            chunk = doc.chunks[forks.index(j)]
            position += policy.span(len(chunk.opener_ids), chunk.num_predicted)

    def info(a):
        if a[0] == "p":
            target = doc.main_ids[0] if a[1] == num_prompt - 1 else IGNORE_INDEX
            return prompt_ids[a[1]], a[1], target
        if a[0] == "m":
            nxt = doc.main_ids[a[1] + 1] if a[1] + 1 < len(doc.main_ids) else IGNORE_INDEX
            return doc.main_ids[a[1]], main_positions[a[1]], nxt
        chunk = doc.chunks[a[1]]
        ids = chunk.opener_ids + chunk.body_ids
        nxt = ids[a[2] + 1] if len(chunk.opener_ids) - 1 <= a[2] < len(ids) - 1 else IGNORE_INDEX
        return ids[a[2]], main_positions[forks[a[1]]] + 1 + a[2], nxt

    return tokens, sees, info


def identities(layout):
    counters: dict[int, int] = {}
    result = []
    for thread in layout.thread_ids:
        index = counters.get(thread, 0)
        counters[thread] = index + 1
        result.append(
            ("p", index) if thread == -1 else ("m", index) if thread == 0 else ("c", thread - 1, index)
        )
    return result


@pytest.mark.parametrize(
    "policy",
    [
        ReservationPolicy("exact"),
        ReservationPolicy("scale", scale=10.0),
        ReservationPolicy("round_up", multiple=16),
        ReservationPolicy("fixed", fixed=3),
    ],
)
@pytest.mark.parametrize(
    "text", [TWO_GROUPS, "No tags at all.", '<promise topic="x"/><async topic="x">y z</async>']
)
def test_layout_matches_the_rules(tagged, text, policy):
    _, tokenizer = tagged
    doc = token_doc(text, tokenizer)
    prompt_ids = encode_text(tokenizer, "user: give tips\nassistant:")
    layout = build_layout(prompt_ids, doc, policy)
    tokens, sees, info = reference_layout(prompt_ids, doc, policy)
    rows = identities(layout)
    assert sorted(rows) == sorted(tokens)
    for row, identity in enumerate(rows):
        token_id, position, target = info(identity)
        assert (layout.input_ids[row], layout.position_ids[row], layout.target_ids[row]) == (
            token_id,
            position,
            target,
        ), identity
        expected = torch.tensor([sees(identity, other) for other in rows])
        assert torch.equal(layout.visible[row], expected), identity


def test_collated_batch_pads_rows_that_see_only_themselves(tagged):
    _, tokenizer = tagged
    short = build_layout([1, 2], token_doc("Hi.", tokenizer), ReservationPolicy())
    long = build_layout([1, 2], token_doc(TWO_GROUPS, tokenizer), ReservationPolicy())
    batch = collate_layouts([short, long], pad_id=0)
    size = len(long)
    assert batch["input_ids"].shape == (2, size)
    assert batch["attention_mask"].shape == (2, 1, size, size)
    mask = batch["attention_mask"][0, 0]
    pad_rows = torch.arange(len(short), size)
    assert torch.all(mask[pad_rows, pad_rows] == 0)
    assert torch.all((mask[pad_rows] == 0).sum(-1) == 1)  # each pad row sees exactly itself
    assert torch.all(mask[: len(short), len(short) :] < 0)  # real rows never see pads
    assert torch.all(batch["target_ids"][0, len(short) :] == IGNORE_INDEX)


# --- the agreement that matters: one forward over the layout = each thread on its own -------------------------


def layout_logits(model, layouts, pad_id):
    batch = collate_layouts(layouts, pad_id=pad_id)
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        )
    return out.logits, batch


def causal_logits(model, input_ids, position_ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([input_ids]), position_ids=torch.tensor([position_ids]))
    return out.logits[0]


def test_layout_forward_equals_each_thread_run_alone(tagged):
    """Chunks of the first group and the main thread before the first sync are plain causal sequences."""
    model, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    prompt_ids = encode_text(tokenizer, "Give two tips.")
    layout = build_layout(prompt_ids, doc, ReservationPolicy("scale", scale=2.0))
    logits, _ = layout_logits(model, [layout], tokenizer.pad_token_id or 0)
    rows = identities(layout)
    threads = [[r for r, ident in enumerate(rows) if ident[0] == "c" and ident[1] == k] for k in (0, 1)]
    for chunk_rows in threads:
        context = [r for r in range(len(rows)) if layout.visible[chunk_rows[-1], r]]
        alone = causal_logits(
            model, [layout.input_ids[r] for r in context], [layout.position_ids[r] for r in context]
        )
        torch.testing.assert_close(logits[0, context], alone, atol=1e-4, rtol=1e-4)
    sync_row = layout.input_ids.index(doc.tag_ids.sync)
    before_sync = [r for r in range(len(rows)) if layout.visible[sync_row - 1, r]]
    alone = causal_logits(
        model, [layout.input_ids[r] for r in before_sync], [layout.position_ids[r] for r in before_sync]
    )
    torch.testing.assert_close(logits[0, before_sync], alone, atol=1e-4, rtol=1e-4)


def test_layout_forward_equals_row_by_row_decoding_with_a_cache(tagged):
    """The decoder's view: feed rows one at a time into a KV cache, each with its own visibility row."""
    from transformers import DynamicCache

    model, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    layout = build_layout(
        encode_text(tokenizer, "Tips please."), doc, ReservationPolicy("round_up", multiple=8)
    )
    logits, _ = layout_logits(model, [layout], tokenizer.pad_token_id or 0)
    cache = DynamicCache()
    bias = layout.attention_bias()
    for row in range(len(layout)):
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([[layout.input_ids[row]]]),
                position_ids=torch.tensor([[layout.position_ids[row]]]),
                attention_mask=bias[row, : row + 1].view(1, 1, 1, row + 1),
                use_cache=True,
                **{CACHE_ARGUMENT: cache},
            )
        torch.testing.assert_close(out.logits[0, -1], logits[0, row], atol=1e-4, rtol=1e-4)


def test_padded_batch_gives_the_same_logits_as_each_example_alone(tagged):
    model, tokenizer = tagged
    layouts = [
        build_layout([3, 4], token_doc("Short answer.", tokenizer), ReservationPolicy()),
        build_layout([3, 4, 5], token_doc(TWO_GROUPS, tokenizer), ReservationPolicy()),
    ]
    batched, _ = layout_logits(model, layouts, pad_id=0)
    assert not torch.isnan(batched).any()
    for b, layout in enumerate(layouts):
        alone, _ = layout_logits(model, [layout], pad_id=0)
        torch.testing.assert_close(batched[b, : len(layout)], alone[0], atol=1e-4, rtol=1e-4)


def test_sequence_logprobs_sum_only_trained_tokens(tagged):
    model, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    layout = build_layout([1, 2, 3], doc, ReservationPolicy())
    logits, batch = layout_logits(model, [layout], pad_id=0)
    per_row = sequence_logprobs(logits, batch["target_ids"])
    trained = batch["target_ids"] != IGNORE_INDEX
    assert int(trained.sum()) == doc.num_tokens  # every sampled token is trained exactly once
    assert torch.all(per_row[~trained] == 0) and torch.all(per_row[trained] < 0)


def test_sync_and_promise_tokens_are_trained_but_openers_are_not(tagged):
    _, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    layout = build_layout([1], doc, ReservationPolicy())
    targets = {t for t in layout.target_ids if t != IGNORE_INDEX}
    tag = doc.tag_ids
    assert {tag.promise, tag.promise_tokens, tag.promise_end, tag.sync, tag.async_end} <= targets
    assert tag.async_start not in targets and tag.async_body not in targets


def test_documents_built_by_hand_and_parsed_give_the_same_layout(tagged):
    _, tokenizer = tagged
    by_hand = Document((Text("A: "), Promise("x", "one two", 2), Sync(), Text(" B")))
    parsed = parse('A: <promise topic="x" tokens="2"/><async topic="x">one two</async><sync/> B')
    policy = ReservationPolicy()
    assert (
        build_layout([1], tokenize_document(by_hand, tokenizer), policy).input_ids
        == build_layout([1], tokenize_document(parsed, tokenizer), policy).input_ids
    )


# --- cutting a layout, and what its rows train ---------------------------------------------------------------


@pytest.mark.parametrize("max_rows", [3, 9, 20, 31, 45, 60, 10_000])
def test_layout_built_to_max_rows_is_the_first_rows_of_the_whole_layout(tagged, max_rows):
    """Cuts in the prompt, the main thread, an opener and a chunk body: the same rows, targets and visibility."""
    _, tokenizer = tagged
    doc = token_doc(TWO_GROUPS, tokenizer)
    prompt_ids = encode_text(tokenizer, "Give tips.")
    policy = ReservationPolicy()
    whole = build_layout(prompt_ids, doc, policy)
    cut = build_layout(prompt_ids, doc, policy, max_rows=max_rows)
    n = min(max_rows, len(whole))
    assert len(cut) == n and cut.num_prompt == min(len(prompt_ids), n)
    assert cut.input_ids == whole.input_ids[:n] and cut.position_ids == whole.position_ids[:n]
    assert cut.target_ids == whole.target_ids[:n] and cut.thread_ids == whole.thread_ids[:n]
    assert torch.equal(cut.visible, whole.visible[:n, :n])


@pytest.mark.parametrize(
    "text", [TWO_GROUPS, "No tags at all.", '<promise topic="x"/><async topic="x">y z</async>']
)
def test_row_targets_are_the_whole_layouts_targets(tagged, text):
    _, tokenizer = tagged
    doc = token_doc(text, tokenizer)
    assert row_targets(4, doc) == build_layout([5, 6, 7, 8], doc, ReservationPolicy()).target_ids
    assert num_layout_rows(4, doc) == len(row_targets(4, doc))


def test_count_digits_are_trained_main_thread_targets_that_read_back_as_the_count(tagged):
    """`tokens="N"`: the digits the loss sees are the ids of str(N) alone, which the decoder reads back as N."""
    _, tokenizer = tagged
    chunk = "a chunk long enough that its count has two digits, " * 3
    doc = token_doc(f'Tips: <promise topic="x"/><async topic="x">{chunk}</async>', tokenizer)
    count = doc.chunks[0].num_predicted
    assert count >= 10
    digit_ids = encode_text(tokenizer, str(count))
    layout = build_layout([1, 2], doc, ReservationPolicy())
    row = layout.input_ids.index(doc.tag_ids.promise_tokens)
    trained = layout.target_ids[row : row + len(digit_ids) + 1]
    assert trained == [*digit_ids, doc.tag_ids.promise_end]
    assert layout.thread_ids[row : row + len(digit_ids) + 1] == [MAIN_THREAD] * (len(digit_ids) + 1)
    assert tokenizer.decode(digit_ids).strip() == str(count)
