"""Benchmark: seconds per SFT optimizer step on a CPU, for each of pasta's CPU training speed-ups against the one before.

    python scripts/bench_train_cpu.py --data outputs/study/annotated.jsonl      # the study's records, SmolLM2-135M
    python scripts/bench_train_cpu.py --model tiny --steps 2 --repeats 1        # a quick look
    python scripts/bench_train_cpu.py --model tiny stage.max_length=256       # any training setting, every variant

The variants add one change each, in this order:
1. `before`: float32, LoRA dropout 0.05, TRL's fused LM head (pasta's CPU training before 2026-11-26);
2. `bf16`: bf16 autocast (`stage.mixed_precision=auto` picks it on a CPU with AVX512-BF16 or AMX);
3. `dropout 0`: `stage.lora.dropout=0`;
4. `cpu head`: the LM head on the target rows only (pasta.training.lm_head), pasta's default on a CPU.

Each run builds the SFT stage's own trainer (`pasta.training.sft.sft_trainer`, the stage's defaults otherwise, LoRA),
trains `--steps` optimizer steps after one warm-up step on the same batches (seeded, not grouped by length, so the
first step is not the longest), and the variants alternate inside one process (1, 2, 3, 4, 1, 2, ...): timings on
a shared machine drift, ratios measured side by side much less. Medians of the runs' mean step times are reported,
with each variant's speed-up over the one before and over `before`. Run it alone: two torch jobs on 2 cores slow
each other far more than 2x.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from bench_sft import StepTimer, check_inputs, report  # scripts/, this script's folder, is first on sys.path
from pasta.cli import run_script
from pasta.errors import ArgumentParser, PastaError

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "before": (["stage.mixed_precision=no", "stage.lora.dropout=0.05"], False),
    "bf16": (["stage.mixed_precision=bf16", "stage.lora.dropout=0.05"], False),
    "dropout 0": (["stage.mixed_precision=bf16", "stage.lora.dropout=0"], False),
    "cpu head": (["stage.mixed_precision=bf16", "stage.lora.dropout=0"], True),
}


def mean_step_seconds(overrides: list[str], cpu_head: bool, workdir: Path) -> tuple[float, float]:
    """Mean seconds of the timed steps, and the last logged loss, of one SFT run with these overrides."""
    import pasta.training.trainers as trainers
    from pasta.config import compose
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import load_model
    from pasta.training.config import TrainingData, settings_from_cfg
    from pasta.training.sft import SFTRun, balanced_records, sft_data, sft_trainer

    cfg = compose("train", [*overrides, f"output_dir={workdir}"])
    run = SFTRun(cfg, settings_from_cfg(cfg.stage), TrainingData.from_data_cfg(cfg.data), workdir)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    records, balance, loaded = balanced_records(cfg, run.data)
    model, tokenizer = load_model(cfg.model, device="cpu")
    tag_ids = add_tag_tokens(tokenizer, model)
    data = sft_data(run, records, balance, tokenizer, policy, loaded)
    real_head = trainers.add_cpu_lm_head
    if not cpu_head:
        trainers.add_cpu_lm_head = lambda model, outputs=(): False  # TRL's fused head, as before pasta.training.lm_head
    try:
        trainer = sft_trainer(run, model, tokenizer, tag_ids, policy, data.examples)
    finally:
        trainers.add_cpu_lm_head = real_head
    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return statistics.mean(timer.seconds[1:]), float(losses[-1])


def cpu_training_arguments(parser: argparse.ArgumentParser, overrides_help: str) -> None:
    """The arguments of the CPU training benchmarks (this one, bench_pref_train.py): model, data, runs, output."""
    parser.add_argument("--model", default="smollm2-135m", help="model config name (conf/model/), e.g. tiny")
    parser.add_argument("--data", default=str(ROOT / "data" / "annotated_examples.jsonl"), help="annotated JSONL")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("overrides", nargs="*", help=overrides_help)


def check_no_gpu() -> None:
    if torch.cuda.is_available():
        raise PastaError("this benchmark times CPU training; run it on a machine without a GPU visible "
                         "(CUDA_VISIBLE_DEVICES=)")


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per run (plus one warm-up)")
    cpu_training_arguments(parser, "more training settings for every variant, as the stage takes them "
                                   "(stage.max_length=256 stage.gradient_accumulation_steps=1)")
    args = parser.parse_args(argv)
    check_no_gpu()
    check_inputs(args.model, args.data, args.json)

    from pasta.training.config import cpu_has_bf16

    # The study's SFT data selection (promise-bearing records only), the stage's batch of 2 x 4.
    base = ["stage=sft", "device=cpu", f"model={args.model}", f"data.path={args.data}", "data.plain_per_promise=0",
            f"stage.max_steps={args.steps + 1}", "stage.group_by_length=false", "stage.save_steps=100000",
            "stage.logging_steps=1", *args.overrides]
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    losses: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for name, (overrides, cpu_head) in VARIANTS.items():
                mean, loss = mean_step_seconds([*base, *overrides], cpu_head, Path(workdir) / f"{len(losses[name])}{name}")
                seconds[name].append(mean)
                losses[name].append(loss)
                print(f"{name} run {repeat + 1}: {mean:.2f} s/step, last loss {loss:.4f}", file=sys.stderr, flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    names = list(VARIANTS)
    result = {
        "model": args.model,
        "data": args.data,
        "cpu_has_bf16": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "overrides": args.overrides,
        "seconds_per_step": medians,
        "speedup_over_previous": {b: medians[a] / medians[b] for a, b in itertools.pairwise(names)},
        "speedup_over_before": {name: medians["before"] / medians[name] for name in names},
        "last_loss": losses,
        "runs": seconds,
    }
    report(result, args.json)
    return result


if __name__ == "__main__":
    run_script(main)
