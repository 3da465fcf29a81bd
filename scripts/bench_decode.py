"""Benchmark the decoders on the embedded SmolLM2-135M (a measurement, not a test).

    python scripts/bench_decode.py                          # the default run: about 10 minutes on 2 CPU cores
    python scripts/bench_decode.py --chunks 2 4 --lengths 64 --repeats 5 --out outputs/bench/decode.json

(a) The sequential decoder against transformers' `generate` (greedy, same tokens): tokens/s ratio.
(b) Asynchronous decoding of fixed synthetic structures (k chunks of L tokens between a short intro and outro,
    one sync), teacher-forced so that both sides decode the same tokens, against sequential teacher-forced
    decoding of the same plain text (no tags): wall-clock speedup next to the theoretical one (tokens / steps).
    The machine's own bound comes from the same run: the cost c(q) of one forward that appends q tokens to a
    256-token cache (transformers' model and DynamicCache, with the decoder's attention and linears), and
    bound = n_sequential * c(1) / sum over the async run's steps of c(rows fed that step). efficiency =
    measured / bound says how much of what this CPU allows the decoder delivers (the decoder's own overhead,
    bookkeeping included, is what it loses). c(q) is printed twice, with the decoder's multi-row linears and
    with transformers' F.linear (pasta/decoding/linears.py says why they differ on CPU).
Every figure is a ratio of interleaved runs inside this process, median over --repeats. Timings on a shared
machine are noisy: compare ratios, not absolute times, and rerun when other jobs are quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

FILLER = (
    "Sleep is one of the most important parts of a healthy life. Adults need seven to nine hours each night, "
    "and a regular schedule helps the body know when to rest. Light from screens in the evening delays the "
    "release of melatonin, so it is wise to put phones away an hour before bed. A cool, dark and quiet room "
    "makes it easier to fall asleep and to stay asleep. Caffeine stays in the blood for many hours, which is "
    "why coffee after lunch can keep you awake at night. Exercise during the day improves sleep quality, but "
    "hard training late in the evening can have the opposite effect. Heavy meals and alcohol before bed also "
    "disturb sleep, even when they seem to make you drowsy at first. If worries keep you awake, writing them "
    "down in a notebook can help to clear the mind. Short naps are fine, but long naps late in the afternoon "
    "make it harder to sleep at night. Finally, if sleep problems last for weeks, it is worth talking to a "
    "doctor, because conditions such as sleep apnea are common and can be treated. "
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8], help="chunks per structure")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 128], help="tokens per chunk")
    parser.add_argument("--max-parallel-tokens", type=int, default=512,
                        help="skip structures whose chunks hold more tokens than this (keeps the default short)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per figure (median)")
    parser.add_argument("--generate-tokens", type=int, default=96, help="(a): tokens per sequential decode")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--policy", default="scale", help="reservation policy (exact, scale, round_up, fixed)")
    parser.add_argument("--out", default="outputs/bench/bench_decode.json", help="JSON results file")
    parser.add_argument("--skip-generate", action="store_true", help="skip part (a)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile(model.forward, dynamic=True) first (both sides; minutes on CPU)")
    return parser.parse_args(argv)


def median_ratio(run_a, run_b, repeats):
    """Median of run_a() / run_b() over interleaved repeats (each returns seconds), plus the raw times.

    The ratio of the fastest runs is reported beside it: on a shared machine the fastest run of each side is the
    one least disturbed by other processes."""
    times_a, times_b = [], []
    for _ in range(repeats):
        times_a.append(run_a())
        times_b.append(run_b())
    ratios = [a / b for a, b in zip(times_a, times_b, strict=True)]
    return statistics.median(ratios), times_a, times_b


def ratio_of_fastest(times_a, times_b):
    return min(times_a) / min(times_b)


def bench_generate(model, tokenizer, num_tokens, repeats):
    """(a) tokens/s of decode_sequential over generate's, greedy, the same tokens."""
    from pasta.decoding import DecodeConfig, decode_sequential
    from pasta.models import encode_prompt

    prompt_ids = encode_prompt(tokenizer, "Write a detailed essay about the history of bread.")
    input_ids = torch.tensor([prompt_ids])
    config = DecodeConfig(max_new_tokens=num_tokens)
    produced = {}

    def run_generate():
        start = time.perf_counter()
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=num_tokens,
                             do_sample=False)
        seconds = time.perf_counter() - start
        produced["generate"] = out[0, len(prompt_ids):].tolist()
        return seconds

    def run_sequential():
        result = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
        produced["sequential"] = result.token_ids
        return result.stats.wall_s

    run_generate(), run_sequential()  # warm-up
    ratio, generate_s, sequential_s = median_ratio(run_generate, run_sequential, repeats)
    num = len(produced["sequential"])
    return {
        "tokens": num,
        "same_tokens": produced["generate"] == produced["sequential"],
        "generate_tokens_per_s": num / statistics.median(generate_s),
        "sequential_tokens_per_s": num / statistics.median(sequential_s),
        "ratio_sequential_over_generate": ratio,  # tokens/s ratio = generate time / sequential time
        "ratio_of_fastest_runs": ratio_of_fastest(generate_s, sequential_s),
        "generate_s": generate_s,
        "sequential_s": sequential_s,
    }


