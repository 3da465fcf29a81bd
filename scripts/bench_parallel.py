"""Benchmark data-parallel decoding: `accelerate launch` N processes x T/N threads against 1 process x T threads.

    python scripts/bench_parallel.py --model-path outputs/cpu/sft/final --num-prompts 50      # this 2-core CPU
    python scripts/bench_parallel.py --override model=tiny --num-prompts 4 --max-new-tokens 8  # smoke

Both arms run `python -m pasta.eval eval.mode=generate eval.timing=throughput` on the same seeded subset of
AlpacaEval prompts (`eval_data=alpaca_eval eval.subset=N eval.subset_seed=0`), one arm after the other, each into its
own fresh run directory: one process with --threads torch threads, then `accelerate launch` with --processes
processes (conf/accelerate/cpu_ddp.yaml, gloo) of threads/processes threads each. Each arm is timed end to end from
the command's start to its exit, so process start-up and model loading count (once per process); the decode-only
time is printed beside it, from the run's stats.jsonl (sum of the batch times, divided by the process count: the
processes decode their shares at the same time). It prints prompts/s of each arm and the ratio, and how many answers
differ between the arms (greedy decoding, but batches are padded differently when the prompts are split, so float
rounding can flip a token), and writes the numbers to --out as JSON.
Timings on a shared machine are noisy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pasta.cli import child_error, run_script
from pasta.config import compose
from pasta.data import check_output_file
from pasta.errors import ArgumentParser, PastaError
from pasta.models import resolve_source
from pasta.settings import check_settings

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", help="checkpoint folder (default: the config's model, the embedded SmolLM2)")
    parser.add_argument("--override", action="append", default=[], help="extra pasta.eval override (repeatable)")
    parser.add_argument("--num-prompts", type=int, default=50, help="AlpacaEval prompts (eval.subset, seed 0)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="eval.batch_size of each process")
    parser.add_argument("--decode", default="async", choices=("async", "sequential"))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads in all")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/bench_parallel.json")
    return parser.parse_args()


def eval_overrides(args: argparse.Namespace, output_dir: Path, threads: int) -> list[str]:
    model = [f"model.path={args.model_path}"] if args.model_path else []
    return [
        *model, "device=cpu", f"num_threads={threads}", f"decode={args.decode}", "eval_data=alpaca_eval",
        f"eval.subset={args.num_prompts}", "eval.subset_seed=0", f"decode.max_new_tokens={args.max_new_tokens}",
        "eval.mode=generate", "eval.timing=throughput", f"eval.batch_size={args.batch_size}",
        "eval.generator=bench", f"output_dir={output_dir}", *args.override,
    ]  # fmt: skip


def timed(command: list[str], threads: int) -> float:
    """Run `command` offline with OMP_NUM_THREADS=threads; its wall time in seconds (it must succeed)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise PastaError(f"{' '.join(command[2:4])} failed: {child_error(done.stderr)}")
    return seconds


def decode_seconds(run_dir: Path, num_processes: int) -> float:
    """The run's decode time, over the processes decoding at once: each answer's time shared by the answers decoded
    beside it (`batch_size`). Continuously batched, an answer's time runs from its joining to its end, so the sum is
    exact while the batch is full and a little short in the tail, where fewer requests are left."""
    batches = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    return sum(r["wall_s"] / r["batch_size"] for r in batches) / num_processes


def answers(run_dir: Path) -> list[str]:
    return [r["output"] for r in json.loads((run_dir / "model_outputs.json").read_text())]


def check_inputs(args: argparse.Namespace) -> None:
    """The evaluation's settings, the model folder and the output file, before either arm decodes (minutes)."""
    cfg = compose("eval", eval_overrides(args, Path(tempfile.gettempdir()) / "bench_parallel.check", args.threads))
    check_settings(cfg, "eval")
    if args.model_path:
        resolve_source(cfg.model, "--model-path")
    check_output_file(args.out, "--out")


def main() -> None:
    args = parse_args()
    check_inputs(args)
    threads_each = max(1, args.threads // args.processes)
    with tempfile.TemporaryDirectory(prefix="bench_parallel.") as tmp:
        one, many = Path(tmp) / "one", Path(tmp) / "launched"
        single = [sys.executable, "-m", "pasta.eval", *eval_overrides(args, one, args.threads)]
        launched = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(ROOT / "conf" / "accelerate" / "cpu_ddp.yaml"),
            "--num_processes", str(args.processes), "--num_cpu_threads_per_process", str(threads_each),
            "-m", "pasta.eval", *eval_overrides(args, many, threads_each),
        ]  # fmt: skip
        arms = {}
        for name, command, run_dir, processes, threads in (
            (f"1 process x {args.threads} threads", single, one, 1, args.threads),
            (f"{args.processes} processes x {threads_each} threads", launched, many, args.processes, threads_each),
        ):
            wall = timed(command, threads)
            decode = decode_seconds(run_dir, processes)
            arms[name] = {"wall_s": wall, "decode_s": decode, "prompts_per_s": args.num_prompts / wall,
                          "decode_prompts_per_s": args.num_prompts / decode}  # fmt: skip
            print(f"{name:>28}: {wall:7.1f} s end to end ({args.num_prompts / wall:.3f} prompts/s), "
                  f"{decode:7.1f} s decoding ({args.num_prompts / decode:.3f} prompts/s)", flush=True)
        num_different = sum(a != b for a, b in zip(answers(one), answers(many), strict=True))
    (base, base_arm), (_, launched_arm) = arms.items()
    ratio = launched_arm["prompts_per_s"] / base_arm["prompts_per_s"]
    decode_ratio = launched_arm["decode_prompts_per_s"] / base_arm["decode_prompts_per_s"]
    print(f"\nprompts/s, {args.processes} processes over 1: {ratio:.2f}x end to end, {decode_ratio:.2f}x decoding "
          f"({args.num_prompts} AlpacaEval prompts, subset seed 0, {args.max_new_tokens} new tokens, "
          f"decode={args.decode}, batch {args.batch_size}); answers that differ: {num_different}")
    result = {"args": vars(args), "arms": arms, "ratio_end_to_end": ratio, "ratio_decoding": decode_ratio,
              "num_different_answers": num_different}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    run_script(main)
