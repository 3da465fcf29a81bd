"""Is a preference round's held-out change bigger than what any update of its size does? A noise floor.

    python scripts/pref_noise_floor.py --start outputs/cpu/sft/final \\
        --round outputs/prefstudy/lambdainf/round-1/final --heldout ../shared/data/alpaca_eval.jsonl \\
        --heldout-limit 24 --max-new-tokens 128 --seeds 0 1 2

A round moves the weights by some amount; greedy decoding is chaotic, so even an update with no direction can change
the held-out answers, and with them the theoretical speedup and the quality proxy. This script measures that: for
each seed it adds to every weight of --start a random update with the same Frobenius norm, tensor by tensor, as the
round's own update (--round minus --start), decodes the held-out prompts greedily with the asynchronous decoder
(pasta.training.heldout, the same check the preference stage runs: same prompts, seed and judge), and prints the
held-out speedup and quality proxy of --start, of --round, and of each random update of the round's size. The proxy
is the stage's default judge: embedding similarity (all-MiniLM-L6-v2) to the prompts' reference answers, a proxy,
not a win rate. A round whose change lies inside the random updates' spread has not shown an effect.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import torch

from pasta.cli import run_script
from pasta.config import compose
from pasta.data import check_output_dir
from pasta.errors import ArgumentParser
from pasta.judges import build_judge
from pasta.lang import ReservationPolicy, add_tag_tokens
from pasta.models import load_model, resolve_source
from pasta.training.heldout import check_policy, heldout_records


def parse_args() -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", required=True, help="the round's starting policy (a checkpoint folder)")
    parser.add_argument("--round", required=True, help="the round's trained policy (a checkpoint folder)")
    parser.add_argument("--heldout", required=True, help="held-out prompts with reference answers (JSONL/JSON)")
    parser.add_argument("--heldout-limit", type=int, default=24)
    parser.add_argument("--heldout-seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="outputs/noise_floor", help="folder for each policy's held-out answers")
    return parser.parse_args()


def policy_config(folder: str):
    return compose("train", ["stage=pref", "device=cpu", f"model.path={folder}"])


def load(folder: str, flag: str):
    """The policy at `folder` (`flag` names it in errors) and its config."""
    cfg = policy_config(folder)
    model, tokenizer = load_model(cfg.model, device="cpu", path_key=flag)
    add_tag_tokens(tokenizer, model)
    return cfg, model, tokenizer


@torch.no_grad()
def random_update_of_size(model, start: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], seed: int):
    """Set `model` to start + a random direction per tensor, scaled to the norm of that tensor's trained update."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        step = (trained[name] - start[name]).norm()
        noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
        param.copy_(start[name] + noise * (step / noise.norm().clamp_min(1e-12)))


def main() -> None:
    args = parse_args()
    # Every input and the output first: --round is loaded only after --start's check, minutes in.
    records = heldout_records(args.heldout, args.heldout_limit, args.heldout_seed, key="--heldout")
    resolve_source(policy_config(args.round).model, "--round")
    out = check_output_dir(args.out, "--out")
    cfg, model, tokenizer = load(args.start, "--start")
    judge = build_judge(cfg.judge)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)

    def check(name: str):
        summary = check_policy(model, tokenizer, records, judge, policy, args.max_new_tokens, args.batch_size,
                               out / name)  # fmt: skip
        print(f"{name:>14}: {summary.line()}", flush=True)
        return summary

    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    rows = {"start": check("start")}
    _, trained_model, _ = load(args.round, "--round")
    trained = {name: p.detach().clone() for name, p in trained_model.named_parameters()}
    del trained_model
    update_norm = sum(float((trained[n] - start[n]).norm() ** 2) for n in start) ** 0.5
    print(f"round update: Frobenius norm {update_norm:.4f} over {len(start)} tensors", flush=True)
    model.load_state_dict(trained, strict=False)
    rows["round"] = check("round")
    for seed in args.seeds:
        random_update_of_size(model, start, trained, seed)
        rows[f"random-{seed}"] = check(f"random-{seed}")
    base = rows["start"]
    print("\nchange from start (held-out speedup, quality proxy [embedding similarity, a proxy]):")
    for name, row in rows.items():
        proxy = None if row.quality_proxy is None or base.quality_proxy is None else row.quality_proxy - base.quality_proxy
        print(f"{name:>14}: speedup {row.mean_speedup - base.mean_speedup:+.3f}, proxy "
              + ("n/a" if proxy is None else f"{proxy:+.3f}"))
    (out / "noise_floor.json").write_text(json.dumps(
        {"args": vars(args), "update_norm": update_norm,
         "rows": {name: asdict(row) for name, row in rows.items()}},
        indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    run_script(main)
