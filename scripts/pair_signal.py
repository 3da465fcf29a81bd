"""What would a preference round teach under another speed reward or lambda? Re-pairs its scored candidates, no training.

    python scripts/pair_signal.py outputs/study/pref-lambda1/round-1/scores.jsonl
    python scripts/pair_signal.py SCORES --rewards latency_capped theoretical --lambdas 1 4 inf
    python scripts/pair_signal.py SCORES --length-tolerance 0.2      # as stage.pair_length_tolerance=0.2
    python scripts/pair_signal.py SCORES --quality-floor             # as stage.quality_floor=true
    python scripts/pair_signal.py SCORES --chosen-must-end           # as stage.chosen_must_end=true
    python scripts/pair_signal.py SCORES --rejected-side both --tokenizer <study>/sft/final   # + the untagged pairs

A round learns from one best-vs-worst pair per prompt. It can raise the fork rate only if its chosen sides fork more
often than its rejected ones; chosen sides shorter than the samples they were chosen from teach brevity (the SFT half
of the loss trains on them), even when both sides of each pair are about as long.
For every speed reward x lambda, this pairs the round's saved candidates (`scores.jsonl`, which keeps every
candidate's tokens, steps and quality) with the stage's own pairing (pasta.training.pairs; best vs worst, within
`--length-tolerance` when given, with `--quality-floor` no chosen side judged below its prompt's median candidate, with
`--chosen-must-end` none its budget cut) and prints, per side: how many fork, how many the budget cut, their
theoretical speedup (geomean), their tokens over the reference answer's (and, above the table, every sample's), and
their quality. The quality is the round's judge, named in the output; the embedding judge is an offline proxy.
`--rejected-side untagged|both` pairs as `stage.rejected_side` does, each best fork also against its own words
untagged, which the tokenizer of `--tokenizer` encodes (a model folder, e.g. the round's policy).
"""

from __future__ import annotations

import math
from pathlib import Path

from pasta.cli import run_script
from pasta.data import read_jsonl
from pasta.errors import ArgumentParser, PastaError
from pasta.lang import add_tag_tokens
from pasta.measure import geometric_mean
from pasta.models import load_tokenizer
from pasta.training.candidates import ScoredPrompt
from pasta.training.config import RejectedSide, SpeedReward
from pasta.training.examples import plain_answer_ids
from pasta.training.pairs import make_pairs, samples_mean_length_ratio, summarize


def read_scores(path: Path) -> list[ScoredPrompt]:
    """The scored prompts of a round's scores.jsonl; a file that is not one is a PastaError naming it."""
    try:
        return [ScoredPrompt.from_json(record) for record in read_jsonl(path)]
    except (TypeError, KeyError) as exc:
        raise PastaError(f"{path}: not a preference round's scores.jsonl ({exc})") from exc


def signal(scored: list[ScoredPrompt], quality_weight: float, reward: SpeedReward,
           length_tolerance: float | None = None, quality_floor: bool = False, chosen_must_end: bool = False,
           rejected_side: RejectedSide = RejectedSide.worst, tokenizer=None) -> dict[str, float | int | None]:
    """The pairs this reward and lambda make of the scored prompts, per side, in numbers."""
    pairs, skipped = make_pairs(scored, quality_weight, reward, length_tolerance, rejected_side,
                                lambda text, ended: plain_answer_ids(tokenizer, text, ended), quality_floor,
                                chosen_must_end)
    summary = summarize(scored, pairs, skipped, quality_weight, reward)
    return {
        "num_pairs": len(pairs),
        "chosen_num_forked": summary["chosen_num_forked"],
        "rejected_num_forked": summary["rejected_num_forked"],
        "chosen_num_cut": summary["chosen_num_cut"],
        "rejected_num_cut": summary["rejected_num_cut"],
        "chosen_speedup": geometric_mean([p.chosen.speedup for p in pairs]) if pairs else None,
        "rejected_speedup": geometric_mean([p.rejected.speedup for p in pairs]) if pairs else None,
        "chosen_length_ratio": summary["chosen_mean_length_ratio"],
        "rejected_length_ratio": summary["rejected_mean_length_ratio"],
        "chosen_quality": summary["chosen_mean_quality"],
        "rejected_quality": summary["rejected_mean_quality"],
    }