def forward_costs(model, max_rows, repeats, prefix_len=256, multirow=True):
    """c(q): seconds of one forward appending q tokens to a prefix_len-token DynamicCache, q = 1..max_rows, with
    the attention the decoder uses and its linears (`multirow`) or transformers' own F.linear; the fastest of
    `repeats` (the least disturbed by other processes)."""
    from transformers import DynamicCache

    from pasta.decoding.attention import grouped_query_sdpa
    from pasta.decoding.linears import multirow_linears

    costs = {}
    with torch.inference_mode(), grouped_query_sdpa(model), multirow_linears(model, enabled=multirow):
        cache = DynamicCache()
        model(input_ids=torch.randint(100, 1000, (1, prefix_len)), past_key_values=cache, use_cache=True)
        for rows in range(1, max_rows + 1):
            mask = torch.zeros(1, 1, rows, prefix_len + rows)
            mask[0, 0, :, prefix_len:] = torch.triu(torch.full((rows, rows), torch.finfo(torch.float32).min), 1)
            positions = torch.arange(prefix_len, prefix_len + rows)[None]
            samples = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                model(input_ids=torch.randint(100, 1000, (1, rows)), attention_mask=mask, position_ids=positions,
                      past_key_values=cache, use_cache=True, logits_to_keep=rows)
                samples.append(time.perf_counter() - start)
                cache.crop(-rows)
            costs[rows] = min(samples[1:])
    return costs


def build_structure(tokenizer, num_chunks, chunk_len, filler_ids):
    """A TokenDoc: intro, k promises, a sync, an outro, eos; chunk k holds chunk_len filler tokens."""
    from pasta.lang import TagIds, TokenChunk, TokenDoc, encode_text

    tags = TagIds.from_tokenizer(tokenizer)
    intro = encode_text(tokenizer, "Here are a few things that help you sleep well:")
    outro = encode_text(tokenizer, " Together they make a real difference.")
    main_ids, chunks = list(intro), []
    for k in range(num_chunks):
        topic_ids = encode_text(tokenizer, f" point {k + 1}")
        main_ids += [tags.promise, *topic_ids, tags.promise_tokens, *encode_text(tokenizer, str(chunk_len)),
                     tags.promise_end]
        content = filler_ids[(k * chunk_len) % 400 :][:chunk_len]
        chunks.append(TokenChunk([tags.async_start, *topic_ids, tags.async_body], [*content, tags.async_end],
                                 chunk_len))
    main_ids += [tags.sync, *outro, tokenizer.eos_token_id]
    plain = [*intro, *(i for c in chunks for i in c.body_ids[:-1]), *outro, tokenizer.eos_token_id]
    return TokenDoc(main_ids, chunks, tags), plain


def rows_per_step(tokenizer, prompt_ids, doc, policy):
    """How many tokens the async decoder feeds at each step of this structure (the interpreter, no model)."""
    from pasta.decoding import DecodeConfig
    from pasta.decoding.interpreter import Interpreter
    from pasta.decoding.text import text_decoder

    config = DecodeConfig(max_new_tokens=len(doc.main_ids), max_threads=max(1, len(doc.chunks)),
                          max_chunk_tokens=max([len(c.body_ids) for c in doc.chunks] + [1]))
    interpreter = Interpreter(prompt_ids, tag_ids=doc.tag_ids, eos_ids={tokenizer.eos_token_id}, policy=policy,
                              config=config, decode=text_decoder(tokenizer), capacity=64)
    scripts = {0: list(doc.main_ids), **{k + 1: list(c.body_ids) for k, c in enumerate(doc.chunks)}}
    sizes = []
    while not interpreter.done:
        plan = interpreter.plan()
        sizes.append(len(plan.token_ids))
        interpreter.commit(plan, [scripts[t].pop(0) for t in plan.sample_threads])
    return sizes


