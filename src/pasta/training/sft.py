"""Stage 1, supervised finetuning: `python -m pasta.train stage=sft data.path=annotated.jsonl`.

Trains the student on annotated responses in the PASTA-LANG layout (one sequence per example holding every thread,
with the mask, positions and targets the decoder will reproduce) through TRL's SFTTrainer; with
`data.strip_annotations=true` the same records without tags give Baseline-SFT, the sequential model that speed
and quality are compared against. Writes `<output_dir>/final` and `<output_dir>/train_info.json`.

Before training it leaves out every record whose prompt is held out for evaluation (pasta.data.heldout; counted
in train_info.json's `loaded`), keeps only the promise-bearing records when they are scarce (`data.min_promise_share`, a
logged decision), refuses PASTA-SFT on data without a single promise, and counts what `stage.max_length` cuts; batches are grouped by length.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pasta.data import LoadReport, Record, load_training_records
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, TagIds, add_tag_tokens
from pasta.models import load_model
from pasta.training.collator import LayoutCollator
from pasta.training.config import Finetune, SFTSettings, TrainingData, stage_settings
from pasta.training.examples import (
    ExampleStats,
    PromiseBalance,
    balance_promises,
    build_sft_examples,
    examples_sha256,
    loader_config,
    num_rows,
)
from pasta.training.modeling import (
    check_sharding,
    expose_head_bias,
    lora_config,
    save_base_once,
    save_final,
)
from pasta.training.runs import (
    check_same_data,
    check_same_model,
    checkpoint_to_resume,
    resolve_output_dir,
    write_train_info,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTRun:
    """Where and how stage 1 trains: the composed config, its stage and data settings, the output folder."""

    cfg: DictConfig
    settings: SFTSettings
    data: TrainingData
    output_dir: Path

    @property
    def checkpoint_dir(self) -> Path:
        return self.output_dir / "checkpoints"


@dataclass(frozen=True)
class SFTData:
    """The examples stage 1 trains on, and the account of them that train_info.json keeps."""

    examples: list[dict[str, Any]]
    stats: ExampleStats
    balance: PromiseBalance | None  # None when data.min_promises left nothing to balance
    baseline: bool  # data.strip_annotations: the records without tags, for Baseline-SFT
    data_path: str | None
    sha256: str  # of the examples: a resumed run must train on the same ones
    loaded: LoadReport  # what loading left out: the held-out pool's prompts, malformed records, long answers

    def info(self) -> dict[str, Any]:
        """train_info.json's fields about the data, written with every status."""
        return {
            "baseline": self.baseline,
            "data_sha256": self.sha256,
            "data_path": self.data_path,
            "examples": self.stats.as_dict(),
            "promise_balance": self.balance.as_dict() if self.balance else None,
            "loaded": self.loaded.as_dict(),
        }


def run_sft(cfg: DictConfig) -> Path:
    """Train stage 1 as `cfg` says; returns the final model folder."""
    settings = stage_settings(cfg.stage)
    assert isinstance(settings, SFTSettings)
    run = SFTRun(cfg, settings, TrainingData.from_data_cfg(cfg.data), resolve_output_dir(cfg))
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    records, balance, loaded = balanced_records(cfg, run.data)
    model, tokenizer = load_model(cfg.model, device="cpu")  # the trainer moves it to its device
    tag_ids = add_tag_tokens(tokenizer, model)
    data = sft_data(run, records, balance, tokenizer, policy, loaded)
    resume_from = checkpoint_to_resume(run.checkpoint_dir, bool(cfg.get("resume", False)))
    check_same_data(run.output_dir, data.sha256)
    check_same_model(run.output_dir, cfg.model)
    trainer = sft_trainer(run, model, tokenizer, tag_ids, policy, data.examples)
    # Baseline-SFT writes no promise: its checkpoint records no policy (pasta.models.trained_lang).
    trained_policy = None if run.data.strip_annotations else policy
    return train_and_save(run, trainer, tokenizer, resume_from, {"stage": "sft", **data.info()}, trained_policy)


def balanced_records(cfg: DictConfig, data: TrainingData
                     ) -> tuple[list[Record], PromiseBalance | None, LoadReport]:
    """The data's records less the held-out pool's (pasta.data.load_training_records), the promise-bearing ones
    only when they are scarce (data.min_promise_share, a logged decision), and what loading left out."""
    records, loaded = load_training_records(loader_config(cfg.data))
    if not records:
        raise PastaError(f"data {cfg.data.name}: no training record is left: {loaded.why_empty()}")
    if data.min_promises > 0:  # with min_promises every record used carries promises: nothing to balance
        return records, None, loaded
    records, balance = balance_promises(records, min_promise_share=data.min_promise_share,
                                        plain_per_promise=data.plain_per_promise, seed=int(cfg.get("seed") or 0))
    log.info("sft: %s", balance.message())
    return records, balance, loaded