def table(rows: list[tuple[str, str, dict]], judge: str) -> str:
    def pair(row: dict, key: str, fmt: str) -> str:
        chosen, rejected = row[f"chosen_{key}"], row[f"rejected_{key}"]
        return "-" if chosen is None or rejected is None else f"{chosen:{fmt}} / {rejected:{fmt}}"

    lines = [
        f"| speed reward | lambda | pairs | forked (chosen / rejected) | cut (chosen / rejected) "
        f"| theoretical speedup (geomean) | tokens / reference's (mean) | quality ({judge}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for reward, lam, row in rows:
        lines.append(f"| {reward} | {lam} | {row['num_pairs']} | {pair(row, 'num_forked', 'd')} "
                     f"| {pair(row, 'num_cut', 'd')} "
                     f"| {pair(row, 'speedup', '.2f')} | {pair(row, 'length_ratio', '.2f')} "
                     f"| {pair(row, 'quality', '.3f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scores", type=Path, help="a round's scores.jsonl (<output_dir>/round-<N>/scores.jsonl)")
    rewards = [str(reward) for reward in SpeedReward]
    parser.add_argument("--rewards", nargs="+", default=rewards, choices=rewards,
                        help="speed rewards (stage.speed_reward) to pair by")
    parser.add_argument("--lambdas", nargs="+", default=["1", "4", "inf"],
                        help="quality weights (stage.quality_weight): numbers >= 0 or inf")
    parser.add_argument("--length-tolerance", type=float, default=None,
                        help="the rejected side within this fraction of the chosen one's length "
                             "(stage.pair_length_tolerance); default: the worst of all candidates")
    parser.add_argument("--quality-floor", action="store_true",
                        help="no chosen side judged below its prompt's median candidate, no rejected side above the "
                             "chosen (stage.quality_floor=true)")
    parser.add_argument("--chosen-must-end", action="store_true",
                        help="no chosen side its budget cut: a cut answer ranks as a malformed one "
                             "(stage.chosen_must_end=true)")
    sides = [str(side) for side in RejectedSide]
    parser.add_argument("--rejected-side", default=str(RejectedSide.worst), choices=sides,
                        help="what the chosen side is paired against (stage.rejected_side); untagged and both need "
                             "--tokenizer")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a model folder whose tokenizer encodes the untagged sides (e.g. the round's policy)")
    args = parser.parse_args(argv)
    if args.length_tolerance is not None and not args.length_tolerance >= 0:
        parser.error(f"--length-tolerance: {args.length_tolerance} must be >= 0")
    try:
        lambdas = [float(value) for value in args.lambdas]
    except ValueError:
        parser.error(f"--lambdas: {args.lambdas} are not all numbers or inf")
    if any(value < 0 or math.isnan(value) for value in lambdas):
        parser.error(f"--lambdas: {args.lambdas} must be >= 0 or inf")
    rejected_side = RejectedSide(args.rejected_side)
    if rejected_side != RejectedSide.worst and args.tokenizer is None:
        parser.error(f"--rejected-side {rejected_side} needs --tokenizer: a model folder whose tokenizer encodes the "
                     "untagged sides")
    tokenizer = None
    if args.tokenizer is not None:
        tokenizer = load_tokenizer({"name": "tokenizer", "path": str(args.tokenizer)}, path_key="--tokenizer")
        add_tag_tokens(tokenizer)  # a policy's tokenizer has them already; a base model's gets the same ids
    scored = read_scores(args.scores)
    if not any(entry.status == "scored" for entry in scored):
        raise PastaError(f"{args.scores}: no scored prompt to pair")
    rows = [(reward, f"{lam:g}",
             signal(scored, lam, SpeedReward(reward), args.length_tolerance, args.quality_floor,
                    args.chosen_must_end, rejected_side, tokenizer))
            for reward in args.rewards for lam in lambdas]
    judge = next(entry.judge for entry in scored if entry.status == "scored")
    print(f"{args.scores}: {len(scored)} prompts, {sum(len(e.candidates) for e in scored)} candidates")
    pool = samples_mean_length_ratio(scored)
    print("every candidate's tokens / its reference's (mean): " + ("-" if pool is None else f"{pool:.2f}"))
    if args.length_tolerance is not None:
        print(f"rejected sides within {args.length_tolerance:g} of the chosen side's length")
    if args.quality_floor:
        print("chosen sides judged no worse than their prompt's median candidate, rejected sides no better than them")
    if args.chosen_must_end:
        print("chosen sides that ended by themselves: none cut by its budget")
    if rejected_side != RejectedSide.worst:
        print(f"rejected sides: {rejected_side} (stage.rejected_side)")
    print(table(rows, judge))
    return 0


if __name__ == "__main__":
    run_script(main)
