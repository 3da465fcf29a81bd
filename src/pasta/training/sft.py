"""Stage 1, supervised finetuning: `python -m pasta.train stage=sft data.path=annotated.jsonl`.

Trains the student on annotated responses in the PASTA-LANG layout (one sequence per example holding every thread,
with the mask, positions and targets the decoder will reproduce) through TRL's SFTTrainer; with
`data.strip_annotations=true` the same records without tags give Baseline-SFT, the sequential model that speed
and quality are compared against. Writes `<output_dir>/final` and `<output_dir>/train_info.json`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from pasta.data import load_instructions
from pasta.lang import ReservationPolicy, add_tag_tokens
from pasta.models import load_model
from pasta.training.collator import LayoutCollator
from pasta.training.config import SFTSettings, settings_from_cfg
from pasta.training.examples import build_sft_examples, examples_sha256, loader_config
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
    from datasets import Dataset
    from trl import SFTConfig

    from pasta.training.trainers import LayoutSFTTrainer

    settings = settings_from_cfg(cfg.stage)
    assert isinstance(settings, SFTSettings)
    output_dir = resolve_output_dir(cfg)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    strip = bool(cfg.data.get("strip_annotations", False))

    records = load_instructions(loader_config(cfg.data))
    model, tokenizer = load_model(cfg.model, device="cpu")  # the trainer moves it to its device
    tag_ids = add_tag_tokens(tokenizer, model)
    examples, stats = build_sft_examples(
        records,
        tokenizer,
        strip_annotations=strip,
        max_length=settings.max_length,
        too_long=settings.too_long,
        min_promises=int(cfg.data.get("min_promises", 0)),
    )
    data_sha256 = examples_sha256(examples)
    log.info("sft: %d of %d records used (%s)", stats.num_used, stats.num_records, stats.as_dict())

    checkpoint_dir = output_dir / "checkpoints"
    resume_from = checkpoint_to_resume(checkpoint_dir, bool(cfg.get("resume", False)))
    check_same_data(output_dir, data_sha256)
    base_info = {
        "stage": "sft",
        "baseline": strip,
        "data_sha256": data_sha256,
        "data_path": cfg.data.get("path"),
        "examples": stats.as_dict(),
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
        train_dataset=Dataset.from_list(examples),
        data_collator=collator,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    expose_head_bias(trainer.model)
    check_sharding(trainer, settings)
    if trainer.is_world_process_zero():
        write_train_info(output_dir, cfg, status="running", **base_info)
    start = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - start
    final = save_final(trainer, tokenizer, settings, output_dir)
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
