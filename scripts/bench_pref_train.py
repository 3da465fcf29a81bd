"""Benchmark: seconds of a preference round's training, for each of the preference stage's training speed-ups against
the one before, on the same pairs.

    python scripts/bench_pref_train.py --data outputs/study/annotated.jsonl      # the study's records, SmolLM2-135M
    python scripts/bench_pref_train.py --model tiny --pairs 2 --repeats 1        # a quick look
    python scripts/bench_pref_train.py --pairs 64 stage.num_train_epochs=1      # any preference setting, every variant

The variants add one change each, in this order:
1. `every step`: a reference forward on every training step (before 2026-11-29);
2. `scored once`: the reference scores every pair once, when training starts (`stage.precompute_ref_log_probs`);
3. `grouped`: batches of pairs of similar length (`stage.group_by_length`).

The pairs have the shape of the study's `untagged` pairs: the chosen side is a promise-bearing annotated record, the
rejected side its own words without tags. Each run is `pasta.training.pref.train_round` with the stage's defaults
(LoRA, 4 pairs a batch, two epochs) and the overrides; the variants alternate inside one process (1, 2, 3, 1, ...)
on copies of one loaded model, and each run's seconds cover the whole round's training (the reference pass
included) and the saving of its final model. Medians and their ratios are reported, with the largest difference
between the logged losses of the first two (the same batches: they should agree to float noise; grouping changes
the batches). Grouping pads less only where a round has pairs to group: transformers' sampler sorts groups of
`min(pairs // (4 x batch), 50)` batches, none below 16 pairs at batch 4. Run it alone: two torch jobs on 2 cores
slow each other far more than 2x.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_sft import check_inputs
from bench_train_cpu import check_no_gpu, cpu_training_arguments, report  # scripts/, this script's folder
from pasta.cli import run_script
from pasta.errors import ArgumentParser

VARIANTS = {
    "every step": ["stage.precompute_ref_log_probs=false", "stage.group_by_length=false"],
    "scored once": ["stage.precompute_ref_log_probs=true", "stage.group_by_length=false"],
    "grouped": ["stage.precompute_ref_log_probs=true", "stage.group_by_length=true"],
}


def untagged_pairs(data: Path, tokenizer, num_pairs: int, max_length: int) -> list:
    """The first `num_pairs` promise-bearing records of `data`: each annotated answer against its words untagged."""
    from pasta.data import Record, read_jsonl
    from pasta.training.pairs import record_pairs

    records = [Record.from_dict(r) for r in read_jsonl(data) if "<promise" in (r.get("annotated") or "")]
    records = records[:num_pairs]
    if len(records) < num_pairs:
        sys.exit(f"error: {data} holds {len(records)} promise-bearing records, fewer than --pairs {num_pairs}")
    return record_pairs(records, tokenizer, max_length, judge="bench")


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16, help="pairs of the round")
    cpu_training_arguments(parser, "more preference settings for every variant, as the stage takes them "
                                   "(stage.num_train_epochs=1)")
    args = parser.parse_args(argv)
    check_no_gpu()
    check_inputs(args.model, args.data, args.json)

    from pasta.config import compose
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import load_model
    from pasta.training.config import settings_from_cfg
    from pasta.training.pref import train_round

    base = ["stage=pref", "device=cpu", f"model={args.model}", "stage.save_steps=100000", "stage.logging_steps=1",
            *args.overrides]
    cfg = compose("train", base)
    model, tokenizer = load_model(cfg.model, device="cpu")
    add_tag_tokens(tokenizer, model)
    pairs = untagged_pairs(Path(args.data), tokenizer, args.pairs, settings_from_cfg(cfg.stage).max_length)
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    losses: dict[str, list[list[float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for index, (name, overrides) in enumerate(VARIANTS.items()):
                run_dir = Path(workdir) / f"{repeat}-{index}"
                run_cfg = compose("train", [*base, *overrides, f"output_dir={run_dir}"])
                start = time.perf_counter()
                metrics = train_round(copy.deepcopy(model), tokenizer, pairs, settings_from_cfg(run_cfg.stage),
                                      run_cfg, run_dir / "round-1", ReservationPolicy(), resume=False)
                seconds[name].append(time.perf_counter() - start)
                losses[name].append(metrics["loss_history"])
                print(f"{name} run {repeat + 1}: {seconds[name][-1]:.1f} s, last loss {metrics['loss_history'][-1]:.4f}",
                      file=sys.stderr, flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    names = list(VARIANTS)
    result = {
        "model": args.model,
        "data": args.data,
        "num_pairs": len(pairs),
        "threads": torch.get_num_threads(),
        "overrides": args.overrides,
        "seconds_per_round": medians,
        "speedup_over_previous": {b: medians[a] / medians[b] for a, b in itertools.pairwise(names)},
        "speedup_over_every_step": {name: medians["every step"] / medians[name] for name in names},
        "max_loss_difference": max(abs(a - b) for each, once in zip(losses["every step"], losses["scored once"],
                                                                    strict=True)
                                   for a, b in zip(each, once, strict=True)),
        "last_loss": {name: [history[-1] for history in runs] for name, runs in losses.items()},
        "runs": seconds,
    }
    report(result, args.json)
    return result


if __name__ == "__main__":
    run_script(main)
