"""Benchmark: training tokens/s of pasta's SFT (PASTA-LANG layout: 4-D mask, position ids, aligned targets) against
TRL's SFTTrainer with its default collator (2-D padding mask, causal attention) on the same token sequences.

    python scripts/bench_sft.py                                   # embedded SmolLM2-135M, data/annotated_examples.jsonl
    python scripts/bench_sft.py --model tiny --steps 6 --repeats 3
    python scripts/bench_sft.py --data outputs/annotate/annotated.jsonl --batch-size 8 --json bench.json

Both trainers see the same rows (prompt, main thread, chunks in the layout's order) and train the same tokens, so
the ratio is the cost of the layout itself. They alternate (pasta, trl, pasta, trl, ...) inside one process, the
first step of each run is left out as warm-up, and the ratio of the medians is reported: timings on a shared
machine drift, ratios measured side by side much less.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from pasta.cli import run_script
from pasta.config import conf_dir
from pasta.data import check_output_file
from pasta.errors import ArgumentParser, PastaError

ROOT = Path(__file__).resolve().parents[1]


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def check_inputs(model: str, data: str, json_path: str | None) -> None:
    """The CPU training benchmarks' --model, --data and --json, before a model loads or a step is timed."""
    names = sorted(path.stem for path in (conf_dir() / "model").glob("*.yaml"))
    if model not in names:
        raise PastaError(f"--model={model}: not a model config name (conf/model/: {', '.join(names)})")
    if not Path(data).is_file():
        raise PastaError(f"--data={data}: no such file (annotated JSONL)")
    if json_path:
        check_output_file(json_path, "--json")


def report(result: dict, json_path: str | None) -> None:
    """Print the result, and write it to `json_path` when given."""
    print(json.dumps(result, indent=2))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")


def run_trainer(trainer_cls, model, tokenizer, dataset, collator, steps, batch_size, workdir, **config):
    from trl import SFTConfig

    args = SFTConfig(
        output_dir=str(workdir),
        max_steps=steps + 1,
        per_device_train_batch_size=batch_size,
        learning_rate=1e-5,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        **config,
    )
    timer = StepTimer()
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    seconds = sum(timer.seconds[1:])  # the first step warms up
    num_tokens = trainer.state.log_history[-2]["num_tokens"] - trainer.state.log_history[0]["num_tokens"]
    return num_tokens / seconds


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model config name (conf/model/), e.g. tiny")
    parser.add_argument(
        "--data", default=str(ROOT / "data" / "annotated_examples.jsonl"), help="annotated JSONL"
    )
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run (plus one warm-up step)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each trainer, alternating")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    check_inputs(args.model, args.data, args.json)
    if args.threads:
        torch.set_num_threads(args.threads)

    from datasets import Dataset
    from trl import SFTTrainer

    from pasta.config import compose
    from pasta.data import read_jsonl
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import load_model
    from pasta.training.collator import LayoutCollator
    from pasta.training.examples import build_sft_examples
    from pasta.training.trainers import LayoutSFTTrainer

    cfg = compose("train", [f"model={args.model}"])
    base, tokenizer = load_model(cfg.model, device="cpu")
    tag_ids = add_tag_tokens(tokenizer, base)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    examples, _ = build_sft_examples(
        read_jsonl(args.data),
        tokenizer,
        strip_annotations=False,
        max_length=args.max_length,
        too_long="truncate",
    )
    collator = LayoutCollator(tag_ids, tokenizer.pad_token_id, policy, max_length=args.max_length)
    # The same rows as plain causal sequences, trained on everything after the prompt, for TRL's own collator.
    layouts = [collator.layout(example) for example in examples]
    plain = Dataset.from_list(
        [
            {
                "input_ids": layout.input_ids,
                "completion_mask": [int(i >= layout.num_prompt) for i in range(len(layout))],
            }
            for layout in layouts
        ]
    )
    pasta_data = Dataset.from_list(examples)

    rates: dict[str, list[float]] = {"pasta": [], "trl": []}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for name in ("pasta", "trl"):
                model = type(base)(base.config)
                model.load_state_dict(base.state_dict())
                if name == "pasta":
                    rate = run_trainer(
                        LayoutSFTTrainer,
                        model,
                        tokenizer,
                        pasta_data,
                        collator,
                        args.steps,
                        args.batch_size,
                        Path(workdir) / f"{name}{repeat}",
                        remove_unused_columns=False,
                        max_length=None,
                        dataset_kwargs={"skip_prepare_dataset": True},
                    )
                else:
                    rate = run_trainer(
                        SFTTrainer,
                        model,
                        tokenizer,
                        plain,
                        None,
                        args.steps,
                        args.batch_size,
                        Path(workdir) / f"{name}{repeat}",
                        max_length=None,
                        completion_only_loss=True,
                    )
                rates[name].append(rate)
                print(f"{name} run {repeat + 1}: {rate:.0f} tokens/s", file=sys.stderr, flush=True)
    result = {
        "model": args.model,
        "num_examples": len(examples),
        "batch_size": args.batch_size,
        "mean_rows_per_example": statistics.mean(len(layout) for layout in layouts),
        "threads": torch.get_num_threads(),
        "pasta_tokens_per_s": statistics.median(rates["pasta"]),
        "trl_tokens_per_s": statistics.median(rates["trl"]),
        "runs": rates,
    }
    result["ratio_pasta_over_trl"] = result["pasta_tokens_per_s"] / result["trl_tokens_per_s"]
    report(result, args.json)
    return result


if __name__ == "__main__":
    run_script(main)
