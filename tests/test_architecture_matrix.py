"""The architecture matrix: every causal-LM family pasta means to run, as a tiny random twin (pasta.models.tiny:
the family's real config class, 2 layers, hidden 64, its own features kept: sliding windows of 8 tokens on its own
pattern of layers, soft-capping, Gemma's embedding scaling and wide heads, QK norms, fused projections, tied or
untied embeddings), weights scaled so that greedy output varies. Each family runs every check on one prompt of 37
tokens, longer than any twin's window:

- the greedy decoders (sequential; asynchronous, no fork written) give `generate`'s answer;
- the training layout sees what the model's own attention sees (the first chunk's view is a plain causal sequence);
- the decoder's teacher-forced log-probabilities equal one forward over the layout;
- an asynchronous decode with a forced fork equals its teacher-forced replay: every token it chose is the replay's
  most likely one;
- a one-step SFT and a one-step preference round run through the stages' loading, which refuses what
  pasta.models.architecture refuses.

Every family passes every check: pasta's masks apply each layer's own sliding window (over positions, in the
training layout and in the decoder alike) and the decoder's attention applies Gemma 2's soft-capping.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.decoding import (
    assert_teacher_forcing_equals_the_layout_forward,
    generate_ids,
    layout_forward,
    pasta_speaker,
    prompt,
    token_doc,
)
from helpers.models import lively_twin
from helpers.training import hand_pairs
from pasta.config import compose
from pasta.decoding import DecodeConfig, decode_async, decode_sequential, teacher_forced_logprobs
from pasta.lang import IGNORE_INDEX, ReservationPolicy, parse, plain_text
from pasta.models import load_model
from pasta.models.tiny import FAMILIES

TEXT = "Give three tips for sleeping well."  # 37 tokens as a chat prompt: longer than any twin's window (8)
NUM_TOKENS = 24
TWO_GROUPS = (
    'Intro: <promise topic="first tip"/>\n<promise topic="second tip"/> and main text'
    '<async topic="first tip">Drink water every morning.</async><async topic="second tip">Walk after lunch.</async>'
    '<sync/> Middle.\n<promise topic="only one"/> tail<async topic="only one">A lone chunk here.</async>'
)
WINDOWED = ("gemma2", "gemma3_text", "mistral", "phi3")  # a window on some layer: shorter than the prompt


@pytest.fixture(scope="module")
def twins(tiny_model_and_tokenizer):
    """family -> (lively twin, its tokenizer with the tag tokens), built once per module."""
    built = {}

    def twin(family):
        if family not in built:
            built[family] = lively_twin(tiny_model_and_tokenizer[1], family)
        return built[family]

    return twin


def test_every_family_has_a_twin_of_its_own_config_class(twins):
    for family, spec in FAMILIES.items():
        model, _ = twins(family)
        assert type(model.config).__name__ == spec.config_class and model.config.model_type == family
    features = {family: twins(family)[0].config for family in WINDOWED}
    assert features["gemma2"].layer_types == ["sliding_attention", "full_attention"]
    assert features["gemma3_text"].layer_types == ["sliding_attention", "full_attention"]
    assert all(config.sliding_window == 8 for config in features.values())
    assert features["gemma2"].attn_logit_softcapping == 50.0 and features["gemma2"].final_logit_softcapping == 30.0


# --- decoding ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_sequential_greedy_equals_generate_past_the_window(twins, family):
    model, tokenizer = twins(family)
    ids = prompt(tokenizer, TEXT)
    expected = generate_ids(model, ids, max_new_tokens=NUM_TOKENS)
    assert len(set(expected)) >= NUM_TOKENS // 2  # a varied answer: parity on a repeated token would prove little
    result = decode_sequential(model, tokenizer, [ids], DecodeConfig(max_new_tokens=NUM_TOKENS))[0]
    assert result.token_ids == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_async_greedy_without_a_fork_equals_generate_past_the_window(twins, family):
    model, tokenizer = twins(family)
    ids = prompt(tokenizer, TEXT)
    # Unconstrained: on plain text constraints change no greedy choice (tests/test_decoding.py), and their grammar
    # costs a second per tokenizer.
    config = DecodeConfig(max_new_tokens=NUM_TOKENS, constrain=False)
    result = decode_async(model, tokenizer, [ids], config, ReservationPolicy())[0]
    assert result.stats.num_threads == 0
    assert result.token_ids == generate_ids(model, ids, max_new_tokens=NUM_TOKENS)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_layout_sees_what_the_models_own_attention_sees(twins, family):
    """The first chunk sees the prompt, the main thread up to its promise and itself, at positions 0, 1, ...: a plain
    causal sequence, which the model's own forward (its own masks, windows included) reads alone."""
    model, tokenizer = twins(family)
    ids = prompt(tokenizer, TEXT)
    policy = ReservationPolicy()
    layout, logits, _ = layout_forward(model, ids, token_doc(tokenizer, TWO_GROUPS, policy), policy)
    last_row = layout.thread_ids.index(2) - 1  # the first chunk's last row
    view = [row for row in range(len(layout)) if layout.visible[last_row, row]]
    assert [layout.position_ids[row] for row in view] == list(range(len(view)))
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([[layout.input_ids[row] for row in view]])).logits[0]  # [n, V]
    torch.testing.assert_close(logits[view], alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_forced_logprobs_equal_the_layout_forward(twins, family):
    model, tokenizer = twins(family)
    policy = ReservationPolicy()
    doc = token_doc(tokenizer, TWO_GROUPS, policy)
    stats = assert_teacher_forcing_equals_the_layout_forward(model, tokenizer, prompt(tokenizer, TEXT), doc, policy)
    assert stats.num_threads == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_an_async_decode_with_a_forced_fork_equals_its_teacher_forced_replay(twins, family):
    """The main thread is scripted to fork one chunk, which writes what the model likes until its cap."""
    model, tokenizer = twins(family)
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    ids = prompt(tokenizer, TEXT, go)
    policy = ReservationPolicy()
    config = DecodeConfig(max_new_tokens=16, max_chunk_tokens=6, constrain=False)
    result = decode_async(speaker, tokenizer, [ids], config, policy)[0]
    doc = result.token_doc
    assert result.stats.num_threads == len(doc.chunks) == 1 and result.stats.malformed == {"chunk_cap": 1}
    assert result.stats.theoretical_speedup > 1

    replayed, stats = teacher_forced_logprobs(speaker, tokenizer, ids, doc, policy)
    # The replay samples the chunk's closing tag in a step of its own; the decode closed it at the cap, unsampled.
    assert (stats.num_steps, stats.num_tokens) == (result.stats.num_steps + 1, result.stats.num_tokens + 1)
    layout, logits, per_row = layout_forward(speaker, ids, doc, policy)
    chunk_rows = [r for r, t in enumerate(layout.thread_ids) if t == 1 and layout.target_ids[r] != IGNORE_INDEX]
    torch.testing.assert_close(replayed.chunks[0], per_row[chunk_rows], atol=1e-4, rtol=1e-4)
    # Greedy: every chunk token the decoder chose is the most likely one; the last was forced by the cap.
    chosen = [layout.target_ids[r] for r in chunk_rows[:-1]]
    assert logits[chunk_rows[:-1]].argmax(-1).tolist() == chosen
    assert len(set(chosen)) > 1


def forking_batch(model, tokenizer):
    """The scripted speaker and three prompts for one batch, the first and last of which it forks."""
    speaker, go = pasta_speaker(model, tokenizer, free_chunks=True)
    return speaker, [prompt(tokenizer, "Tips", go), prompt(tokenizer, TEXT), prompt(tokenizer, "More tips here", go)]


@pytest.mark.parametrize("family", WINDOWED)
def test_a_batch_past_the_window_gives_each_request_its_answer_alone(twins, family):
    """Each prompt alone in its group, the decode rows of every request in the narrow and wide groups: the window
    (and Gemma 2's soft-capping) apply there as in a lone request's steps."""
    model, tokenizer = twins(family)
    speaker, prompts = forking_batch(model, tokenizer)
    config = DecodeConfig(max_new_tokens=16, max_chunk_tokens=6, constrain=False)
    batch = decode_async(speaker, tokenizer, prompts, config, ReservationPolicy())
    assert [r.stats.num_threads for r in batch] == [1, 0, 1]
    sequential = decode_sequential(model, tokenizer, prompts, config)
    for ids, answer, tokens in zip(prompts, batch, sequential, strict=True):
        alone = decode_async(speaker, tokenizer, [ids], config, ReservationPolicy())[0]
        assert (alone.token_ids, alone.token_doc) == (answer.token_ids, answer.token_doc)
        assert tokens.token_ids == generate_ids(model, ids, max_new_tokens=16)


@pytest.mark.slow
def test_compiled_async_decoder_gives_the_eager_answers_past_the_window(twins):
    """The compiled step's bucketed groups carry the window mask beside the mask (Gemma 2: one layer of two slides,
    and soft-caps). One family: each compiles its own graphs, a minute of the suite's time."""
    model, tokenizer = twins("gemma2")
    speaker, prompts = forking_batch(model, tokenizer)
    answers = []
    for compile in (False, True):
        config = DecodeConfig(max_new_tokens=12, max_chunk_tokens=6, constrain=False, compile=compile)
        answers.append([(r.token_ids, r.token_doc) for r in decode_async(speaker, tokenizer, prompts, config,
                                                                         ReservationPolicy())])
    assert answers[1] == answers[0]


# --- training -----------------------------------------------------------------------------------------------------


SMALL_ANNOTATED = (
    'Tips: <promise topic="water"/><promise topic="sleep"/><async topic="water">Drink water.</async>'
    '<async topic="sleep">Sleep well.</async><sync/> Done.'
)


def twin_overrides(family: str, tmp_path, *overrides: str) -> list[str]:
    return ["model=tiny", f"model.architecture={family}", "device=cpu", "stage.logging_steps=1",
            "stage.max_steps=1", "stage.per_device_train_batch_size=1", "stage.max_length=96",
            "stage.save_steps=100", f"output_dir={tmp_path}", *overrides]


@pytest.fixture
def layout_windows():
    """The `sliding_window` of every layer call that pasta's layout attention served (it serves the training of a
    model some layer of which slides, and nothing else)."""
    from transformers import AttentionInterface

    from pasta.decoding.attention import LAYOUT_NAME, layout_sdpa_attention

    windows = []

    def spy(module, *args, sliding_window=None, **kwargs):
        windows.append(sliding_window)
        return layout_sdpa_attention(module, *args, sliding_window=sliding_window, **kwargs)

    AttentionInterface.register(LAYOUT_NAME, spy)
    yield windows
    AttentionInterface.register(LAYOUT_NAME, layout_sdpa_attention)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_one_sft_step_and_one_preference_step_train_the_twin(family, tmp_path, layout_windows):
    from pasta.models import model_at
    from pasta.training.config import settings_from_cfg
    from pasta.training.pref import train_round
    from pasta.training.sft import run_sft

    records = tmp_path / "record.jsonl"  # one answer that forks twice and joins, whole within max_length
    record = {"instruction": "Two tips for a good day?", "input": "", "annotated": SMALL_ANNOTATED,
              "output": plain_text(parse(SMALL_ANNOTATED))}
    records.write_text(json.dumps(record) + "\n")
    sft = compose("train", ["stage=sft", f"data.path={records}", *twin_overrides(family, tmp_path / "sft")])
    final = run_sft(sft)
    info = json.loads((tmp_path / "sft" / "train_info.json").read_text())
    assert info["status"] == "done" and info["metrics"]["train_loss"] > 0
    assert info["examples"]["num_used"] == 1 and not info["examples"]["num_truncated"]
    assert json.loads((final / "config.json").read_text())["model_type"] == family
    # Each layer trained with its own window: the sliding ones through the layout attention's window (Gemma 2/3's
    # global layers through it too, without one); a model without a window through its own attention.
    expected = {"gemma2": {8, None}, "gemma3_text": {8, None}, "mistral": {8}, "phi3": {8}}.get(family, set())
    assert set(layout_windows) == expected

    pref = compose("train", ["stage=pref", *twin_overrides(family, tmp_path / "pref")])
    model, tokenizer = load_model(model_at(pref.model, final))  # the SFT checkpoint, checked as every stage checks
    attention = model.config._attn_implementation
    layout_windows.clear()
    settings = settings_from_cfg(pref.stage)
    metrics = train_round(model, tokenizer, hand_pairs(tokenizer, num_pairs=1), settings, pref, tmp_path / "pref" / "round-1",
                          ReservationPolicy(), resume=False)
    assert len(metrics["loss_history"]) == 1 and torch.isfinite(torch.tensor(metrics["loss_history"])).all()
    assert set(layout_windows) == expected and model.config._attn_implementation == attention  # restored after
    assert (tmp_path / "pref" / "round-1" / "final" / "config.json").is_file()
