"""The parts the training stages are built from, without a model: what train_info.json records about SFT's data,
what a preference round's metrics.json records about its training, and the settings handed to TRL's configs."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pasta.config import compose
from pasta.data import LoadReport
from pasta.errors import PastaError
from pasta.training.config import (
    MixedPrecision,
    PrefSettings,
    SFTSettings,
    cpu_has_bf16,
    mixed_precision_flags,
    stage_settings,
)
from pasta.training.examples import ExampleStats, PromiseBalance
from pasta.training.pref import round_train_metrics
from pasta.training.runs import checkpoint_to_resume
from pasta.training.sft import SFTData


def test_sft_data_info_is_what_train_info_json_records_about_the_data():
    stats = ExampleStats(max_length=96, num_records=3, num_used=2, skipped=Counter(empty=1))
    balance = PromiseBalance(num_with_promises=1, num_plain=2, min_promise_share=0.5, promise_only=True)
    loaded = LoadReport(num_heldout_left_out=4)
    data = SFTData(examples=[], stats=stats, balance=balance, baseline=False, data_path="a.jsonl", sha256="abc",
                   loaded=loaded)
    info = data.info()
    assert list(info) == ["baseline", "data_sha256", "data_path", "examples", "promise_balance", "loaded"]
    assert info["examples"]["skipped"] == {"empty": 1} and info["promise_balance"]["promise_only"]
    assert info["loaded"]["num_heldout_left_out"] == 4  # the held-out pool's prompts it was given and left out
    unbalanced = SFTData(examples=[], stats=stats, balance=None, baseline=True, data_path=None, sha256="abc",
                         loaded=LoadReport())
    assert unbalanced.info()["promise_balance"] is None


def test_a_round_reports_the_loss_and_margin_of_every_logged_step():
    log_history = [{"loss": 2.0, "rewards/margins": 0.1, "step": 1}, {"loss": 1.5, "step": 2},
                   {"train_runtime": 3.0, "step": 2}]
    metrics = round_train_metrics({"train_loss": 1.75}, log_history)
    assert metrics == {"train_loss": 1.75, "loss_history": [2.0, 1.5], "margin_history": [0.1],
                       "last_log": {"loss": 1.5, "step": 2}}
    assert round_train_metrics({}, [])["last_log"] == {}


def test_auto_precision_is_bf16_only_where_the_cpu_multiplies_bf16_in_hardware(monkeypatch):
    import torch

    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False)
    assert mixed_precision_flags(MixedPrecision.auto, "cpu") == {"bf16": False, "fp16": False}
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert mixed_precision_flags(MixedPrecision.auto, "cpu") == {"bf16": True, "fp16": False}
    assert mixed_precision_flags(MixedPrecision.no, "cpu") == {"bf16": False, "fp16": False}
    assert mixed_precision_flags(MixedPrecision.auto, "mps") == {"bf16": False, "fp16": False}


def test_the_settings_trl_also_has_pass_through_to_its_config_by_name():
    from trl import DPOConfig, SFTConfig

    sft = SFTSettings(num_train_epochs=2.0, per_device_train_batch_size=3, gradient_accumulation_steps=5,
                      lr_scheduler_type="cosine", warmup_ratio=0.1, finetune="full")
    kwargs = sft.trainer_kwargs(Path("checkpoints"), OmegaConf.create({"device": "cpu", "seed": 7}))
    args = SFTConfig(**kwargs)
    assert (args.num_train_epochs, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2.0, 3, 5)
    assert args.lr_scheduler_type == "cosine" and args.warmup_steps == 0.1 and args.seed == 7
    # pasta's collators cut the layouts; TRL must cut nothing and keep every column
    assert args.max_length is None and args.remove_unused_columns is False
    assert args.use_cpu and args.bf16 == cpu_has_bf16() and args.train_sampling_strategy == "group_by_length"
    assert not {"finetune", "lora", "too_long", "mixed_precision", "group_by_length", "warmup_ratio"} & kwargs.keys()
    # gradient_checkpointing reaches TRL under transformers' current name (the old one warns)
    assert "gradient_checkpointing" not in kwargs and args.activation_checkpointing is False

    pref = PrefSettings(beta=0.3)
    assert pref.trl_fields()["beta"] == 0.3 and "beta" not in sft.trl_fields()
    assert not {"alpha", "rounds", "num_samples", "temperature", "reference"} & pref.trl_fields().keys()
    assert DPOConfig(**pref.trainer_kwargs(Path("checkpoints"), OmegaConf.create({"device": "cpu"}))).beta == 0.3


def _candidate(annotated: str, *, malformed: int = 0, finish: str = "eos", quality: float = 0.5):
    from pasta.lang import parse, plain_text
    from pasta.training.candidates import Candidate

    try:
        text = plain_text(parse(annotated))
    except ValueError:
        text = annotated
    return Candidate(text=text, annotated=annotated, speedup=1.5, quality=quality, judge="j", num_tokens=9,
                     num_steps=6, finish_reason=finish, malformed={"bad_tag": malformed} if malformed else {})


def test_a_rounds_forking_records_are_its_best_well_formed_ended_forks_no_worse_than_the_median():
    from pasta.data import Record
    from pasta.training.candidates import ScoredPrompt
    from pasta.training.config import SpeedReward
    from pasta.training.examples import with_min_promises
    from pasta.training.feedback import forking_records

    fork = 'Two:\n<promise topic="a"/>\n<promise topic="b"/><async topic="a">one</async><async topic="b">two</async>'
    plain = "Two: one, two."
    numbered = fork.replace(">one<", ">1. one<").replace(">two<", ">2. two<")
    misnumbered = fork.replace(">one<", ">1. one<").replace(">two<", ">3. two<")
    cases = {  # prompt -> its candidates
        "best fork": [_candidate(fork, quality=0.6), _candidate(fork, quality=0.8), _candidate(plain, quality=0.9)],
        "no fork": [_candidate(plain, quality=0.9), _candidate(plain, quality=0.1)],
        "fork below the median": [_candidate(fork, quality=0.2), _candidate(plain, quality=0.5),
                                  _candidate(plain, quality=0.6)],
        "cut at the limit": [_candidate(fork, quality=0.9, finish="max_new_tokens"), _candidate(plain, quality=0.1)],
        "malformed": [_candidate(fork, quality=0.9, malformed=1), _candidate(plain, quality=0.1)],
        "stop string": [_candidate(plain, quality=0.1), _candidate(fork, quality=0.9, finish="stop_string")],
        "numbered out of order": [_candidate(misnumbered, quality=0.9), _candidate(plain, quality=0.1)],
        "numbered in order": [_candidate(numbered, quality=0.9), _candidate(plain, quality=0.1)],
    }
    scored = [
        ScoredPrompt(id=name, prompt_index=i, instruction=f"q {name}", input="", reference="r", prompt_ids=[1],
                     judge="j", status="scored", candidates=candidates, reference_num_tokens=9)
        for i, (name, candidates) in enumerate(cases.items())
    ]
    records = forking_records(scored, float("inf"), SpeedReward.latency, round_index=2)
    assert [(r["prompt_id"], r["candidate_index"]) for r in records] == [("best fork", 1), ("stop string", 1),
                                                                          ("numbered in order", 0)]
    assert records[0]["annotated"] == fork and records[0]["output"] == "Two:\none\ntwo"
    assert records[0]["num_promises"] == 2 and records[0]["round"] == 2 and records[0]["quality"] == 0.8
    # SFT reads them as promise-bearing training records.
    assert len(with_min_promises([Record.from_dict(r) for r in records], 1)) == 3


def fake_checkpoint(folder: Path) -> Path:
    """A checkpoint folder as transformers writes one: trainer state, a safetensors file, torch's zip files."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text('{"global_step": 1}')
    save_file({"w": torch.zeros(64)}, folder / "adapter_model.safetensors")
    torch.save({"state": {}}, folder / "optimizer.pt")
    return folder


