"""Benchmark the decoders: sequential against `generate`, asynchronous against sequential, compiled against eager.

    python scripts/bench_decode.py                    # the embedded SmolLM2-135M on CPU, eager: about 10 minutes
    python scripts/bench_decode.py --compile --chunks 2 4 --lengths 64     # and compiled (decode.compile)
    PYTHONPATH=src python scripts/bench_decode.py --device cuda --compile  # Qwen2.5-0.5B, Qwen2.5-7B, Gemma-7B

Models: `embedded` (the default on CPU) is the project's SmolLM2-135M-Instruct, loaded through pasta.models. The
others (the default on CUDA: qwen2.5-0.5b qwen2.5-7b gemma-7b; `tiny` is the smoke test's) are built from their
real configs (written below) with random weights, in bfloat16 on CUDA, and read a small word-level tokenizer made
here: decoding speed does not depend on the weights, and nothing is downloaded. That path imports only torch,
transformers (with its `tokenizers`) and pasta's decoder and language modules (src/pasta/decoding, src/pasta/lang,
pasta.errors, pasta.transformers_api): no hydra, omegaconf, trl, datasets, peft or alpaca-eval, none of which the
GPU machines have, and pasta itself need not be installed (PYTHONPATH=src).

For each model:
(a) The sequential decoder against transformers' `generate` (greedy, same tokens): tokens/s ratio.
(b) Asynchronous decoding of fixed synthetic structures (k chunks of L tokens between a short intro and outro,
    one sync), teacher-forced so that both sides decode the same tokens, against sequential teacher-forced
    decoding of the same plain text (no tags): wall-clock speedup next to the theoretical one (tokens / steps).
    The machine's own bound comes from the same run: the cost model (pasta.decoding.step_costs, measured through
    the decoder's own step: its packing, attention, cache and linears, and its buckets when compiled) prices both
    runs' decode steps, each over the cache it has filled, and bound = sequential's priced time / async's.
    efficiency = measured / bound. Each row ends with both decoders' milliseconds per step by phase (host work,
    forward, choice: pasta/decoding/timing.py), which locate a step that costs more than c(q) prices.
    On CPU c(q) is printed with transformers' F.linear too (pasta/decoding/linears.py says why they differ).
(c) With --compile, (b) and c(q) run compiled too (decode.compile), and each decoder's tokens/s compiled against
    eager: greedy sequential decoding of one prompt, and the async structures. Each compiled workload is warmed
    up first, twice (its compilation: graphs and seconds; on CUDA the recording of its CUDA graphs); every graph
    compiled after the warm-up is a recompilation, and every CUDA graph recorded after it a re-recording (a timed
    run that pays for recordings is not measuring replays).
Every figure is a ratio of interleaved runs inside this process, median over --repeats. Timings on a shared
machine are noisy: compare ratios, not absolute times, and rerun when other jobs are quiet.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from pasta.errors import ArgumentParser

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
INTRO = "Here are a few things that help you sleep well:"
OUTRO = " Together they make a real difference."
STRUCTURE_PROMPT = "Give me some tips for sleeping well."
ESSAY_PROMPT = "Write a detailed essay about the history of bread."

# Real shapes, from each model's config.json; the weights are random.
RANDOM_MODELS = {
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=2048, max_position_embeddings=4096,
                           tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                   max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                   tie_word_embeddings=True, use_sliding_window=False)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                 max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False, use_sliding_window=False)),
    "gemma-7b": ("gemma", dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
                               max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6,
                               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
}
GPU_MODELS = ["qwen2.5-0.5b", "qwen2.5-7b", "gemma-7b"]
MODES = ("eager", "compiled")


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--models", nargs="+", default=None,
                        help=f"embedded, or built from a config with random weights: {', '.join(RANDOM_MODELS)} "
                             f"(default: embedded on CPU, {' '.join(GPU_MODELS)} on CUDA)")
    parser.add_argument("--dtype", default=None, help="random-weight models: float32 / bfloat16 (default: bfloat16 "
                                                      "on CUDA, float32 on CPU)")
    parser.add_argument("--chunks", type=int, nargs="+", default=None,
                        help="chunks per structure (default: 1 2 4 8 on CPU, 2 4 on CUDA)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="tokens per chunk (default: 16 64 128 on CPU, 64 on CUDA)")
    parser.add_argument("--max-parallel-tokens", type=int, default=512,
                        help="skip structures whose chunks hold more tokens than this (keeps the default short)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per figure (median)")
    parser.add_argument("--generate-tokens", type=int, default=96,
                        help="tokens per sequential greedy decode: (a), and (c)'s sequential figure")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--policy", default="scale", help="reservation policy (exact, scale, round_up, fixed)")
    parser.add_argument("--out", default="outputs/bench/bench_decode.json", help="JSON results file")
    parser.add_argument("--skip-generate", action="store_true", help="skip part (a)")
    parser.add_argument("--compile", action="store_true",
                        help="(c): measure the compiled decoders (decode.compile) against the eager ones; compiling "
                             "takes minutes on a CPU")
    parser.add_argument("--compile-mode", default=None,
                        help="decode.compile_mode (default: the decoder's: reduce-overhead on CUDA, default on CPU)")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.models = args.models or (GPU_MODELS if cuda else ["embedded"])
    args.chunks = args.chunks or ([2, 4] if cuda else [1, 2, 4, 8])
    args.lengths = args.lengths or ([64] if cuda else [16, 64, 128])
    for name in args.models:
        if name != "embedded" and name not in RANDOM_MODELS:
            parser.error(f"unknown model {name}: embedded or {', '.join(RANDOM_MODELS)}")
    return args


# --- models ---------------------------------------------------------------------------------------------------------


def word_tokenizer():
    """A word-level tokenizer over the benchmark's own texts (and the numbers up to 999), with PASTA-LANG's tags:
    what the random-weight models read. Nothing to download."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from pasta.lang import add_tag_tokens

    words = sorted(set(re.findall(r"\w+|[^\w\s]", " ".join([FILLER, INTRO, OUTRO, STRUCTURE_PROMPT, ESSAY_PROMPT,
                                                               "point"]))) | {str(n) for n in range(1000)})
    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, **{word: i + 3 for i, word in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>")
    add_tag_tokens(tokenizer)
    return tokenizer


def random_model(name: str, device: str, dtype: torch.dtype, tokenizer):
    """The model `name` of RANDOM_MODELS with seeded random weights, built on `device`."""
    from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig, Qwen2Config

    family, sizes = RANDOM_MODELS[name]
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gemma": GemmaConfig}[family]
    config = config_class(**sizes, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 7B model never sits in CPU memory
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def load(name: str, args):
    """(model, tokenizer, prompt encoder, description) for a model name."""
    if name == "embedded":
        from pasta.config import compose
        from pasta.lang import add_tag_tokens
        from pasta.models import encode_prompt, load_model

        model, tokenizer = load_model(compose("generate").model, device=args.device)
        add_tag_tokens(tokenizer, model)  # 7 more vocabulary rows; both sides of every ratio use the same model
        return model, tokenizer, lambda text: encode_prompt(tokenizer, text), "SmolLM2-135M-Instruct (embedded)"
    from pasta.lang import encode_text

    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    tokenizer = word_tokenizer()
    model = random_model(name, args.device, dtype, tokenizer)
    return model, tokenizer, lambda text: encode_text(tokenizer, text), f"{name} (random weights)"


# --- measuring ------------------------------------------------------------------------------------------------------


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process so far (every frame, dynamo to inductor)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


class CudaGraphRecordings:
    """Counts the CUDA graphs torch.compile records (mode reduce-overhead) while it is installed: torch reports each
    recording to its compilation callbacks."""

    def __init__(self):
        from torch._dynamo.callback import CallbackTrigger, callback_handler

        self.count = 0
        self._trigger = CallbackTrigger.CUDAGRAPH_RECORDING
        callback_handler.register_start_callback(self._seen)

    def _seen(self, args) -> None:
        if args.callback_trigger == self._trigger:
            self.count += 1


class CompileLog:
    """The graphs and seconds torch.compile spent in each warm-up, and the graphs compiled and CUDA graphs recorded
    outside them."""

    def __init__(self):
        self.warmups: dict[str, dict] = {}
        self.recompiles: dict[str, int] = {}
        self.rerecords: dict[str, int] = {}
        self._recordings = CudaGraphRecordings()

    def warm_up(self, name: str, run):
        """`run` twice, compiled: what it compiled, and its last value. The first run compiles; on CUDA the second
        one records the CUDA graphs (a new shape runs once unrecorded first), which are then only replayed."""
        graphs, seconds, start = graphs_compiled(), compile_seconds(), time.perf_counter()
        recordings = self._recordings.count
        run()
        value = run()
        self.warmups[name] = {"graphs": graphs_compiled() - graphs, "compile_s": compile_seconds() - seconds,
                              "cuda_graphs": self._recordings.count - recordings,
                              "warmup_wall_s": time.perf_counter() - start}
        return value

    def timed(self, name: str, run):
        """`run` after its warm-up: a graph compiled now is a recompilation, a CUDA graph recorded a re-recording."""
        graphs, recordings = graphs_compiled(), self._recordings.count
        value = run()
        self.recompiles[name] = self.recompiles.get(name, 0) + graphs_compiled() - graphs
        self.rerecords[name] = self.rerecords.get(name, 0) + self._recordings.count - recordings
        return value


def decode_config(mode: str, args, **limits):
    from pasta.decoding import DecodeConfig

    return DecodeConfig(**limits, compile=mode == "compiled", compile_mode=args.compile_mode)


def bench_generate(model, tokenizer, prompt_ids, num_tokens, repeats):
    """(a) tokens/s of decode_sequential over generate's, greedy, the same tokens."""
    from pasta.decoding import DecodeConfig, decode_sequential
    from pasta.measure import median_ratio, ratio_of_fastest

    input_ids = torch.tensor([prompt_ids], device=model.device)
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


def step_costs(model, row_counts, repeats, *, compiled=False, compile_mode=None, multirow=True):
    """The cost model at these row counts (one request, 240 cached slots: the structures' prompt and intro), through
    the decoder's own step: compiled, with its buckets, or eager with the exact sizes; the decoder's linears, or
    transformers' F.linear without `multirow`."""
    from pasta.decoding.step import StepForward
    from pasta.decoding.step_costs import measure_step_costs

    return measure_step_costs(model, rows=row_counts, requests=(1,), cache_len=240, repeats=repeats,
                              forward=StepForward(model, compile=compiled, mode=compile_mode), multirow=multirow)


def costs_ms(costs) -> dict[int, float]:
    return {q: round(1000 * c, 1) for q, c in zip(costs.rows, costs.seconds, strict=True)}


def build_structure(tokenizer, num_chunks, chunk_len, filler_ids):
    """A TokenDoc: intro, k promises, a sync, an outro, eos; chunk k holds chunk_len filler tokens."""
    from pasta.lang import TagIds, TokenChunk, TokenDoc, encode_text

    tags = TagIds.from_tokenizer(tokenizer)
    intro = encode_text(tokenizer, INTRO)
    outro = encode_text(tokenizer, OUTRO)
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
    """How many tokens the async decoder feeds at each step of this structure (the interpreter, no model): the row
    counts the cost model is measured at before the run."""
    from pasta.decoding import DecodeConfig
    from pasta.decoding.interpreter import Interpreter
    from pasta.decoding.text import text_decoder

    config = DecodeConfig(max_new_tokens=len(doc.main_ids), max_total_tokens=doc.num_tokens,
                          max_threads=max(1, len(doc.chunks)),
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


def bench_structures(model, tokenizer, encode, args, policy, mode, compile_log, save):
    """(b) async vs sequential wall clock on teacher-forced structures, with the machine's bound, in `mode`."""
    from pasta.decoding import decode_sequential, teacher_forced_logprobs
    from pasta.decoding.packing import bucket_rows
    from pasta.lang import encode_text
    from pasta.measure import median_ratio, ratio_of_fastest, timed_call

    compiled = mode == "compiled"
    prompt_ids = encode(STRUCTURE_PROMPT)
    filler_ids = encode_text(tokenizer, FILLER * 3)
    shapes = [(k, n) for k in args.chunks for n in args.lengths if k * n <= args.max_parallel_tokens]
    structures = {shape: build_structure(tokenizer, *shape, filler_ids) for shape in shapes}
    steps = {shape: rows_per_step(tokenizer, prompt_ids, doc, policy) for shape, (doc, _) in structures.items()}
    row_counts = sorted({1, *(q for sizes in steps.values() for q in sizes[1:])})
    repeats = 3 * args.repeats + 2
    if compiled:  # the warm-up round compiles what the decode steps below reuse
        costs = compile_log.warm_up("c(q)", lambda: step_costs(model, row_counts, repeats, compiled=True,
                                                               compile_mode=args.compile_mode))
    else:
        costs = step_costs(model, row_counts, repeats)
    print(f"c(q) ms, {mode}, decoder's linears:", costs_ms(costs), file=sys.stderr, flush=True)
    measured = {"step_costs": costs.to_dict()}
    if model.device.type == "cpu" and not compiled:
        plain_costs = step_costs(model, row_counts, repeats, multirow=False)
        print("c(q) ms, eager, F.linear:         ", costs_ms(plain_costs), file=sys.stderr, flush=True)
        measured["step_costs_plain_linears"] = plain_costs.to_dict()

    rows = []
    for shape, (doc, plain) in structures.items():
        last_stats = {}

        def run_async(doc=doc, last_stats=last_stats):
            seconds, (_, stats) = timed_call(model.device, lambda: teacher_forced_logprobs(
                model, tokenizer, prompt_ids, doc, policy, compile=compiled, compile_mode=args.compile_mode))
            last_stats["async"] = stats
            return seconds

        def run_sequential(plain=plain, last_stats=last_stats):
            config = decode_config(mode, args, max_new_tokens=len(plain))
            seconds, results = timed_call(model.device, lambda: decode_sequential(
                model, tokenizer, [prompt_ids], config, forced_ids=[plain]))
            last_stats["sequential"] = results[0].stats
            return seconds

        if compiled:
            name = f"async {shape[0]}x{shape[1]}"
            compile_log.warm_up(name, lambda run_async=run_async, run_sequential=run_sequential: (
                run_async(), run_sequential()))
            ratio, sequential_s, async_s = compile_log.timed(
                name, lambda run_async=run_async, run_sequential=run_sequential: median_ratio(
                    run_sequential, run_async, args.repeats))
        else:
            run_async(), run_sequential()  # warm-up
            ratio, sequential_s, async_s = median_ratio(run_sequential, run_async, args.repeats)
        stats = last_stats["async"]
        sizes = stats.step_rows  # the rows_per_step counted before the run, as the run fed them
        # Prefill on both sides is the same forward; the bound compares the decode steps.
        sequential_rows = [len(prompt_ids)] + [1] * (len(plain) - 1)
        bound = costs.answer_seconds(sequential_rows, prefill=False) / costs.answer_seconds(sizes, prefill=False)
        row = {
            "mode": mode, "chunks": shape[0], "chunk_tokens": shape[1],
            "async_tokens": stats.num_tokens, "async_steps": stats.num_steps, "sequential_tokens": len(plain),
            "max_rows": max(sizes[1:]), "max_bucketed_rows": max(bucket_rows(q) for q in sizes[1:]),
            "theoretical_speedup": stats.theoretical_speedup,
            "step_ratio": len(plain) / stats.num_steps,
            "wall_speedup": ratio,
            "wall_over_theoretical": ratio / stats.theoretical_speedup,
            "wall_speedup_fastest_runs": ratio_of_fastest(sequential_s, async_s),
            "machine_bound": bound,
            "bound_over_theoretical": bound / stats.theoretical_speedup,
            "efficiency": ratio / bound,
            "bookkeeping_share": stats.bookkeeping_s / stats.wall_s,
            # Where a step's time goes, per decoder (the last timed run; every step, its prefill included).
            "ms_per_step": {side: phase_ms(last_stats[side]) for side in ("async", "sequential")},
            "sequential_s": sequential_s, "async_s": async_s,
        }
        rows.append(row)
        print(format_row(row), file=sys.stderr, flush=True)
        save({f"structures_{mode}": rows, f"forward_costs_{mode}": measured})
    return rows, measured


def bench_compiled_sequential(model, tokenizer, prompt_ids, args, compile_log):
    """(c) greedy sequential decoding of one prompt, compiled against eager: tokens/s and the same tokens."""
    from pasta.decoding import decode_sequential
    from pasta.measure import median_ratio, ratio_of_fastest

    produced = {}

    def run(mode):
        config = decode_config(mode, args, max_new_tokens=args.generate_tokens)
        result = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
        produced[mode] = result.token_ids
        return result.stats.wall_s

    run("eager")  # warm-up
    compile_log.warm_up("sequential", lambda: run("compiled"))
    ratio, eager_s, compiled_s = compile_log.timed(
        "sequential", lambda: median_ratio(lambda: run("eager"), lambda: run("compiled"), args.repeats))
    num = len(produced["eager"])
    return {
        "tokens": num,
        "same_tokens": produced["eager"] == produced["compiled"],
        "eager_tokens_per_s": num / statistics.median(eager_s),
        "compiled_tokens_per_s": num / statistics.median(compiled_s),
        "compiled_over_eager": ratio,  # tokens/s ratio = eager time / compiled time
        "compiled_over_eager_fastest_runs": ratio_of_fastest(eager_s, compiled_s),
        "eager_s": eager_s, "compiled_s": compiled_s,
    }


def compiled_over_eager_async(structures):
    """Per structure, async tokens/s compiled over eager (median times); and their geometric mean."""
    from pasta.measure import geometric_mean

    eager = {(r["chunks"], r["chunk_tokens"]): r for r in structures["eager"]}
    ratios = {}
    for row in structures["compiled"]:
        shape = (row["chunks"], row["chunk_tokens"])
        ratios[f"{shape[0]}x{shape[1]}"] = statistics.median(eager[shape]["async_s"]) / statistics.median(
            row["async_s"])
    return ratios, geometric_mean(list(ratios.values()))


HEADER = ("mode      chunks  len  tokens  steps  theor.  wall  (fastest)  wall/theor  bound  bound/theor  "
          "efficiency  bookkeeping  ms/step host+forward+choose: async | sequential")


def phase_ms(stats) -> dict[str, float]:
    """A decode's milliseconds per step in each phase (pasta/decoding/timing.py): host work, forward, choice."""
    steps = max(stats.num_steps, 1)
    return {"host": 1000 * stats.bookkeeping_s / steps, "forward": 1000 * stats.forward_s / steps,
            "choose": 1000 * stats.choose_s / steps}


def format_row(row):
    return (f"{row['mode']:<9} {row['chunks']:>6} {row['chunk_tokens']:>4} {row['async_tokens']:>7} "
            f"{row['async_steps']:>6} {row['theoretical_speedup']:>6.2f} {row['wall_speedup']:>5.2f} "
            f"{row['wall_speedup_fastest_runs']:>10.2f} {row['wall_over_theoretical']:>11.2f} "
            f"{row['machine_bound']:>6.2f} {row['bound_over_theoretical']:>11.2f} {row['efficiency']:>11.2f} "
            f"{row['bookkeeping_share']:>11.1%}  "
            + " | ".join("+".join(f"{ms:.1f}" for ms in row["ms_per_step"][side].values())
                         for side in ("async", "sequential")))


# --- one model, and the run ---------------------------------------------------------------------------------------


def bench_model(name, args, policy, save):
    """Every part for one model; prints its summary (stdout) and returns its results."""
    model, tokenizer, encode, description = load(name, args)
    result = {"model": description, "dtype": str(model.dtype).removeprefix("torch."),
              "attention": model.config._attn_implementation, "policy": args.policy}

    def save_model(partial):
        result.update(partial)
        save(name, result)

    modes = MODES if args.compile else MODES[:1]
    compile_log = CompileLog()
    if not args.skip_generate:
        g = bench_generate(model, tokenizer, encode(ESSAY_PROMPT), args.generate_tokens, args.repeats + 2)
        save_model({"generate": g})
        print(f"(a) sequential {g['sequential_tokens_per_s']:.1f} tok/s, generate {g['generate_tokens_per_s']:.1f} "
              f"tok/s, ratio {g['ratio_sequential_over_generate']:.3f}, same tokens: {g['same_tokens']}",
              file=sys.stderr, flush=True)
    print(HEADER, file=sys.stderr, flush=True)
    structures, costs = {}, {}
    for mode in modes:
        structures[mode], costs[mode] = bench_structures(model, tokenizer, encode, args, policy, mode, compile_log,
                                                         save_model)
    if args.compile:
        sequential = bench_compiled_sequential(model, tokenizer, encode(ESSAY_PROMPT), args, compile_log)
        per_structure, async_ratio = compiled_over_eager_async(structures)
        save_model({"compiled_sequential": sequential, "compiled_over_eager_async": per_structure,
                    "compiled_over_eager_async_geomean": async_ratio,
                    "compilation": compile_log.warmups, "recompilations_after_warmup": compile_log.recompiles,
                    "cuda_graphs_recorded_after_warmup": compile_log.rerecords})
    print_summary(result, structures, costs, compile_log if args.compile else None, args.repeats)
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def print_summary(result, structures, costs, compile_log, repeats):
    print(f"\n== {result['model']}, {result['dtype']}, policy {result['policy']} ==")
    if "generate" in result:
        g = result["generate"]
        print(f"(a) sequential / generate tokens/s: {g['ratio_sequential_over_generate']:.3f} (fastest runs "
              f"{g['ratio_of_fastest_runs']:.3f}; {g['sequential_tokens_per_s']:.1f} vs "
              f"{g['generate_tokens_per_s']:.1f} tok/s, {g['tokens']} tokens, same tokens: {g['same_tokens']})")
    from pasta.decoding.cost_model import StepCosts

    for mode, measured in costs.items():
        print(f"c(q) ms, {mode}:", costs_ms(StepCosts.from_dict(measured["step_costs"])))
        if "step_costs_plain_linears" in measured:
            print("c(q) ms, eager with F.linear:", costs_ms(StepCosts.from_dict(measured["step_costs_plain_linears"])))
    print("(b) async vs sequential, teacher-forced, median of", repeats)
    print(HEADER)
    for rows in structures.values():
        for row in rows:
            print(format_row(row))
    if compile_log is None:
        return
    s = result["compiled_sequential"]
    print(f"(c) sequential: eager {s['eager_tokens_per_s']:.1f} tok/s, compiled {s['compiled_tokens_per_s']:.1f} "
          f"tok/s (fastest runs {s['compiled_over_eager_fastest_runs']:.2f}x), {s['tokens']} greedy tokens, "
          f"same tokens: {s['same_tokens']}")
    for shape, ratio in result["compiled_over_eager_async"].items():
        print(f"(c) async {shape}: compiled over eager {ratio:.2f}x")
    for name, warmup in compile_log.warmups.items():
        print(f"compile, {name}: {warmup['graphs']} graphs, {warmup['compile_s']:.1f} s compiling, "
              f"{warmup['cuda_graphs']} CUDA graphs recorded ({warmup['warmup_wall_s']:.1f} s warm-up)")
    for what, counts in (("recompilations", compile_log.recompiles),
                         ("CUDA graphs recorded", compile_log.rerecords)):
        total = sum(counts.values())
        print(f"{what} after warm-up: {total}" + ("" if not total else f" ({counts})"))
    print(f"sequential compiled over eager: {s['compiled_over_eager']:.2f}x")
    print(f"async compiled over eager: {result['compiled_over_eager_async_geomean']:.2f}x")


def machine(device: str) -> str:
    if not device.startswith("cuda"):
        return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    return (f"{torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}, "
            f"torch {torch.__version__}")


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import transformers

    from pasta.errors import PastaError
    from pasta.lang import ReservationPolicy

    results = {
        "machine": machine(args.device),
        "transformers": transformers.__version__,
        "load_average": os.getloadavg(),
        "compiled": args.compile,
        "models": {},
    }
    out = Path(args.out)
    if out.is_dir():  # found before the first model is measured, not when its results are written
        print(f"error: --out={out} is a folder, not a file", file=sys.stderr)
        sys.exit(2)
    print(results["machine"], file=sys.stderr, flush=True)

    def save(name, model_results):
        """Rewrite the results file (atomically) with everything measured so far."""
        results["models"][name] = model_results
        results["load_average_after"] = os.getloadavg()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(results, indent=2))
        os.replace(tmp, out)

    try:
        for name in args.models:
            bench_model(name, args, ReservationPolicy(args.policy), save)
    except PastaError as exc:  # decode.compile that cannot compile: the benchmark stops, it never falls back
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # the results file cannot be written (a read-only place, a full disk)
        print(f"error: {exc.filename or out}: {exc.strerror}", file=sys.stderr)
        sys.exit(2)
    print(f"\n{results['machine']}; wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