def bench_structures(model, tokenizer, args, policy, save):
    """(b) async vs sequential wall clock on teacher-forced structures, with the machine's bound."""
    from pasta.decoding import DecodeConfig, decode_sequential, teacher_forced_logprobs
    from pasta.lang import encode_text
    from pasta.models import encode_prompt

    prompt_ids = encode_prompt(tokenizer, "Give me some tips for sleeping well.")
    filler_ids = encode_text(tokenizer, FILLER * 3)
    shapes = [(k, n) for k in args.chunks for n in args.lengths if k * n <= args.max_parallel_tokens]
    structures = {shape: build_structure(tokenizer, *shape, filler_ids) for shape in shapes}
    steps = {shape: rows_per_step(tokenizer, prompt_ids, doc, policy) for shape, (doc, _) in structures.items()}
    max_rows = max(max(sizes[1:]) for sizes in steps.values())
    costs = forward_costs(model, max_rows, 3 * args.repeats + 2)
    plain_costs = forward_costs(model, max_rows, 3 * args.repeats + 2, multirow=False)
    print("c(q) ms, decoder's linears:", {q: round(1000 * c, 1) for q, c in costs.items()}, file=sys.stderr)
    print("c(q) ms, F.linear:         ", {q: round(1000 * c, 1) for q, c in plain_costs.items()}, file=sys.stderr,
          flush=True)
    measured = {"forward_cost_s": costs, "forward_cost_plain_linears_s": plain_costs}

    rows = []
    for shape, (doc, plain) in structures.items():
        last_stats = {}

        def run_async(doc=doc, last_stats=last_stats):
            _, stats = teacher_forced_logprobs(model, tokenizer, prompt_ids, doc, policy)
            last_stats["async"] = stats
            return stats.wall_s

        def run_sequential(plain=plain):
            result = decode_sequential(model, tokenizer, [prompt_ids], DecodeConfig(max_new_tokens=len(plain)),
                                       forced_ids=[plain])[0]
            return result.stats.wall_s

        run_async(), run_sequential()  # warm-up
        ratio, sequential_s, async_s = median_ratio(run_sequential, run_async, args.repeats)
        stats = last_stats["async"]
        sizes = steps[shape]
        # Prefill on both sides is the same forward; the bound compares the decode steps.
        bound = (len(plain) - 1) * costs[1] / sum(costs[q] for q in sizes[1:])
        row = {
            "chunks": shape[0], "chunk_tokens": shape[1],
            "async_tokens": stats.num_tokens, "async_steps": stats.num_steps, "sequential_tokens": len(plain),
            "theoretical_speedup": stats.theoretical_speedup,
            "step_ratio": len(plain) / stats.num_steps,
            "wall_speedup": ratio,
            "wall_over_theoretical": ratio / stats.theoretical_speedup,
            "wall_speedup_fastest_runs": ratio_of_fastest(sequential_s, async_s),
            "machine_bound": bound,
            "bound_over_theoretical": bound / stats.theoretical_speedup,
            "efficiency": ratio / bound,
            "bookkeeping_share": stats.bookkeeping_s / stats.wall_s,
            "sequential_s": sequential_s, "async_s": async_s,
        }
        rows.append(row)
        print(format_row(row), file=sys.stderr, flush=True)
        save({**measured, "structures": rows})
    return {**measured, "structures": rows}


HEADER = ("chunks  len  tokens  steps  theor.  wall  (fastest)  wall/theor  bound  bound/theor  efficiency  "
          "bookkeeping")


def format_row(row):
    return (f"{row['chunks']:>6} {row['chunk_tokens']:>4} {row['async_tokens']:>7} {row['async_steps']:>6} "
            f"{row['theoretical_speedup']:>6.2f} {row['wall_speedup']:>5.2f} {row['wall_speedup_fastest_runs']:>10.2f} "
            f"{row['wall_over_theoretical']:>11.2f} "
            f"{row['machine_bound']:>6.2f} {row['bound_over_theoretical']:>11.2f} {row['efficiency']:>11.2f} "
            f"{row['bookkeeping_share']:>11.1%}")


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    from pasta.config import compose
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import load_model

    model, tokenizer = load_model(compose("generate").model, device="cpu")
    add_tag_tokens(tokenizer, model)  # 7 more vocabulary rows; both sides of every ratio use the same model
    if args.compile:
        model.forward = torch.compile(model.forward, dynamic=True)
    results = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "load_average": os.getloadavg(),
        "model": "SmolLM2-135M-Instruct (embedded), float32, sdpa",
        "policy": args.policy,
        "compiled": args.compile,
    }
    if not args.skip_generate:
        results["generate"] = bench_generate(model, tokenizer, args.generate_tokens, args.repeats + 2)
        g = results["generate"]
        print(f"(a) sequential {g['sequential_tokens_per_s']:.1f} tok/s, generate {g['generate_tokens_per_s']:.1f} "
              f"tok/s, ratio {g['ratio_sequential_over_generate']:.3f}, same tokens: {g['same_tokens']}",
              file=sys.stderr, flush=True)
    print(HEADER, file=sys.stderr, flush=True)
    out = Path(args.out)

    def save(partial):
        """Rewrite the results file (atomically) with everything measured so far."""
        results.update(partial, load_average_after=os.getloadavg())
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(results, indent=2))
        os.replace(tmp, out)

    save(bench_structures(model, tokenizer, args, ReservationPolicy(args.policy), save))
    print(f"\nwrote {out}", file=sys.stderr)
    if "generate" in results:
        g = results["generate"]
        print(f"(a) sequential / generate tokens/s: {g['ratio_sequential_over_generate']:.3f} (fastest runs "
              f"{g['ratio_of_fastest_runs']:.3f}; {g['sequential_tokens_per_s']:.1f} vs "
              f"{g['generate_tokens_per_s']:.1f} tok/s, {g['tokens']} tokens)")
    print("(b) async vs sequential, teacher-forced, median of", args.repeats)
    print(HEADER)
    for row in results["structures"]:
        print(format_row(row))


if __name__ == "__main__":
    main()
