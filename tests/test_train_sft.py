"""Stage 1 (SFT): examples and their accounting, the layout collator, the trainer's loss, a few real steps, the
final folder in both forms, and resume after a killed run."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pasta.config import compose
from pasta.data import Record, read_jsonl
from pasta.errors import PastaError
from pasta.lang import (
    IGNORE_INDEX,
    ReservationPolicy,
    add_tag_tokens,
    build_layout,
    collate_layouts,
    encode_text,
    has_tag_tokens,
    sequence_logprobs,
)
from pasta.settings import check_settings
from pasta.training.collator import LayoutCollator
from pasta.training.examples import (
    balance_promises,
    build_sft_examples,
    token_doc_of,
    with_min_promises,
)
from pasta.training.sft import run_sft

ANNOTATED = Path(__file__).resolve().parents[1] / "data" / "annotated_examples.jsonl"


@pytest.fixture(scope="module")
def records():
    return read_jsonl(ANNOTATED)


@pytest.fixture(scope="module")
def tagged(tiny_model_and_tokenizer):
    model, tokenizer = (copy.deepcopy(x) for x in tiny_model_and_tokenizer)
    tag_ids = add_tag_tokens(tokenizer, model)
    return model, tokenizer, tag_ids


def examples_of(records, tokenizer, **kwargs):
    options = {"strip_annotations": False, "max_length": 4096, "too_long": "truncate"} | kwargs
    return build_sft_examples([Record.from_dict(r) for r in records], tokenizer, **options)


# --- examples -------------------------------------------------------------------------------------------------


def test_every_annotated_example_becomes_a_training_example_with_measured_token_counts(records, tagged):
    _, tokenizer, _ = tagged
    examples, stats = examples_of(records, tokenizer)
    assert stats.num_used == len(records) == len(examples) and not stats.skipped
    chunked = [e for e in examples if e["body_ids"]]
    assert chunked, "the fixture has annotated records"
    for example in chunked:
        # tokens="N" is re-measured in this tokenizer: the chunk's content, without its closing tag.
        assert example["num_predicted"] == [len(body) - 1 for body in example["body_ids"]]


def test_baseline_sft_examples_have_no_tag_tokens(records, tagged):
    _, tokenizer, tag_ids = tagged
    examples, stats = examples_of(records, tokenizer, strip_annotations=True)
    assert stats.num_used == len(records)
    for example, record in zip(examples, records, strict=True):
        assert not example["opener_ids"] and not set(example["main_ids"]) & tag_ids.all
        text = tokenizer.decode(example["main_ids"], skip_special_tokens=True)
        assert text == record["output"]


def test_a_records_text_that_spells_control_tokens_trains_as_text(tagged):
    """Security (issue 36): an instruction, input, output or annotation that spells a role marker or a tag is
    trained on as text; the prompt holds only the chat template's markers, the answer only its annotation's tags."""
    _, tokenizer, tag_ids = tagged
    controls = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    control_ids = {tokenizer.convert_tokens_to_ids(t) for t in controls}
    spelled = " ".join(controls)
    record = {"instruction": f"Say {spelled}", "input": spelled, "output": f"A {spelled}",
              "annotated": f'A {spelled}<promise topic="t"/><async topic="t">b {spelled}</async> c {spelled}'}
    (example,), _ = examples_of([record], tokenizer)
    (plain,), _ = examples_of([{**record, "instruction": "Say", "input": "x", "output": "A",
                                "annotated": '<promise topic="t"/><async topic="t">b</async> c'}], tokenizer)
    assert [i for i in example["prompt_ids"] if i in control_ids] == [i for i in plain["prompt_ids"]
                                                                      if i in control_ids]
    for key in ("main_ids", "opener_ids", "body_ids"):
        ids = example[key] if key == "main_ids" else [i for row in example[key] for i in row]
        template = plain[key] if key == "main_ids" else [i for row in plain[key] for i in row]
        assert [i for i in ids if i in control_ids] == [i for i in template if i in control_ids], key
    (baseline,), _ = examples_of([record], tokenizer, strip_annotations=True)
    assert [i for i in baseline["main_ids"] if i in control_ids] == [tokenizer.eos_token_id]
    assert tag_ids.sync in control_ids


def test_plain_alpaca_records_train_baseline_sft_on_their_output(tagged):
    _, tokenizer, _ = tagged
    examples, _ = examples_of(
        [{"instruction": "Say hi.", "input": "", "output": "Hi!"}], tokenizer, strip_annotations=True
    )
    assert tokenizer.decode(examples[0]["main_ids"]) == "Hi!" + tokenizer.eos_token


def test_unusable_records_are_skipped_and_counted_by_reason(records, tagged):
    _, tokenizer, _ = tagged
    bad = [
        {**records[0], "accepted": False},
        {**records[0], "annotated": None},
        {"instruction": "x", "input": "", "output": "y"},
        {**records[0], "annotated": 'Hi <promise topic="a"/> no chunk'},
    ]
    examples, stats = examples_of(bad + records[:2], tokenizer)
    assert len(examples) == stats.num_used == 2
    assert stats.skipped == {"not_accepted": 1, "no_annotation": 2, "unparseable": 1}


def test_min_promises_keeps_the_same_promise_bearing_records_for_pasta_and_baseline_sft(records, tagged):
    _, tokenizer, _ = tagged
    plain = {"instruction": "x", "input": "", "output": "y"}
    counts = [len(e["opener_ids"]) for e in examples_of(records, tokenizer)[0]]
    assert 0 in counts and max(counts) >= 5, "the fixture mixes plain and annotated answers"
    kept, stats = examples_of(records + [plain], tokenizer, min_promises=5)
    assert [len(e["opener_ids"]) for e in kept] == [n for n in counts if n >= 5]
    assert stats.skipped == {"too_few_promises": len(records) + 1 - len(kept)}
    baseline, _ = examples_of(records + [plain], tokenizer, min_promises=5, strip_annotations=True)
    plain_texts = [tokenizer.decode(e["main_ids"], skip_special_tokens=True) for e in baseline]
    wanted = [r for r in records if r["annotated"].count("<promise ") >= 5]
    assert plain_texts == [r["output"] for r in wanted]
    assert with_min_promises([Record.from_dict(r) for r in records + [plain]], 5) == list(map(Record.from_dict, wanted))


def test_a_promise_list_that_opens_the_answer_trains_as_plain_text_under_min_lead_words(tagged):
    """data.min_lead_words=2: an answer whose first promise follows fewer than 2 words trains as its plain text;
    one with a lead before its list trains as annotated; the records used, and Baseline-SFT's examples, do not
    change."""
    _, tokenizer, _ = tagged
    body = '<async topic="a"> apples are red.</async><async topic="b"> bananas are yellow.</async>'
    opening = {"instruction": "Fruits?", "input": "", "output": "1. apples are red.\n2. bananas are yellow.",
               "annotated": f'1.<promise topic="a"/>\n2.<promise topic="b"/>{body}'}
    lead = {"instruction": "Fruits?", "input": "", "output": "Two fruits: apples are red. bananas are yellow.",
            "annotated": f'Two fruits:<promise topic="a"/><promise topic="b"/>{body}'}
    plain = {"instruction": "Hi?", "input": "", "output": "Hi there.", "annotated": "Hi there."}
    records = [opening, lead, plain]
    as_written, _ = examples_of(records, tokenizer)
    examples, stats = examples_of(records, tokenizer, min_lead_words=2)
    assert stats.num_used == 3 and stats.num_trained_plain == 1 and stats.as_dict()["num_trained_plain"] == 1
    assert not examples[0]["opener_ids"]
    assert tokenizer.decode(examples[0]["main_ids"], skip_special_tokens=True) == opening["output"]
    assert examples[1:] == as_written[1:] and len(examples[1]["opener_ids"]) == 2
    assert examples_of(records, tokenizer, min_lead_words=1)[0] == as_written  # "1." is one word
    baseline = examples_of(records, tokenizer, strip_annotations=True)[0]
    assert examples_of(records, tokenizer, strip_annotations=True, min_lead_words=2)[0] == baseline
    assert examples[0] == baseline[0]


def test_too_long_examples_are_truncated_or_skipped_and_counted(records, tagged):
    _, tokenizer, _ = tagged
    examples, stats = examples_of(records, tokenizer, max_length=120, too_long="truncate")
    assert stats.num_truncated > 0 and stats.num_used == len(records)
    _, stats = examples_of(records, tokenizer, max_length=120, too_long="skip")
    assert stats.skipped["too_long"] == stats.num_records - stats.num_used > 0


def test_prompt_filling_max_length_is_skipped_even_when_truncating(records, tagged):
    """Such a prompt leaves nothing to train on."""
    _, tokenizer, _ = tagged
    with pytest.raises(PastaError, match="1 too_long"):
        examples_of(records[:1], tokenizer, max_length=5, too_long="truncate")


def test_no_usable_record_is_one_clear_error(records, tagged):
    _, tokenizer, _ = tagged
    with pytest.raises(
        PastaError, match=r"no usable training records out of 2 \(1 no_annotation, 1 not_accepted\)"
    ):
        examples_of([{**records[0], "accepted": False}, {**records[0], "annotated": ""}], tokenizer)


def test_uncounted_examples_drop_every_count_and_are_shorter_by_exactly_those_tokens(records, tagged):
    _, tokenizer, tag_ids = tagged
    counted, _ = examples_of(records, tokenizer)
    uncounted, _ = examples_of(records, tokenizer, counts=False)
    for with_count, without in zip(counted, uncounted, strict=True):
        assert tag_ids.promise_tokens not in without["main_ids"]
        assert without["num_predicted"] == [None] * len(with_count["body_ids"])
        assert without["body_ids"] == with_count["body_ids"]
        count_tokens = sum(1 + len(encode_text(tokenizer, str(n))) for n in with_count["num_predicted"])
        assert len(with_count["main_ids"]) - len(without["main_ids"]) == count_tokens


def test_collator_builds_the_uncounted_layout_with_fixed_reservations(records, tagged):
    _, tokenizer, tag_ids = tagged
    policy = ReservationPolicy(policy="uncounted", fixed=48)
    examples, _ = examples_of(records[:3], tokenizer, counts=False)
    batch = LayoutCollator(tag_ids, tokenizer.pad_token_id, policy, max_length=4096)(examples)
    layouts = [build_layout(e["prompt_ids"], token_doc_of(e, tag_ids), policy) for e in examples]
    expected = collate_layouts(layouts, tokenizer.pad_token_id)
    torch.testing.assert_close(batch["position_ids"], expected["position_ids"], rtol=0, atol=0)
    assert torch.equal(batch["labels"], expected["target_ids"])


# --- collator -------------------------------------------------------------------------------------------------


def test_collator_batch_is_the_padded_layout_of_each_example(records, tagged):
    _, tokenizer, tag_ids = tagged
    policy = ReservationPolicy(policy="scale", scale=2.0)
    examples, _ = examples_of(records[:3], tokenizer)
    batch = LayoutCollator(tag_ids, tokenizer.pad_token_id, policy, max_length=4096)(examples)
    layouts = [build_layout(e["prompt_ids"], token_doc_of(e, tag_ids), policy) for e in examples]
    expected = collate_layouts(layouts, tokenizer.pad_token_id)
    for key in ("input_ids", "position_ids", "attention_mask"):
        torch.testing.assert_close(batch[key], expected[key], rtol=0, atol=0)
    assert torch.equal(batch["shift_labels"], expected["target_ids"])
    assert torch.equal(batch["labels"], expected["target_ids"])
    assert batch["num_rows"].tolist() == [len(layout) for layout in layouts]


def test_collator_builds_only_the_first_max_length_rows(records, tagged):
    _, tokenizer, tag_ids = tagged
    policy = ReservationPolicy()
    examples, _ = examples_of(records[:1], tokenizer)
    full = build_layout(examples[0]["prompt_ids"], token_doc_of(examples[0], tag_ids), policy)
    batch = LayoutCollator(tag_ids, tokenizer.pad_token_id, policy, max_length=100)(examples)
    assert batch["input_ids"].shape == (1, 100)
    assert batch["input_ids"][0].tolist() == full.input_ids[:100]
    assert batch["shift_labels"][0].tolist() == full.target_ids[:100]
    assert torch.equal(batch["attention_mask"][0, 0] == 0, full.visible[:100, :100])


@pytest.mark.parametrize("max_length", [90, 120, 200, 300])
def test_truncation_report_counts_everything_the_cut_leaves_out(records, tagged, max_length):
    """Trained tokens, rows, chunk ends and answer ends: the whole layouts minus the trained ones."""
    _, tokenizer, tag_ids = tagged
    policy = ReservationPolicy()
    examples, stats = examples_of(records, tokenizer, max_length=max_length)
    assert stats.num_truncated > 0
    collator = LayoutCollator(tag_ids, tokenizer.pad_token_id, policy, max_length=max_length)
    whole_targets, kept_targets, rows_cut = [], [], 0
    for example in examples:
        whole = build_layout(example["prompt_ids"], token_doc_of(example, tag_ids), policy)
        kept = collator.layout(example)
        rows_cut += len(whole) - len(kept)
        whole_targets += [t for t in whole.target_ids if t != IGNORE_INDEX]
        kept_targets += [t for t in kept.target_ids if t != IGNORE_INDEX]
    assert stats.num_targets == len(whole_targets)
    assert stats.num_rows_cut == rows_cut
    assert stats.num_targets_cut == len(whole_targets) - len(kept_targets)
    assert stats.num_chunk_ends_cut == whole_targets.count(tag_ids.async_end) - kept_targets.count(
        tag_ids.async_end
    )
    eos = tokenizer.eos_token_id
    assert stats.num_answer_ends_cut == whole_targets.count(eos) - kept_targets.count(eos)
    assert stats.num_truncated == sum(
        len(example["prompt_ids"]) + len(example["main_ids"]) + sum(map(len, example["opener_ids"]))
        + sum(map(len, example["body_ids"])) > max_length
        for example in examples
    )
    message = stats.truncation_message()
    assert f"{stats.num_truncated} of {len(examples)} examples are longer than stage.max_length={max_length}" in (
        message
    )
    assert f"{stats.num_targets_cut} trained tokens" in message


def test_a_huge_response_is_cut_before_any_layout_is_built(tagged):
    """A ~150K-token answer: its whole mask would take tens of GB; the batch is max_length rows."""
    _, tokenizer, tag_ids = tagged
    record = {"instruction": "Talk.", "input": "", "output": "word " * 150_000}
    examples, stats = examples_of([record], tokenizer, max_length=64, strip_annotations=True)
    assert stats.num_truncated == 1 and stats.num_answer_ends_cut == 1
    assert stats.num_targets_cut == stats.num_targets - (64 - len(examples[0]["prompt_ids"]) + 1)
    batch = LayoutCollator(tag_ids, tokenizer.pad_token_id, ReservationPolicy(), max_length=64)(examples)
    assert batch["attention_mask"].shape == (1, 1, 64, 64)


# --- the trainer's loss ---------------------------------------------------------------------------------------


def test_trainer_loss_is_the_mean_negative_log_prob_of_the_trained_tokens(records, tagged, tmp_path, monkeypatch):
    from datasets import Dataset
    from trl import SFTConfig
    from trl.trainer import sft_trainer

    from pasta.training.trainers import LayoutSFTTrainer

    model, tokenizer, tag_ids = tagged
    model = copy.deepcopy(model)
    examples, _ = examples_of(records[:3], tokenizer, max_length=160)
    collator = LayoutCollator(tag_ids, tokenizer.pad_token_id, ReservationPolicy(), max_length=160)
    args = SFTConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        remove_unused_columns=False,
        max_length=None,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    asked = []
    trl_head = sft_trainer.add_fused_lm_head
    monkeypatch.setattr(sft_trainer, "add_fused_lm_head",
                        lambda model, **kwargs: asked.append(kwargs["outputs"]) or trl_head(model, **kwargs))
    trainer = LayoutSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples),
        data_collator=collator,
        processing_class=tokenizer,
    )
    assert asked == [trainer.lm_head_outputs()]  # the CPU head computes the fields TRL asked its head for
    batch = collator(examples)
    model.eval()
    with torch.no_grad():
        trained = trainer.compute_loss(trainer.model, dict(batch))
        plain = {k: v for k, v in batch.items() if k in ("input_ids", "position_ids", "attention_mask")}
        logprobs = sequence_logprobs(model(**plain).logits, batch["shift_labels"])  # [B, S]
    num_trained = (batch["shift_labels"] != IGNORE_INDEX).sum()
    torch.testing.assert_close(trained, -logprobs.sum() / num_trained)


def test_length_grouped_batches_give_each_example_the_loss_it_has_alone(records, tagged, tmp_path):
    """The trainer's own sampler groups examples by length; padding and batch-mates change no example's loss."""
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from trl import SFTConfig

    from pasta.training.config import settings_from_cfg
    from pasta.training.sft import training_dataset
    from pasta.training.trainers import LayoutSFTTrainer

    model, tokenizer, tag_ids = tagged
    model = copy.deepcopy(model).eval()
    max_length = 200  # some examples whole, some cut
    examples, stats = examples_of(records, tokenizer, max_length=max_length)
    assert 0 < stats.num_truncated < len(examples)
    cfg = sft_cfg(tmp_path, ANNOTATED, "stage.per_device_train_batch_size=4", f"stage.max_length={max_length}")
    settings = settings_from_cfg(cfg.stage)
    args = SFTConfig(
        **settings.trainer_kwargs(tmp_path, cfg),
        dataset_kwargs={"skip_prepare_dataset": True},
        packing=False,
    )
    collator = LayoutCollator(tag_ids, tokenizer.pad_token_id, ReservationPolicy(), max_length=max_length)
    trainer = LayoutSFTTrainer(
        model=model,
        args=args,
        train_dataset=training_dataset(examples, max_length),
        data_collator=collator,
        processing_class=tokenizer,
    )

    def per_example_loss(batch) -> list[float]:
        inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask")}
        with torch.no_grad():
            logprobs = sequence_logprobs(model(**inputs).logits, batch["shift_labels"])  # [B, S]
        trained = (batch["shift_labels"] != IGNORE_INDEX).sum(-1)
        return (-logprobs.sum(-1) / trained).tolist()

    alone = {}
    for example in examples:
        batch = collator([example])
        alone[tuple(batch["input_ids"][0].tolist())] = per_example_loss(batch)[0]
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler)
    assert sampler.lengths == [len(collator.layout(example)) for example in examples]
    num_seen = 0
    for batch in trainer.get_train_dataloader():
        lengths = batch["num_rows"].tolist()
        for b, loss in enumerate(per_example_loss(batch)):
            key = tuple(batch["input_ids"][b, : lengths[b]].tolist())
            assert loss == pytest.approx(alone[key], rel=1e-4)
            num_seen += 1
    assert num_seen == len(examples)


# --- promise-bearing and plain records -----------------------------------------------------------------------


def with_and_without_promises(records, num_plain):
    plain = [Record(f"Say {i}.", f"Plain {i}.") for i in range(num_plain)]
    return [Record.from_dict(r) for r in records if "<promise " in r["annotated"]], plain


def test_plain_records_ride_along_at_the_asked_ratio_the_same_for_baseline_sft(records):
    with_promises, plain = with_and_without_promises(records, 190)
    data = plain + with_promises
    chosen, balance = balance_promises(data, min_promise_share=0.5, plain_per_promise=1.0, seed=3)
    num_with = len(with_promises)
    assert [r for r in chosen if r in with_promises] == with_promises
    kept = [r for r in chosen if r in plain]
    assert len(kept) == balance.num_plain_kept == num_with
    assert chosen == [r for r in data if r in chosen]  # in data order
    again, _ = balance_promises(data, min_promise_share=0.5, plain_per_promise=1.0, seed=3)
    assert again == chosen  # the same records for PASTA-SFT and for Baseline-SFT (seeded)
    assert f"and {num_with} plain ones (data.plain_per_promise)" in balance.message()
    capped, capped_balance = balance_promises(data, min_promise_share=0.5, plain_per_promise=1000.0)
    assert len(capped) == len(data) and capped_balance.num_plain_kept == 190


def test_scarce_promise_bearing_records_are_trained_on_alone(records):
    with_promises, plain = with_and_without_promises(records, 190)
    chosen, balance = balance_promises(plain + with_promises, min_promise_share=0.5)
    assert chosen == with_promises and balance.promise_only
    num_with = len(with_promises)
    assert (balance.num_with_promises, balance.num_plain) == (num_with, 190)
    assert f"{num_with} of {num_with + 190} records carry promises" in balance.message()
    assert f"training on those {num_with} only, leaving out 190 plain ones" in balance.message()


@pytest.mark.parametrize(("num_plain", "min_promise_share"), [(0, 0.5), (1, 0.5), (50, None), (50, 0.0)])
def test_records_are_used_as_they_are_when_promises_are_not_scarce(records, num_plain, min_promise_share):
    with_promises, plain = with_and_without_promises(records, num_plain)
    chosen, balance = balance_promises(plain + with_promises, min_promise_share=min_promise_share)
    assert chosen == plain + with_promises and not balance.promise_only
    assert "using every record" in balance.message()


def test_a_share_of_exactly_the_threshold_is_not_scarce(records):
    with_promises, plain = with_and_without_promises(records, 0)
    plain = [Record(f"Say {i}.", f"Plain {i}.") for i in range(len(with_promises))]
    assert not balance_promises(plain + with_promises, min_promise_share=0.5)[1].promise_only
    assert balance_promises(plain + plain[:1] + with_promises, min_promise_share=0.5)[1].promise_only


@pytest.mark.parametrize(("override", "message"), [
    ("data.min_promise_share=1.5", r"^data\.min_promise_share: must be in \[0, 1\], or null, got 1\.5$"),
    ("data.min_promise_share=-0.1", r"^data\.min_promise_share: must be in \[0, 1\], or null, got -0\.1$"),
    ("data.min_promise_share=true", r"^data\.min_promise_share: Value 'True' of type 'bool' could not be converted"),
    ("data.min_promise_share=half", r"^data\.min_promise_share: Value 'half' of type 'str' could not be converted"),
    ("data.plain_per_promise=-1", r"^data\.plain_per_promise: must be >= 0, got -1\.0$"),
    ("data.plain_per_promise=nan", r"^data\.plain_per_promise: must be >= 0, got nan$"),
    ("data.min_lead_words=-1", r"^data\.min_lead_words: must be >= 0, got -1$"),
    ("data.min_lead_words=1.5", r"^data\.min_lead_words: Value '1\.5' of type 'float' could not be converted"),
    ("data.min_promises=-1", r"^data\.min_promises: must be >= 0, got -1$"),
    ("data.strip_annotations=maybe", r"^data\.strip_annotations: Value 'maybe' is not a valid bool"),
])
def test_a_training_data_setting_out_of_range_is_one_error_at_the_command_line(override, message):
    for stage in ("sft", "pref"):
        with pytest.raises(PastaError, match=message):
            check_settings(compose("train", [f"stage={stage}", override]), "train")


# --- real runs ------------------------------------------------------------------------------------------------


def sft_cfg(tmp_path: Path, data: Path, *overrides: str):
    return compose(
        "train",
        [
            "stage=sft",
            "model=tiny",
            f"data.path={data}",
            f"output_dir={tmp_path / 'run'}",
            "device=cpu",
            "stage.max_length=96",
            "stage.logging_steps=1",
            "stage.save_steps=2",
            *overrides,
        ],
    )


@pytest.fixture
def two_records(records, tmp_path) -> Path:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    return path


def batch_loss(model, tokenizer, records_path, max_length=96) -> float:
    tag_ids = add_tag_tokens(tokenizer)
    examples, _ = examples_of(read_jsonl(records_path), tokenizer, max_length=max_length)
    batch = LayoutCollator(tag_ids, tokenizer.pad_token_id, ReservationPolicy(), max_length=max_length)(
        examples
    )
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask", "labels", "shift_labels")}
    with torch.no_grad():
        return model.eval()(**inputs).loss.item()


@pytest.mark.slow
def test_a_few_full_sft_steps_on_a_repeated_batch_lower_its_loss(tagged, two_records, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = sft_cfg(
        tmp_path,
        two_records,
        "stage.finetune=full",
        "stage.per_device_train_batch_size=2",
        "stage.max_steps=5",
        "stage.learning_rate=3e-3",
    )
    final = run_sft(cfg)
    model, tokenizer, _ = tagged
    trained = AutoModelForCausalLM.from_pretrained(final)
    assert has_tag_tokens(tokenizer) and len(tokenizer) == trained.get_input_embeddings().weight.shape[0]
    before, after = batch_loss(model, tokenizer, two_records), batch_loss(trained, tokenizer, two_records)
    assert after < before - 0.5
    info = json.loads((tmp_path / "run" / "train_info.json").read_text())
    assert info["status"] == "done" and info["examples"]["num_used"] == 2 and len(info["data_sha256"]) == 64
    assert info["metrics"]["train_loss"] > 0 and info["config"]["stage"]["finetune"] == "full"
    # The checkpoint keeps the reservation policy it was trained with (the default, uncounted), and a decode under
    # another one is refused in one line before any weight loads.
    assert json.loads((final / "pasta_lang.json").read_text())["reservation"]["policy"] == "uncounted"
    done = subprocess.run([sys.executable, "-m", "pasta.generate", f"model.path={final}", "prompt=hi",
                           "max_new_tokens=2", "lang.reservation.policy=scale",
                           f"paths.output_root={tmp_path / 'generate'}"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == (f"error: model.path={final} was trained with lang.reservation.policy=uncounted "
                           "lang.reservation.fixed=64, not lang.reservation.policy=scale lang.reservation.scale=2.0: "
                           "decode it as it was trained, or chunk positions differ from training\n")


def test_lora_sft_trains_the_tag_rows_and_both_final_forms_load_alike(tagged, two_records, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer, tag_ids = tagged
    common = (
        "stage.per_device_train_batch_size=2", "stage.max_steps=3", "stage.learning_rate=1e-2", "stage.save_steps=100"
    )
    merged_dir = run_sft(sft_cfg(tmp_path / "merged", two_records, *common))
    adapter_dir = run_sft(sft_cfg(tmp_path / "adapter", two_records, *common, "stage.merge_lora=false"))
    assert (adapter_dir / "adapter_config.json").is_file() and not (
        adapter_dir / "model.safetensors"
    ).exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with_adapter = AutoModelForCausalLM.from_pretrained(adapter_dir).eval()
    rows = sorted(tag_ids.all)
    start = model.get_input_embeddings().weight[rows]
    assert not torch.allclose(merged.get_input_embeddings().weight[rows], start)
    layers = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight")
    trained_state = load_file(merged_dir / "model.safetensors")
    for name in layers:
        assert not torch.allclose(trained_state[name], model.state_dict()[name])
    ids = torch.tensor([tokenizer("Hello there, friend")["input_ids"] + rows])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(ids).logits, rtol=1e-4, atol=1e-4)
    # Every stage loads either folder through model.path, the adapter merged onto its base.
    from pasta.models import load_model

    through_pasta, _ = load_model({"name": "adapter", "path": str(adapter_dir)})
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, through_pasta(ids).logits, rtol=1e-4, atol=1e-4)


def test_an_adapter_whose_base_folder_moved_is_one_line_naming_it(two_records, tmp_path):
    from pasta.models import load_model

    adapter_dir = run_sft(sft_cfg(tmp_path / "adapter", two_records, "stage.per_device_train_batch_size=2",
                                  "stage.max_steps=1", "stage.save_steps=100", "stage.merge_lora=false"))
    shutil.rmtree(adapter_dir.parent / "base")
    with pytest.raises(PastaError, match=r"^model\.path=.*: the LoRA adapter's base model .*base is not a model folder"):
        load_model({"name": "adapter", "path": str(adapter_dir)})


def kill_at_step(monkeypatch, step: int | None) -> list[int]:
    """Make training raise KeyboardInterrupt (a kill) when the optimizer reaches `step`; returns the list of steps
    that ran."""
    from pasta.training.trainers import LayoutSFTTrainer

    original_step = LayoutSFTTrainer.training_step
    steps: list[int] = []

    def dies(self, *args, **kwargs):
        if self.state.global_step == step:
            raise KeyboardInterrupt
        steps.append(self.state.global_step)
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(LayoutSFTTrainer, "training_step", dies)
    return steps


def test_resume_after_a_killed_run_matches_the_uninterrupted_run(two_records, tmp_path, monkeypatch):
    common = (
        "stage.per_device_train_batch_size=1",
        "stage.gradient_accumulation_steps=1",
        "stage.max_steps=4",
        "stage.save_steps=2",
        "stage.learning_rate=5e-3",
    )
    whole = run_sft(sft_cfg(tmp_path / "whole", two_records, *common))

    killed = sft_cfg(tmp_path / "killed", two_records, *common)
    with monkeypatch.context() as patch:
        kill_at_step(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            run_sft(killed)
    run_dir = tmp_path / "killed" / "run"
    assert not (run_dir / "final").exists()
    info = json.loads((run_dir / "train_info.json").read_text())
    assert info["status"] == "failed" and info["reason"].startswith("interrupted")
    with pytest.raises(PastaError, match="resume=true"):
        run_sft(killed)
    with monkeypatch.context() as patch:
        steps = kill_at_step(patch, None)
        resumed = run_sft(sft_cfg(tmp_path / "killed", two_records, *common, "resume=true"))
    assert steps == [2, 3], "the resumed run continues from checkpoint-2"

    expected, actual = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6)


def test_resume_on_other_data_or_from_another_model_is_refused(records, two_records, tmp_path, monkeypatch):
    common = ("stage.per_device_train_batch_size=1", "stage.max_steps=4", "stage.save_steps=1")
    with monkeypatch.context() as patch:
        kill_at_step(patch, 1)
        with pytest.raises(KeyboardInterrupt):
            run_sft(sft_cfg(tmp_path, two_records, *common))
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in records[2:4]))
    with pytest.raises(PastaError, match="trained on other data"):
        run_sft(sft_cfg(tmp_path, other, *common, "resume=true"))
    with pytest.raises(PastaError, match=r"was started from model .*seed=0.*, this run asks .*seed=1.* \(model.path"):
        run_sft(sft_cfg(tmp_path, two_records, *common, "resume=true", "model.random_init.seed=1"))


def test_pasta_sft_on_data_without_promises_is_one_clear_error(records, tmp_path):
    data = tmp_path / "plain.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records if "<promise " not in r["annotated"]))
    with pytest.raises(PastaError, match=r"none of the 2 usable records of .*plain.jsonl carries a promise"):
        run_sft(sft_cfg(tmp_path, data))
    assert not (tmp_path / "run" / "train_info.json").exists()


def test_entry_point_reports_unusable_data_in_one_line_with_exit_code_2(records, tmp_path):
    import os
    import subprocess
    import sys

    data = tmp_path / "rejected.jsonl"
    data.write_text(json.dumps({**records[0], "accepted": False}) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pasta.train",
            "stage=sft",
            "model=tiny",
            f"data.path={data}",
            f"output_dir={tmp_path / 'run'}",
            "device=cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: no usable training records out of 1 (1 not_accepted)")
    )
    assert "Traceback" not in done.stderr
