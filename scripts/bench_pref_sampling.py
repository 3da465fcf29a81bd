"""Time one preference round's sampling: the candidates `pasta.training.sampling.sample_and_score` draws.

    python scripts/bench_pref_sampling.py --model-path outputs/cpu/sft/final --out outputs/bench/pref_after.json
    python scripts/bench_pref_sampling.py --override model=tiny --num-prompts 2 --num-samples 2 --max-new-tokens 8  # smoke
    python scripts/bench_pref_sampling.py --model-path $O/sft/final --data $O/annotated.jsonl --max-new-tokens 320 \
        --no-repeat-ngram-size 3 --draft-skeleton --num-prompts 48 --batching both     # the study's round, both ways

The round's sampling, as the stage runs it (its defaults are PrefSettings', and the decoder's settings come from
`pasta.training.sampling.candidate_decode_config`): `--num-prompts` prompts of the data, `--num-samples` candidates
each, temperature sampling, candidate k of prompt i seeded with seed + i * num_samples + k where seed is round 1's
of `pasta.train stage=pref seed=--seed`, decoded with `decode_async` (`--batching`): continuously batched, at most
`--batch-size` prompts' candidates at once and the next joining as one ends (the stage's way), or in static batches
of `--batch-size` prompts, each decoded to its last candidate before the next starts; `both` runs the two in one
process and prints their ratio. Judging and training are left out.

It prints the seconds the sampling took, the steps and tokens, and a digest of the candidates (their token ids and
text), and writes them with every candidate to --out. `--compare other.json` checks that the other run (another
checkout, the same arguments) drew the very same candidates and prints the speed ratio. The script uses only the
decoder's public entry points and the stage's `candidate_decode_config`, so with `--batching static` it runs against
an older checkout too (from 2026-11-27 on): put that checkout's src/ first on PYTHONPATH. Timings on a shared
machine are noisy: run it alone.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from pasta.cli import run_script
from pasta.errors import ArgumentParser, PastaError

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="checkpoint folder (default: the config's model)")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides (the `generate` config)")
    parser.add_argument("--data", default=str(ROOT / "data" / "alpaca_sample.jsonl"),
                        help="JSONL with an `instruction` (and an optional `input`) per line; the first prompts")
    parser.add_argument("--num-prompts", type=int, default=32, help="prompts of the round (stage.prompts_per_round)")
    parser.add_argument("--num-samples", type=int, default=4, help="candidates per prompt (stage.num_samples)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts decoded together (stage.sample_batch_size)")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="longest candidate (stage.max_new_tokens)")
    parser.add_argument("--temperature", type=float, default=1.0, help="stage.temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="stage.top_p")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0, help="stage.no_repeat_ngram_size")
    parser.add_argument("--draft-skeleton", action="store_true", help="stage.draft_skeleton")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (round 1's candidates)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--batching", choices=["static", "continuous", "both"], default="continuous",
                        help="static: batches of --batch-size prompts, one after the other (the stage's way before "
                             "continuous batching, and the only one an older checkout runs); continuous: as many "
                             "candidates at once, the next joining as one ends (the stage's way); both: static, then "
                             "continuous, in one process, and their ratio")
    parser.add_argument("--compare", default=None, help="another run's --out: same candidates? speed ratio")
    parser.add_argument("--out", default="outputs/bench/pref_sampling.json", help="JSON results file")
    return parser.parse_args(argv)


def load_prompts(path: str, num_prompts: int) -> list[tuple[str, str]]:
    from pasta.data import load_instructions

    if not Path(path).is_file():  # the loader would name data.path, which this script has not
        raise PastaError(f"--data={path}: no such file (a .jsonl or .json of prompts)")
    records = load_instructions({"name": "bench", "path": path, "limit": num_prompts})
    return [(record.instruction, record.input) for record in records]


def sample_round(args) -> dict:
    """The round's candidates, drawn as --batching says; with `both`, the static batches and then continuous batching
    in the same process, and the second run's figures beside the first's (`static`)."""
    from pasta.config import compose
    from pasta.decoding import decode_async
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import encode_prompt, load_model
    from pasta.training.config import PrefSettings
    from pasta.training.sampling import candidate_decode_config

    torch.set_num_threads(args.threads)
    overrides = [*args.override] + ([f"model.path={Path(args.model_path).resolve()}"] if args.model_path else [])
    cfg = compose("generate", overrides)
    prompts = load_prompts(args.data, args.num_prompts)  # before the model: a wrong file fails in a second
    model, tokenizer = load_model(cfg.model, device="cpu", path_key="--model-path" if args.model_path else "model.path")
    add_tag_tokens(tokenizer, model)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    # draft_skeleton only when asked, so the script runs against a checkout from before it (--compare)
    drafted = {"draft_skeleton": True} if args.draft_skeleton else {}
    config = candidate_decode_config(PrefSettings(
        num_samples=args.num_samples, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, no_repeat_ngram_size=args.no_repeat_ngram_size, **drafted))
    seed = (args.seed * 1000 + 1) * 1_000_003  # pasta.training.pref.run_round's, round 1
    num = args.num_samples
    prompt_ids = [encode_prompt(tokenizer, instruction, input) for instruction, input in prompts]
    seeds = [seed + index * num + k for index in range(len(prompts)) for k in range(num)]
    repeated = [ids for ids in prompt_ids for _ in range(num)]
    decode_async(model, tokenizer, [prompt_ids[0]], config, policy, seeds=[0])  # warm-up

    def static() -> tuple[float, list]:
        """Batches of --batch-size prompts, each decoded to its last candidate before the next starts."""
        results, decode_s = [], 0.0
        for start in range(0, len(repeated), args.batch_size * num):
            started = time.perf_counter()
            with torch.inference_mode():
                results += decode_async(model, tokenizer, repeated[start : start + args.batch_size * num], config,
                                        policy, seeds=seeds[start : start + args.batch_size * num])
            decode_s += time.perf_counter() - started
            print(f"  static: prompts 1-{len(results) // num}: {decode_s:.1f} s so far", flush=True)
        return decode_s, results

    def continuous() -> tuple[float, list]:
        """--batch-size prompts' candidates at once, the next candidate joining as one ends (the stage's way)."""
        started = time.perf_counter()
        with torch.inference_mode():
            results = decode_async(model, tokenizer, repeated, config, policy, seeds=seeds,
                                   max_batch=args.batch_size * num)
        decode_s = time.perf_counter() - started
        print(f"  continuous: {decode_s:.1f} s", flush=True)
        return decode_s, results

    runs = {"static": static, "continuous": continuous}
    names = ["static", "continuous"] if args.batching == "both" else [args.batching]
    measured = {name: summary(*runs[name](), seeds) for name in names}
    result = measured[names[-1]]
    if len(names) == 2:
        result["static"] = measured["static"]
    return {**result, "args": vars(args), "pasta_source": str(Path(sys.modules["pasta"].__file__).parent)}


def summary(decode_s: float, results: list, seeds: list[int]) -> dict:
    candidates = [{"seed": s, "text": r.text, "token_ids": r.token_ids, "annotated": r.annotated,
                   "num_tokens": r.stats.num_tokens, "num_steps": r.stats.num_steps,
                   "num_draft_kept": r.stats.num_draft_kept, "forked": r.stats.num_threads > 1}
                  for s, r in zip(seeds, results, strict=True)]
    digest = hashlib.sha256(json.dumps([(c["token_ids"], c["annotated"]) for c in candidates]).encode()).hexdigest()
    return {"sampling_s": decode_s, "digest": digest, "num_candidates": len(candidates),
            "num_tokens": sum(c["num_tokens"] for c in candidates), "num_steps": sum(c["num_steps"] for c in candidates),
            "num_draft_kept": sum(c["num_draft_kept"] for c in candidates),
            "num_forked": sum(c["forked"] for c in candidates), "candidates": candidates}


def main(argv=None) -> None:
    from pasta.data import check_output_file, read_json_file

    args = parse_args(argv)
    # What the end of the run reads and writes, checked before its minutes of sampling.
    other = read_json_file(args.compare, "--compare") if args.compare else None
    check_output_file(args.out, "--out")
    result = sample_round(args)
    print(f"sampling: {result['sampling_s']:.1f} s for {result['num_candidates']} candidates "
          f"({result['num_forked']} forked; {result['num_tokens']} tokens in {result['num_steps']} steps, "
          f"{result['num_draft_kept']} of them drafted guesses kept); candidates' digest {result['digest'][:16]} (pasta from "
          f"{result['pasta_source']})")
    if "static" in result:
        static = result["static"]
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(static["candidates"], result["candidates"],
                                                                       strict=True))
        print(f"continuous over static batches, same process: {static['sampling_s'] / result['sampling_s']:.2f}x "
              f"({result['sampling_s']:.1f} s against {static['sampling_s']:.1f} s); candidates "
              + ("identical" if same == result["num_candidates"] else
                 f"DIFFERENT ({same} of {result['num_candidates']} the same; static: {static['num_tokens']} tokens "
                 f"in {static['num_steps']} steps, {static['num_forked']} forked)"))
    if other is not None:
        same = other["digest"] == result["digest"]
        print(f"against {args.compare}: candidates {'identical' if same else 'DIFFERENT'}; this run's sampling "
              f"{other['sampling_s'] / result['sampling_s']:.2f}x as fast ({result['sampling_s']:.1f} s against "
              f"{other['sampling_s']:.1f} s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main)
