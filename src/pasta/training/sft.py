"""Stage 1, supervised finetuning: `python -m pasta.train stage=sft data.path=annotated.jsonl`.

Trains the student on annotated responses in the PASTA-LANG layout (one sequence per example holding every thread,
with the mask, positions and targets the decoder will reproduce) through TRL's SFTTrainer; with
`data.strip_annotations=true` the same records without tags give Baseline-SFT, the sequential model that speed
and quality are compared against. Writes `<output_dir>/final` and `<output_dir>/train_info.json`.

Before training it balances promise-bearing and plain records (`data.promise_share`, a logged decision), refuses
PASTA-SFT on data without a single promise, and counts what `stage.max_length` cuts; batches are grouped by length.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from pasta.data import load_instructions
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, add_tag_tokens
from pasta.models import load_model
from pasta.training.collator import LayoutCollator
from pasta.training.config import SFTSettings, settings_from_cfg
from pasta.training.examples import (
    balance_promises,
    balance_settings,
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
    checkpoint_to_resume,
    resolve_output_dir,
    write_train_info,
)

log = logging.getLogger(__name__)


def run_sft(cfg: DictConfig) -> Path:
    """Train stage 1 as `cfg` says; returns the final model folder."""
    from trl import SFTConfig

    from pasta.training.trainers import LayoutSFTTrainer

    settings = settings_from_cfg(cfg.stage)
    assert isinstance(settings, SFTSettings)
    output_dir = resolve_output_dir(cfg)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    strip = bool(cfg.data.get("strip_annotations", False))

    min_promises = int(cfg.data.get("min_promises", 0))
    promise_share, max_upsample = balance_settings(cfg.data)
    records = load_instructions(loader_config(cfg.data))
    balance = None
    if min_promises <= 0:  # with min_promises every record used carries promises: nothing to balance
        records, balance = balance_promises(
            records, promise_share=promise_share, max_upsample=max_upsample, seed=int(cfg.get("seed") or 0)
        )
        log.info("sft: %s", balance.message())
    model, tokenizer = load_model(cfg.model, device="cpu")  # the trainer moves it to its device
    tag_ids = add_tag_tokens(tokenizer, model)
    examples, stats = build_sft_examples(
        records,
        tokenizer,
        strip_annotations=strip,
        max_length=settings.max_length,
        too_long=settings.too_long,
        min_promises=min_promises,
    )
    if not strip and not any(example["opener_ids"] for example in examples):
        source = cfg.data.get("path") or cfg.data.get("name")
        raise PastaError(
            f"none of the {stats.num_used} usable records of {source} carries "
            "a promise, so PASTA-SFT would train a model that never forks: annotate the data first "
            "(python -m pasta.annotate data.path=... output=annotated.jsonl) and train on that, or set "
            "data.strip_annotations=true for Baseline-SFT"
        )
    data_sha256 = examples_sha256(examples)
    log.info("sft: %d of %d records used (%s)", stats.num_used, stats.num_records, stats.as_dict())
    if stats.truncation_message():
        log.warning("sft: %s", stats.truncation_message())

    checkpoint_dir = output_dir / "checkpoints"
    resume_from = checkpoint_to_resume(checkpoint_dir, bool(cfg.get("resume", False)))
    check_same_data(output_dir, data_sha256)
    base_info = {
        "stage": "sft",
        "baseline": strip,
        "data_sha256": data_sha256,
        "data_path": cfg.data.get("path"),
        "examples": stats.as_dict(),
        "promise_balance": balance.as_dict() if balance else None,
    }
    peft_config = None
    if settings.finetune == "lora":
        peft_config = lora_config(settings.lora, model, tag_ids)
        if not settings.merge_lora:
            save_base_once(model, tokenizer, output_dir / "base")
    args = SFTConfig(
        **settings.trainer_kwargs(checkpoint_dir, cfg),
        dataset_kwargs={"skip_prepare_dataset": True},
        packing=False,
        max_length=None,
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
    if trainer.is_world_process_zero():
        write_train_info(output_dir, cfg, status="running", **base_info)
    try:
        start = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=resume_from)
        seconds = time.perf_counter() - start
        final = save_final(trainer, tokenizer, settings, output_dir)
    except BaseException as exc:
        if trainer.is_world_process_zero():
            write_train_info(output_dir, cfg, status="failed", reason=failure_reason(exc), **base_info)
        raise
    if trainer.is_world_process_zero():
        write_train_info(
            output_dir,
            cfg,
            status="done",
            **base_info,
            final_dir=str(final),
            metrics={**result.metrics, "train_seconds": seconds},
            log_history=trainer.state.log_history,
        )
        write_train_info(final, cfg, status="done", **base_info, metrics=result.metrics)
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