def sft_data(
    run: SFTRun, records: list[Record], balance: PromiseBalance | None, tokenizer, policy: ReservationPolicy,
    loaded: LoadReport | None = None,
) -> SFTData:
    """The records as training examples, with what stage.max_length cut logged; refuses PASTA-SFT on data without
    a single promise."""
    cfg, settings, strip = run.cfg, run.settings, run.data.strip_annotations
    examples, stats = build_sft_examples(
        records,
        tokenizer,
        strip_annotations=strip,
        max_length=settings.max_length,
        too_long=settings.too_long,
        min_promises=run.data.min_promises,
        counts=policy.counts,
        min_lead_words=run.data.min_lead_words,
    )
    if not strip and not any(example["opener_ids"] for example in examples):
        source = cfg.data.get("path") or cfg.data.get("name")
        raise PastaError(
            f"none of the {stats.num_used} usable records of {source} carries "
            "a promise, so PASTA-SFT would train a model that never forks: annotate the data first "
            "(python -m pasta.annotate data.path=... output=annotated.jsonl) and train on that, or set "
            "data.strip_annotations=true for Baseline-SFT"
        )
    data = SFTData(examples, stats, balance, strip, cfg.data.get("path"), examples_sha256(examples),
                   loaded or LoadReport())
    log.info("sft: %d of %d records used (%s)", stats.num_used, stats.num_records, stats.as_dict())
    if stats.truncation_message():
        log.warning("sft: %s", stats.truncation_message())
    return data


def sft_trainer(
    run: SFTRun, model, tokenizer, tag_ids: TagIds, policy: ReservationPolicy, examples: list[dict[str, Any]]
):
    """TRL's SFTTrainer on the examples' PASTA-LANG layouts; under unmerged LoRA it saves the base model first."""
    from trl import SFTConfig

    from pasta.training.trainers import LayoutSFTTrainer

    cfg, settings, output_dir = run.cfg, run.settings, run.output_dir
    peft_config = None
    if settings.finetune == Finetune.lora:
        peft_config = lora_config(settings.lora, model, tag_ids)
        if not settings.merge_lora:
            save_base_once(model, tokenizer, output_dir / "base")
    args = SFTConfig(
        **settings.trainer_kwargs(run.checkpoint_dir, cfg),
        dataset_kwargs={"skip_prepare_dataset": True},
        packing=False,
    )
    collator = LayoutCollator(
        tag_ids=tag_ids,
        pad_id=tokenizer.pad_token_id,
        policy=policy,
        max_length=settings.max_length,
        mask_dtype=model.dtype,
    )
    trainer = LayoutSFTTrainer(
        model=model,
        args=args,
        train_dataset=training_dataset(examples, settings.max_length),
        data_collator=collator,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    expose_head_bias(trainer.model)
    check_sharding(trainer, settings)
    return trainer


def train_and_save(run: SFTRun, trainer, tokenizer, resume_from: str | None, info: dict[str, Any],
                   policy: ReservationPolicy | None) -> Path:
    """Train (on from `resume_from` when set) and save `final` with the reservation `policy` it was trained with;
    train_info.json says running, then done or failed (`info` in every status)."""
    cfg, settings, output_dir = run.cfg, run.settings, run.output_dir
    if trainer.is_world_process_zero():
        write_train_info(output_dir, cfg, status="running", **info)
    try:
        start = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=resume_from)
        seconds = time.perf_counter() - start
        final = save_final(trainer, tokenizer, settings, output_dir, policy)
    except BaseException as exc:
        if trainer.is_world_process_zero():
            write_train_info(output_dir, cfg, status="failed", reason=failure_reason(exc), **info)
        raise
    if trainer.is_world_process_zero():
        write_train_info(
            output_dir,
            cfg,
            status="done",
            **info,
            final_dir=str(final),
            metrics={**result.metrics, "train_seconds": seconds},
            log_history=trainer.state.log_history,
        )
        write_train_info(final, cfg, status="done", **info, metrics=result.metrics)
    return final


def training_dataset(examples: list[dict], max_length: int):
    """The examples as a `datasets.Dataset`, with the `length` column (rows trained) that group_by_length reads."""
    from datasets import Dataset

    return Dataset.from_list(examples).add_column("length", [min(num_rows(e), max_length) for e in examples])


def failure_reason(exc: BaseException) -> str:
    """One line for train_info.json: the exception's type and first line."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt); resume=true continues from the last checkpoint"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
