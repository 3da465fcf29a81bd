"""Benchmark serving: asynchronous (PASTA-LANG) against sequential decoding behind `python -m pasta.serve`.

    python scripts/bench_serve.py --model-path outputs/cpu/sft/final \\
        --prompts ../shared/data/alpaca_eval.jsonl --num-prompts 32 --concurrency 1 4 16
    python scripts/bench_serve.py --override model=tiny --num-prompts 3 --concurrency 1 2 --max-tokens 16   # smoke

Two servers are started from the same checkpoint as their own processes (decode=async and decode=sequential,
each on --threads torch threads), and this process drives them over 127.0.0.1 with the `openai` client: at each
concurrency level the same seeded subset of prompts (chat, greedy, streamed, max_tokens each) goes to one server
then the other, interleaved, so both see the same machine. Per mode and concurrency it prints the median and p95
of the request latency and of the time to first token, the median latency per output token, output tokens/s and
requests/s over the level's wall time, the mean theoretical speedup (tokens per forward step, from each answer's
`pasta` stats) and the failed requests; then the ratios: async over sequential at each level (latency, tokens/s)
and each mode's tokens/s at the highest level over the lowest. At concurrency 1 the same prompts are also decoded
in this process, with the library's decoders (`decode_async`, `decode_sequential`; greedy, so the very answers the
servers gave), while both servers idle: the served async-over-sequential latency speedup divided by the direct one
is the server's cost to the speedup (1.00 = none; the issue's target is within 10%). Output tokens are
`usage.completion_tokens` (every thread's). The two modes write different answers (sequential decoding writes the tags as plain tokens), so
compare per-token latency and tokens/s as well as request latency. Timings on a shared machine are noisy: run it
alone. Results also go to --out as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
MODES = ("async", "sequential")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="checkpoint folder (default: the config's model)")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for both servers")
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared" / "data" / "alpaca_eval.jsonl"),
                        help="JSONL with an `instruction` field per line (and an optional `input`)")
    parser.add_argument("--num-prompts", type=int, default=32, help="seeded random subset of the prompts file")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every request")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of each server")
    parser.add_argument("--startup-timeout", type=float, default=600, help="seconds to wait for a server")
    parser.add_argument("--no-direct", action="store_true",
                        help="skip decoding the prompts in this process (the server-overhead reference)")
    parser.add_argument("--out", default="outputs/bench/bench_serve.json", help="JSON results file")
    return parser.parse_args(argv)


def load_prompts(path: str, num_prompts: int, seed: int) -> list[str]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows or any("instruction" not in r for r in rows):
        sys.exit(f"error: {path} needs an `instruction` field on every line")
    rows = random.Random(seed).sample(rows, min(num_prompts, len(rows)))
    return [f"{r['instruction']}\n\n{r['input']}" if r.get("input") else r["instruction"] for r in rows]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`python -m pasta.serve` in a child process on a free 127.0.0.1 port."""

    def __init__(self, mode: str, args, run_dir: Path):
        self.mode = mode
        self.port = free_port()
        overrides = [f"decode={mode}", "host=127.0.0.1", f"port={self.port}", f"num_threads={args.threads}",
                     "log_level=warning", f"hydra.run.dir={run_dir / mode}", f"limits.max_tokens={args.max_tokens}",
                     f"limits.max_running_requests={max(args.concurrency)}", *args.override]
        if args.model_path:
            overrides.append(f"model.path={Path(args.model_path).resolve()}")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.log = open(run_dir / f"{mode}.log", "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen([sys.executable, "-m", "pasta.serve", *overrides], env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=1800)

    async def wait_ready(self, timeout_s: float) -> str:
        """The served model name, once the server answers."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                sys.exit(f"error: the {self.mode} server exited; see {self.log.name}")
            try:
                return (await self.client.models.list()).data[0].id
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    sys.exit(f"error: the {self.mode} server did not start in {timeout_s:.0f} s")
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@dataclass
class Answer:
    latency_s: float
    ttft_s: float
    num_tokens: int
    theoretical_speedup: float
    ok: bool


async def ask(server: Server, model: str, prompt: str, max_tokens: int) -> Answer:
    started = time.perf_counter()
    first = None
    usage, pasta = None, {}
    try:
        stream = await server.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=max_tokens,
            stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter()
            if chunk.choices and chunk.choices[0].finish_reason:
                pasta = getattr(chunk.choices[0], "pasta", None) or {}
            if chunk.usage:
                usage = chunk.usage
    except openai.APIError as exc:
        print(f"  {server.mode}: request failed: {exc}", file=sys.stderr)
        return Answer(time.perf_counter() - started, 0.0, 0, 1.0, False)
    ended = time.perf_counter()
    return Answer(ended - started, (first or ended) - started, usage.completion_tokens if usage else 0,
                  pasta.get("theoretical_speedup", 1.0), usage is not None)


async def run_level(server: Server, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> Answer:
        async with gate:
            return await ask(server, model, prompt, max_tokens)

    started = time.perf_counter()
    answers = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - started
    ok = [a for a in answers if a.ok]
    latencies = sorted(a.latency_s for a in ok) or [0.0]
    ttfts = sorted(a.ttft_s for a in ok) or [0.0]
    num_tokens = sum(a.num_tokens for a in ok)
    return {
        "mode": server.mode, "concurrency": concurrency, "num_requests": len(answers),
        "num_failed": len(answers) - len(ok), "wall_s": wall,
        "latency_median_s": statistics.median(latencies), "latency_p95_s": percentile(latencies, 95),
        "ttft_median_s": statistics.median(ttfts), "ttft_p95_s": percentile(ttfts, 95),
        "ms_per_token_median": statistics.median([1000 * a.latency_s / max(a.num_tokens, 1) for a in ok] or [0.0]),
        "output_tokens_per_s": num_tokens / wall, "requests_per_s": len(ok) / wall,
        "num_output_tokens": num_tokens,
        "theoretical_speedup_mean": statistics.mean([a.theoretical_speedup for a in ok] or [1.0]),
    }


def direct_rows(args, prompts: list[str]) -> list[dict]:
    """Each prompt decoded alone in this process, async then sequential, interleaved: what the servers' c=1 rows
    would be with no server (same config, chat template, greedy settings)."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from pasta.config import compose, schema_from
    from pasta.decoding import DecodeConfig, decode_async, decode_sequential
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import encode_prompt, load_model

    torch.set_num_threads(args.threads)
    overrides = [*args.override] + ([f"model.path={Path(args.model_path).resolve()}"] if args.model_path else [])
    cfg = compose("serve", ["decode=async", *overrides])
    model, tokenizer = load_model(cfg.model, device="cpu")
    add_tag_tokens(tokenizer, model)
    policy = ReservationPolicy.from_config(cfg.lang.reservation)
    base = schema_from(cfg.decode, DecodeConfig, "decode")
    config = dataclasses.replace(base, max_new_tokens=args.max_tokens, max_total_tokens=args.max_tokens,
                                 sampling=dataclasses.replace(base.sampling, temperature=0.0, seed=None))
    latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
    num_tokens = {mode: 0 for mode in MODES}
    for prompt in [prompts[0], *prompts]:  # the first one warms up, uncounted
        prompt_ids = encode_prompt(tokenizer, prompt)  # the ids the server's chat route gives this user message
        for mode in MODES:
            started = time.perf_counter()
            if mode == "async":
                result = decode_async(model, tokenizer, [prompt_ids], config, policy)[0]
            else:
                result = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
            latencies[mode].append(time.perf_counter() - started)
            num_tokens[mode] += result.stats.num_tokens
    rows = []
    for mode in MODES:
        counted = sorted(latencies[mode][1:])
        rows.append({"mode": mode, "latency_median_s": statistics.median(counted),
                     "latency_p95_s": percentile(counted, 95), "num_output_tokens": num_tokens[mode],
                     "wall_s": sum(counted)})
    return rows


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, round(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def print_table(rows: list[dict]) -> None:
    header = (f"{'mode':<11}{'conc':>5}{'lat med s':>11}{'lat p95 s':>11}{'ttft med':>10}{'ttft p95':>10}"
              f"{'ms/tok':>8}{'tok/s':>8}{'req/s':>8}{'theor.':>8}{'failed':>8}")
    print(header)
    for r in rows:
        print(f"{r['mode']:<11}{r['concurrency']:>5}{r['latency_median_s']:>11.2f}{r['latency_p95_s']:>11.2f}"
              f"{r['ttft_median_s']:>10.2f}{r['ttft_p95_s']:>10.2f}{r['ms_per_token_median']:>8.1f}"
              f"{r['output_tokens_per_s']:>8.1f}{r['requests_per_s']:>8.2f}{r['theoretical_speedup_mean']:>8.2f}"
              f"{r['num_failed']:>8}")


def ratios(rows: list[dict], levels: list[int]) -> dict:
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    out = {}
    for c in levels:
        a, s = by[("async", c)], by[("sequential", c)]
        out[f"c{c}"] = {
            "latency_speedup_median": s["latency_median_s"] / max(a["latency_median_s"], 1e-9),
            "ms_per_token_speedup_median": s["ms_per_token_median"] / max(a["ms_per_token_median"], 1e-9),
            "tokens_per_s_async_over_sequential": a["output_tokens_per_s"] / max(s["output_tokens_per_s"], 1e-9),
        }
    low, high = min(levels), max(levels)
    for mode in MODES:
        out[f"{mode}_tokens_per_s_c{high}_over_c{low}"] = (by[(mode, high)]["output_tokens_per_s"]
                                                           / max(by[(mode, low)]["output_tokens_per_s"], 1e-9))
    return out


def server_overhead(rows: list[dict], direct: list[dict]) -> dict:
    """The async-over-sequential median latency speedup at concurrency 1, served and direct, and their ratio."""
    served = {r["mode"]: r for r in rows if r["concurrency"] == 1}
    alone = {r["mode"]: r for r in direct}
    served_speedup = served["sequential"]["latency_median_s"] / max(served["async"]["latency_median_s"], 1e-9)
    direct_speedup = alone["sequential"]["latency_median_s"] / max(alone["async"]["latency_median_s"], 1e-9)
    return {"served_latency_speedup": served_speedup, "direct_latency_speedup": direct_speedup,
            "served_over_direct": served_speedup / max(direct_speedup, 1e-9),
            **{f"{mode}_served_over_direct_latency": served[mode]["latency_median_s"]
               / max(alone[mode]["latency_median_s"], 1e-9) for mode in MODES}}


async def main_async(args) -> dict:
    prompts = load_prompts(args.prompts, args.num_prompts, args.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    servers = {mode: Server(mode, args, run_dir) for mode in MODES}
    try:
        names = {mode: await s.wait_ready(args.startup_timeout) for mode, s in servers.items()}
        for mode, server in servers.items():  # warm-up: the first forward pays one-time costs
            await ask(server, names[mode], prompts[0], min(8, args.max_tokens))
        rows, direct = [], []
        for concurrency in args.concurrency:
            for mode in MODES:
                row = await run_level(servers[mode], names[mode], prompts, concurrency, args.max_tokens)
                rows.append(row)
                print(f"  {mode} c={concurrency}: {row['wall_s']:.1f} s, {row['num_failed']} failed", flush=True)
            if concurrency == 1 and not args.no_direct:  # both servers idle: decode the same prompts here
                direct = direct_rows(args, prompts)
                print(f"  direct (this process): async {direct[0]['wall_s']:.1f} s, "
                      f"sequential {direct[1]['wall_s']:.1f} s", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    overhead = server_overhead(rows, direct) if direct else None
    return {"rows": rows, "direct": direct, "server_overhead": overhead,
            "ratios": ratios(rows, args.concurrency), "model": names["async"],
            "num_prompts": len(prompts), "prompts": args.prompts, "max_tokens": args.max_tokens,
            "threads": args.threads, "server_logs": str(run_dir)}


def main(argv=None) -> None:
    args = parse_args(argv)
    results = asyncio.run(main_async(args))
    print()
    print_table(results["rows"])
    print()
    for key, value in results["ratios"].items():
        if isinstance(value, dict):
            print(f"async over sequential at {key}: " + ", ".join(f"{k} {v:.2f}x" for k, v in value.items()))
        else:
            print(f"{key}: {value:.2f}x")
    if results["server_overhead"]:
        print("concurrency 1, served vs decoded in this process: "
              + ", ".join(f"{k} {v:.2f}x" for k, v in results["server_overhead"].items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**results, "args": vars(args)}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