@pytest.mark.parametrize("damage", ["trainer_state.json", "adapter_model.safetensors", "optimizer.pt"])
def test_a_resume_passes_over_a_damaged_newest_checkpoint_to_the_one_before(tmp_path, damage, caplog):
    """A kill or a full disk while the newest checkpoint was written: the run resumes from the one before."""
    older = fake_checkpoint(tmp_path / "checkpoints" / "checkpoint-1")
    newest = fake_checkpoint(tmp_path / "checkpoints" / "checkpoint-2")
    os.truncate(newest / damage, 10)
    assert checkpoint_to_resume(tmp_path / "checkpoints", resume=True) == str(older)
    assert f"{newest} cannot be resumed from: " in caplog.text
    os.truncate(older / damage, 10)
    assert checkpoint_to_resume(tmp_path / "checkpoints", resume=True) is None  # from the beginning, warned
    with pytest.raises(PastaError, match="already holds checkpoints: pass resume=true"):
        checkpoint_to_resume(tmp_path / "checkpoints", resume=False)


@pytest.mark.parametrize(("stage", "override", "message"), [
    ("sft", "stage.num_train_epochs=0", r"stage.num_train_epochs: must be > 0, got 0.0"),
    ("sft", "stage.max_steps=0", r"stage.max_steps: must be >= 1, or -1 for num_train_epochs, got 0"),
    ("sft", "stage.learning_rate=-1", r"stage.learning_rate: must be > 0, got -1.0"),
    ("sft", "stage.logging_steps=0", r"stage.logging_steps: must be >= 1, got 0"),
    ("sft", "stage.lr_scheduler_type=bogus", r"stage.lr_scheduler_type='bogus' is not one of linear, cosine"),
    ("sft", "stage.report_to=bogus", r"stage.report_to='bogus' is not one of none, all"),
    ("sft", "stage.lora.r=0", r"stage.lora.r: must be >= 1, got 0"),
    ("sft", "stage.lora.dropout=1", r"stage.lora.dropout: must be in \[0, 1\), got 1.0"),
    ("sft", "stage.gradient_accumulation_steps=0", r"^stage.gradient_accumulation_steps: must be >= 1, got 0$"),
    ("sft", "stage.weight_decay=nan", r"^stage.weight_decay: must be >= 0, got nan$"),
    ("pref", "stage.max_new_tokens=0", r"^stage.max_new_tokens: must be >= 1, got 0$"),
    ("pref", "stage.sample_batch_size=0", r"^stage.sample_batch_size: must be >= 1, got 0$"),
    ("pref", "stage.num_samples=1", r"stage.num_samples: must be >= 2 \(a pair needs two candidates\), got 1"),
    ("pref", "stage.quality_weight=nan", r"stage.quality_weight: must be >= 0 \(inf = quality only\), got nan"),
    ("pref", "stage.prompts_per_round=0", r"stage.prompts_per_round: must be >= 1, or null for every prompt, got 0"),
    ("pref", "stage.temperature=-1", r"stage.temperature: must be >= 0, got -1.0"),
    ("pref", "stage.top_p=0", r"stage.top_p: must be in \(0, 1\], got 0.0"),
])
def test_a_training_setting_its_libraries_would_refuse_late_or_accept_wrongly_is_one_error_at_the_start(
        stage, override, message):
    with pytest.raises(PastaError, match=message):
        stage_settings(compose("train", [f"stage={stage}", override]).stage)  # what run_sft and run_pref begin with


def test_the_stage_defaults_and_a_reporter_by_name_pass():
    for stage in ("sft", "pref"):
        stage_settings(compose("train", [f"stage={stage}", "stage.report_to=tensorboard"]).stage)
