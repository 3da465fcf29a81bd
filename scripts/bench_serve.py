"""Benchmark serving: asynchronous (PASTA-LANG) against sequential decoding behind `python -m pasta.serve`.

    python scripts/bench_serve.py --model-path outputs/cpu/sft/final \\
        --prompts ../shared/data/alpaca_eval.jsonl --num-prompts 64 --max-tokens 96 --concurrency 1 4 16 32 \\
        --mixed-requests 64 --rate 1.0 --latency-bound 30
    python scripts/bench_serve.py --override model=tiny --num-prompts 3 --concurrency 1 2 --max-tokens 8 \\
        --mixed-requests 4 --rate 4 --unforked-prompts 2 --cost-rows 1 2 4 --cost-requests 1 2   # smoke

Two servers are started from the same checkpoint as their own processes (decode=async and decode=sequential, each
on --threads torch threads), and this process drives them over 127.0.0.1 with the `openai` client (chat, greedy,
streamed, max_tokens each).

Closed loop: at each concurrency level the same seeded subset of prompts goes to one server then the other,
interleaved, so both see the same machine, with at most `concurrency` requests in flight. Per mode and level it
prints the median and p95 of the request latency and of the time to first token (TTFT), the median latency per
output token, output tokens/s and requests/s over the level's wall time, the mean theoretical speedup (tokens per
forward step, from each answer's `pasta` stats) and the failed requests; then the ratios: async over sequential at
each level and each mode's tokens/s at every level over its lowest. Then the same levels again on the prompts
whose async answers forked nothing at concurrency 1 (the first --unforked-prompts of them): there PASTA can gain
nothing, and async should cost nothing either.

The bound: this process measures the cost model (pasta.decoding.step_costs: a step's cost by its rows, its
requests and the cache slots they attend, through the decoder's own step, on the same model and threads, while both
servers idle), and reads from each server's /metrics what every step of the level fed: the distribution of its rows
(`pasta_step_rows`), of its requests (`pasta_step_requests`) and the slots attended (`pasta_step_slots`). The terms
of the model add, so those price the level's steps; the level's output tokens over that time is what the server
could give at best on this machine (it leaves out the decoder's bookkeeping, the sampler's work beyond an argmax
and the HTTP side). measured / bound is the server's efficiency. The same steps priced at one row of one request
each (a device whose step costs the same whatever it feeds) give the flat bound, whose async/sequential ratio is
the ratio of tokens per step.

Mixed workload: --mixed-requests requests, half forking list prompts and half short factual prompts (both written
below), arriving with Poisson gaps at --rate requests/s (one seeded schedule, the same for both modes), open loop
(each request starts at its arrival, whatever is still running; the server queues what it cannot admit). Per mode:
p50/p95 latency and TTFT (all requests, and each kind), output tokens/s, and the goodput at --latency-bound: the
requests per second that finished within the bound, and their share.

At concurrency 1 the same prompts are also decoded in this process with the library's decoders (`decode`, greedy,
so the very answers the servers gave) while both servers idle: the served async-over-sequential latency speedup
divided by the direct one is the server's cost to the speedup (1.00 = none), and the per-step profile compares a
served step with a direct one on the same clock, the step loop's StepTiming (served: `pasta_step_seconds` and
`pasta_step_host_seconds`; direct: DecodeStats' wall time and bookkeeping, their sums). Output tokens are
`usage.completion_tokens` (every thread's). The two modes write different answers (sequential decoding writes the
tags as plain tokens), so compare tokens/s as well as request latency.
Timings on a shared machine are noisy: run it alone. Results also go to --out as JSON.
"""

from __future__ import annotations

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
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai

from pasta.cli import child_error, run_script
from pasta.config import compose
from pasta.data import check_output_file, read_jsonl
from pasta.decoding import DECODE_MODES as MODES
from pasta.errors import ArgumentParser, PastaError
from pasta.measure import percentile
from pasta.serving.metrics import bucket_counts, read_engine_metrics

ROOT = Path(__file__).resolve().parent.parent

# The mixed workload's two kinds: lists whose items a PASTA model writes as parallel chunks, and questions with a
# one-line answer.
FORKING_PROMPTS = [
    "List five tips for sleeping better.",
    "Give four ways to save money on groceries.",
    "Name five benefits of regular exercise.",
    "List four steps to start a vegetable garden.",
    "Give five tips for a successful job interview.",
    "Name four ways to reduce stress at work.",
    "List five things to pack for a beach trip.",
    "Give four tips for learning a new language.",
    "List five healthy breakfast ideas.",
    "Name four ways to make a small room look bigger.",
    "Give five tips for writing a clear email.",
    "List four reasons to learn to cook.",
    "Name five habits of productive people.",
    "Give four tips for taking care of a houseplant.",
    "List five ideas for a rainy afternoon with children.",
    "Give four ways to stay safe while cycling in a city.",
]
FACTUAL_PROMPTS = [
    "What is the capital of France?",
    "Who wrote Pride and Prejudice?",
    "At what temperature does water boil at sea level, in Celsius?",
    "How many continents are there?",
    "Which gas do plants take in from the air?",
    "What is the largest planet in the solar system?",
    "Who painted the Mona Lisa?",
    "What is the chemical symbol for gold?",
    "How many days are there in a leap year?",
    "Which ocean is the largest?",
    "What is the square root of 81?",
    "Who was the first person to walk on the Moon?",
    "What language is spoken in Brazil?",
    "How many legs does a spider have?",
    "What is the freezing point of water in Fahrenheit?",
    "Which country is home to the kangaroo?",
]


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="checkpoint folder (default: the config's model)")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for both servers")
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared" / "data" / "alpaca_eval.jsonl"),
                        help="JSONL with an `instruction` field per line (and an optional `input`)")
    parser.add_argument("--num-prompts", type=int, default=64,
                        help="seeded random subset of the prompts file, sent at every concurrency level")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset and of the mixed schedule")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32], help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=96, help="max_tokens of every request")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of each server (and of this "
                                                               "process's c(q) and direct decoding)")
    parser.add_argument("--mixed-requests", type=int, default=64,
                        help="requests of the mixed workload (half of each kind); 0 skips it")
    parser.add_argument("--rate", type=float, default=1.0, help="mixed workload: mean arrivals per second (Poisson)")
    parser.add_argument("--latency-bound", type=float, default=30.0,
                        help="mixed workload: seconds within which a request counts towards the goodput")
    parser.add_argument("--unforked-prompts", type=int, default=16,
                        help="prompts whose async answers forked nothing, sent again at every level; 0 skips it")
    parser.add_argument("--cost-rows", type=int, nargs="+", default=None,
                        help="the cost model's row counts (default: pasta.decoding.step_costs.ROWS)")
    parser.add_argument("--cost-requests", type=int, nargs="+", default=None,
                        help="the cost model's request counts (default: pasta.decoding.step_costs.REQUESTS)")
    parser.add_argument("--startup-timeout", type=float, default=600, help="seconds to wait for a server")
    parser.add_argument("--no-direct", action="store_true",
                        help="skip decoding the prompts in this process (the server-overhead reference)")
    parser.add_argument("--out", default="outputs/bench/bench_serve.json", help="JSON results file")
    return parser.parse_args(argv)


def load_prompts(path: str, num_prompts: int, seed: int) -> list[str]:
    rows = read_jsonl(path)
    if not rows or any("instruction" not in r for r in rows):
        raise PastaError(f"{path} needs an `instruction` field on every line")
    rows = random.Random(seed).sample(rows, min(num_prompts, len(rows)))
    return [f"{r['instruction']}\n\n{r['input']}" if r.get("input") else r["instruction"] for r in rows]


def user_overrides(args) -> list[str]:
    """The overrides both servers, this process's model and the input check share: --override, then --model-path."""
    return [*args.override] + ([f"model.path={Path(args.model_path).resolve()}"] if args.model_path else [])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the servers ----------------------------------------------------------------------------------------------------


class Server:
    """`python -m pasta.serve` in a child process on a free 127.0.0.1 port."""

    def __init__(self, mode: str, args, run_dir: Path):
        self.mode = mode
        self.port = free_port()
        overrides = [f"decode={mode}", "host=127.0.0.1", f"port={self.port}", f"num_threads={args.threads}",
                     "log_level=warning", f"hydra.run.dir={run_dir / mode}", f"limits.max_tokens={args.max_tokens}",
                     f"limits.max_running_requests={max(args.concurrency)}", *user_overrides(args)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.log = open(run_dir / f"{mode}.log", "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen([sys.executable, "-m", "pasta.serve", *overrides], env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=1800)
        self.model = ""

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the server answers; keeps the served model name."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                self.log.flush()
                why = child_error(Path(self.log.name).read_text(errors="replace"))
                raise PastaError(f"the {self.mode} server exited ({why}); see {self.log.name}")
            try:
                self.model = (await self.client.models.list()).data[0].id
                return
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise PastaError(f"the {self.mode} server did not start in {timeout_s:.0f} s") from None
                await asyncio.sleep(0.5)

    async def metrics(self) -> dict[str, dict]:
        """The engine's step metrics that the bound and the profile read (pasta.serving.metrics)."""
        url = self.base_url.removesuffix("/v1") + "/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
        return read_engine_metrics(text)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def metrics_delta(after: dict[str, dict], before: dict[str, dict]) -> dict[str, dict]:
    return {name: {key: value - before[name].get(key, 0.0) for key, value in values.items()}
            for name, values in after.items()}


# --- requests -------------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    latency_s: float
    ttft_s: float
    num_tokens: int
    theoretical_speedup: float
    num_threads: int
    ok: bool
    kind: str = ""
    prompt: str = ""


async def ask(server: Server, prompt: str, max_tokens: int, kind: str = "") -> Answer:
    started = time.perf_counter()
    first = None
    usage, pasta = None, {}
    try:
        stream = await server.client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": prompt}], temperature=0.0,
            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter()
            if chunk.choices and chunk.choices[0].finish_reason:
                pasta = getattr(chunk.choices[0], "pasta", None) or {}
            if chunk.usage:
                usage = chunk.usage
    except openai.APIError as exc:
        print(f"  {server.mode}: request failed: {exc}", file=sys.stderr)
        return Answer(time.perf_counter() - started, 0.0, 0, 1.0, 0, False, kind, prompt)
    ended = time.perf_counter()
    return Answer(ended - started, (first or ended) - started, usage.completion_tokens if usage else 0,
                  pasta.get("theoretical_speedup", 1.0), pasta.get("num_threads", 0), usage is not None, kind,
                  prompt)


def summary(answers: list[Answer], wall_s: float) -> dict:
    ok = [a for a in answers if a.ok]
    latencies = sorted(a.latency_s for a in ok) or [0.0]
    ttfts = sorted(a.ttft_s for a in ok) or [0.0]
    num_tokens = sum(a.num_tokens for a in ok)
    return {
        "num_requests": len(answers), "num_failed": len(answers) - len(ok), "wall_s": wall_s,
        "latency_median_s": statistics.median(latencies), "latency_p95_s": percentile(latencies, 95),
        "ttft_median_s": statistics.median(ttfts), "ttft_p95_s": percentile(ttfts, 95),
        "ms_per_token_median": statistics.median([1000 * a.latency_s / max(a.num_tokens, 1) for a in ok] or [0.0]),
        "output_tokens_per_s": num_tokens / wall_s, "requests_per_s": len(ok) / wall_s,
        "num_output_tokens": num_tokens,
        "theoretical_speedup_mean": statistics.mean([a.theoretical_speedup for a in ok] or [1.0]),
        "num_forked": sum(1 for a in ok if a.num_threads),
    }


async def run_level(server: Server, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> Answer:
        async with gate:
            return await ask(server, prompt, max_tokens)

    before = await server.metrics()
    started = time.perf_counter()
    answers = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - started
    steps = metrics_delta(await server.metrics(), before)
    return {"mode": server.mode, "concurrency": concurrency, **summary(answers, wall), "engine": steps,
            "unforked_prompts": [a.prompt for a in answers if a.ok and not a.num_threads]}


def unforked_prompts(rows: list[dict], limit: int) -> list[str]:
    """The first `limit` prompts whose async answers forked nothing at the lowest concurrency level (greedy: the same
    answers at every level)."""
    asynchronous = [r for r in rows if r["mode"] == "async"]
    if not limit or not asynchronous:
        return []
    return min(asynchronous, key=lambda r: r["concurrency"])["unforked_prompts"][:limit]


def mixed_schedule(num_requests: int, rate: float, seed: int) -> list[tuple[float, str, str]]:
    """(arrival second, prompt, kind): half forking list prompts, half factual ones, shuffled, Poisson gaps."""
    rng = random.Random(seed)
    kinds = ["forking"] * (num_requests // 2) + ["factual"] * (num_requests - num_requests // 2)
    rng.shuffle(kinds)
    pools = {"forking": FORKING_PROMPTS, "factual": FACTUAL_PROMPTS}
    schedule, arrival = [], 0.0
    for i, kind in enumerate(kinds):
        schedule.append((arrival, pools[kind][i % len(pools[kind])], kind))
        arrival += rng.expovariate(rate)
    return schedule


async def run_mixed(server: Server, schedule: list[tuple[float, str, str]], max_tokens: int,
                    latency_bound: float) -> dict:
    started = time.perf_counter()

    async def one(arrival: float, prompt: str, kind: str) -> Answer:
        await asyncio.sleep(max(0.0, started + arrival - time.perf_counter()))
        return await ask(server, prompt, max_tokens, kind)

    answers = await asyncio.gather(*(one(*entry) for entry in schedule))
    wall = time.perf_counter() - started
    within = [a for a in answers if a.ok and a.latency_s <= latency_bound]
    return {
        "mode": server.mode, **summary(answers, wall),
        "by_kind": {kind: summary([a for a in answers if a.kind == kind], wall) for kind in ("forking", "factual")},
        "latency_bound_s": latency_bound, "goodput_requests_per_s": len(within) / wall,
        "goodput_share": len(within) / len(answers), "goodput_tokens_per_s": sum(a.num_tokens for a in within) / wall,
    }


# --- this process: c(q) and the direct decodes ----------------------------------------------------------------------


class Local:
    """The servers' model, loaded in this process (same config, chat template, greedy settings)."""

    def __init__(self, args):
        import torch

        sys.path.insert(0, str(ROOT / "src"))
        from pasta.config import compose, schema_from
        from pasta.decoding import DecodeConfig
        from pasta.lang import ReservationPolicy, add_tag_tokens
        from pasta.models import load_model

        torch.set_num_threads(args.threads)
        cfg = compose("serve", ["decode=async", *user_overrides(args)])
        self.model, self.tokenizer = load_model(cfg.model, device="cpu")
        add_tag_tokens(self.tokenizer, self.model)
        self.policy = ReservationPolicy.from_config(cfg.lang.reservation)
        base = schema_from(cfg.decode, DecodeConfig, "decode")
        self.config = dataclasses.replace(base, max_new_tokens=args.max_tokens, max_total_tokens=args.max_tokens,
                                          sampling=dataclasses.replace(base.sampling, temperature=0.0, seed=None))

    def step_costs(self, rows: list[int] | None, requests: list[int] | None):
        from pasta.decoding.step_costs import REQUESTS, ROWS, measure_step_costs

        return measure_step_costs(self.model, rows=rows or ROWS, requests=requests or REQUESTS)

    def direct_rows(self, prompts: list[str]) -> list[dict]:
        """Each prompt decoded alone, async then sequential, interleaved: what the servers' c=1 rows would be with
        no server."""
        from pasta.decoding import decode
        from pasta.models import encode_prompt

        latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
        totals = {mode: {"num_tokens": 0, "num_steps": 0, "wall_s": 0.0, "bookkeeping_s": 0.0} for mode in MODES}
        for n, prompt in enumerate([prompts[0], *prompts]):  # the first one warms up, uncounted
            prompt_ids = encode_prompt(self.tokenizer, prompt)  # the ids the server's chat route gives this message
            for mode in MODES:
                started = time.perf_counter()
                result = decode(self.model, self.tokenizer, [prompt_ids], self.config, mode=mode,
                                policy=self.policy)[0]
                latencies[mode].append(time.perf_counter() - started)
                if n:
                    for key in totals[mode]:
                        totals[mode][key] += getattr(result.stats, key)
        rows = []
        for mode in MODES:
            counted = sorted(latencies[mode][1:])
            total = totals[mode]
            rows.append({"mode": mode, "latency_median_s": statistics.median(counted),
                         "latency_p95_s": percentile(counted, 95), "num_output_tokens": total["num_tokens"],
                         "wall_s": sum(counted), "step_ms": 1000 * total["wall_s"] / max(total["num_steps"], 1),
                         "host_ms_per_step": 1000 * total["bookkeeping_s"] / max(total["num_steps"], 1)})
        return rows


# --- analysis -------------------------------------------------------------------------------------------------------


def bounds(rows: list[dict], costs) -> list[dict]:
    """Each level's bound: its steps priced on the cost model from their rows, requests and attended slots, and
    flat (every step at one row of one request)."""
    out = []
    for r in rows:
        engine = r["engine"]
        row_counts = bucket_counts(engine["pasta_step_rows"])
        request_counts = bucket_counts(engine["pasta_step_requests"])
        busy_s = costs.steps_seconds(row_counts, request_counts, engine["pasta_step_slots"].get("total", 0.0))
        num_steps = sum(n for _, n in row_counts)
        tokens = r["num_output_tokens"]
        bound = tokens / busy_s if busy_s > 0 else 0.0
        out.append({"mode": r["mode"], "concurrency": r["concurrency"], "workload": r.get("workload", "all"),
                    "num_steps": num_steps,
                    "rows_per_step_mean": sum(q * n for q, n in row_counts) / max(num_steps, 1),
                    "requests_per_step_mean": sum(q * n for q, n in request_counts) / max(num_steps, 1),
                    "tokens_per_step": tokens / max(num_steps, 1), "bound_tokens_per_s": bound,
                    "efficiency": r["output_tokens_per_s"] / bound if bound else 0.0,
                    "flat_bound_tokens_per_s": tokens / (num_steps * costs.cost(1)) if num_steps else 0.0})
    return out


def ratios(rows: list[dict], levels: list[int]) -> dict:
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    if not by:
        return {}
    out = {}
    for c in levels:
        a, s = by[("async", c)], by[("sequential", c)]
        out[f"c{c}"] = {
            "latency_speedup_median": s["latency_median_s"] / max(a["latency_median_s"], 1e-9),
            "ms_per_token_speedup_median": s["ms_per_token_median"] / max(a["ms_per_token_median"], 1e-9),
            "tokens_per_s_async_over_sequential": a["output_tokens_per_s"] / max(s["output_tokens_per_s"], 1e-9),
        }
    low = min(levels)
    for mode in MODES:
        for c in levels:
            if c != low:
                out[f"{mode}_tokens_per_s_c{c}_over_c{low}"] = (by[(mode, c)]["output_tokens_per_s"]
                                                                / max(by[(mode, low)]["output_tokens_per_s"], 1e-9))
    return out


def server_overhead(rows: list[dict], direct: list[dict]) -> dict:
    """The async-over-sequential median latency speedup at concurrency 1, served and direct, their ratio, and the
    per-step profile (a step's time and its host part, served and direct)."""
    served = {r["mode"]: r for r in rows if r["concurrency"] == 1}
    alone = {r["mode"]: r for r in direct}
    served_speedup = served["sequential"]["latency_median_s"] / max(served["async"]["latency_median_s"], 1e-9)
    direct_speedup = alone["sequential"]["latency_median_s"] / max(alone["async"]["latency_median_s"], 1e-9)
    profile = {}
    for mode in MODES:
        engine = served[mode]["engine"]
        num_steps = max(engine["pasta_step_seconds"].get("count", 0.0), 1.0)
        profile[mode] = {
            "served_step_ms": 1000 * engine["pasta_step_seconds"].get("sum", 0.0) / num_steps,
            "served_host_ms_per_step": 1000 * engine["pasta_step_host_seconds"].get("sum", 0.0) / num_steps,
            "direct_step_ms": alone[mode]["step_ms"], "direct_host_ms_per_step": alone[mode]["host_ms_per_step"],
            "served_over_direct_latency": served[mode]["latency_median_s"] / max(alone[mode]["latency_median_s"],
                                                                                 1e-9),
        }
    return {"served_latency_speedup": served_speedup, "direct_latency_speedup": direct_speedup,
            "served_over_direct": served_speedup / max(direct_speedup, 1e-9), "profile": profile}


def targets(results: dict) -> list[tuple[str, float, float]]:
    """The targets (issue 35's, then the earlier ones it keeps): (what, measured, at least)."""
    by = {(r["mode"], r["concurrency"]): r for r in results["rows"]}
    bound = {(b["mode"], b["concurrency"]): b for b in results["bounds"]}
    levels = sorted({c for _, c in by})
    out = []
    for c in levels:
        out.append((f"c={c}: async tokens/s over sequential's",
                    results["ratios"][f"c{c}"]["tokens_per_s_async_over_sequential"], 1.1 if c == 4 else 1.0))
        for mode in MODES:
            out.append((f"c={c}: {mode} tokens/s over its bound", bound[(mode, c)]["efficiency"], 0.9))
    for c in levels if results["unforked_ratios"] else []:
        out.append((f"c={c}, prompts that fork nothing: async tokens/s over sequential's",
                    results["unforked_ratios"][f"c{c}"]["tokens_per_s_async_over_sequential"], 0.98))
    if 1 in levels and 16 in levels:
        out.append(("async tokens/s at c=16 over c=1", results["ratios"]["async_tokens_per_s_c16_over_c1"], 3.0))
    if results["server_overhead"]:
        out.append(("c=1: served async-over-sequential speedup over the direct one",
                    results["server_overhead"]["served_over_direct"], 0.95))
    return out


def print_table(rows: list[dict]) -> None:
    header = (f"{'mode':<11}{'conc':>5}{'lat med s':>11}{'lat p95 s':>11}{'ttft med':>10}{'ttft p95':>10}"
              f"{'ms/tok':>8}{'tok/s':>8}{'req/s':>8}{'theor.':>8}{'failed':>8}")
    print(header)
    for r in rows:
        print(f"{r['mode']:<11}{r.get('concurrency', '-'):>5}{r['latency_median_s']:>11.2f}{r['latency_p95_s']:>11.2f}"
              f"{r['ttft_median_s']:>10.2f}{r['ttft_p95_s']:>10.2f}{r['ms_per_token_median']:>8.1f}"
              f"{r['output_tokens_per_s']:>8.1f}{r['requests_per_s']:>8.2f}{r['theoretical_speedup_mean']:>8.2f}"
              f"{r['num_failed']:>8}")


def print_bounds(bound_rows: list[dict]) -> None:
    print(f"{'mode':<11}{'conc':>5}{'steps':>7}{'rows/step':>10}{'req/step':>9}{'tok/step':>9}{'bound tok/s':>12}"
          f"{'measured/bound':>15}{'flat bound':>11}")
    for b in bound_rows:
        print(f"{b['mode']:<11}{b['concurrency']:>5}{b['num_steps']:>7}{b['rows_per_step_mean']:>10.2f}"
              f"{b['requests_per_step_mean']:>9.2f}{b['tokens_per_step']:>9.2f}{b['bound_tokens_per_s']:>12.1f}"
              f"{b['efficiency']:>15.2f}{b['flat_bound_tokens_per_s']:>11.1f}")
    by = {(b["mode"], b["concurrency"]): b for b in bound_rows}
    for c in sorted({b["concurrency"] for b in bound_rows}):
        a, s = by[("async", c)], by[("sequential", c)]
        print(f"  c={c}: bound async/sequential {a['bound_tokens_per_s'] / max(s['bound_tokens_per_s'], 1e-9):.2f}x;"
              f" flat c(q) (memory-bound device) {a['flat_bound_tokens_per_s'] / max(s['flat_bound_tokens_per_s'], 1e-9):.2f}x")


def print_mixed(mixed: list[dict]) -> None:
    for m in mixed:
        kinds = ", ".join(f"{kind}: p50 {s['latency_median_s']:.2f} s, ttft p50 {s['ttft_median_s']:.2f} s, "
                          f"{s['num_forked']}/{s['num_requests']} forked" for kind, s in m["by_kind"].items())
        print(f"{m['mode']:<11} latency p50/p95 {m['latency_median_s']:.2f}/{m['latency_p95_s']:.2f} s, TTFT p50/p95 "
              f"{m['ttft_median_s']:.2f}/{m['ttft_p95_s']:.2f} s, {m['output_tokens_per_s']:.1f} tok/s, goodput "
              f"{m['goodput_requests_per_s']:.2f} req/s within {m['latency_bound_s']:.0f} s "
              f"({100 * m['goodput_share']:.0f}%), failed {m['num_failed']}; {kinds}")


async def main_async(args) -> dict:
    prompts = load_prompts(args.prompts, args.num_prompts, args.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    servers = {mode: Server(mode, args, run_dir) for mode in MODES}
    local = None
    try:
        for server in servers.values():
            await server.wait_ready(args.startup_timeout)
        for server in servers.values():  # warm-up: the first forward pays one-time costs
            await ask(server, prompts[0], min(8, args.max_tokens))
        local = Local(args)  # both servers idle: the cost model is measured on a quiet machine
        costs = local.step_costs(args.cost_rows, args.cost_requests)
        print("  c(rows) ms: " + ", ".join(f"{q}: {1000 * s:.1f}" for q, s in zip(costs.rows, costs.seconds, strict=True))
              + "; c(requests x 1 row) ms: " + ", ".join(
                  f"{r}: {1000 * s:.1f}" for r, s in zip(costs.requests, costs.request_seconds, strict=True))
              + f"; per slot beyond {costs.cache_len}: {1e6 * costs.slot_seconds:.3f} us", flush=True)
        rows, direct = [], []
        for concurrency in args.concurrency:
            for mode in MODES:
                row = await run_level(servers[mode], prompts, concurrency, args.max_tokens)
                rows.append(row)
                print(f"  {mode} c={concurrency}: {row['wall_s']:.1f} s, {row['num_failed']} failed", flush=True)
            if concurrency == 1 and not args.no_direct:  # both servers idle: decode the same prompts here
                direct = local.direct_rows(prompts)
                print(f"  direct (this process): async {direct[0]['wall_s']:.1f} s, "
                      f"sequential {direct[1]['wall_s']:.1f} s", flush=True)
        unforked_rows = []
        unforked = unforked_prompts(rows, args.unforked_prompts)
        for concurrency in args.concurrency if unforked else []:
            for mode in MODES:
                row = {**await run_level(servers[mode], unforked, concurrency, args.max_tokens), "workload": "unforked"}
                unforked_rows.append(row)
                print(f"  unforked {mode} c={concurrency}: {row['wall_s']:.1f} s, {row['num_failed']} failed",
                      flush=True)
        mixed = []
        if args.mixed_requests:
            schedule = mixed_schedule(args.mixed_requests, args.rate, args.seed)
            for mode in MODES:
                mixed.append(await run_mixed(servers[mode], schedule, args.max_tokens, args.latency_bound))
                print(f"  mixed {mode}: {mixed[-1]['wall_s']:.1f} s, {mixed[-1]['num_failed']} failed", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    overhead = server_overhead(rows, direct) if direct and 1 in args.concurrency else None
    return {"rows": rows, "bounds": bounds(rows, costs), "step_costs": costs.to_dict(), "direct": direct,
            "server_overhead": overhead, "ratios": ratios(rows, args.concurrency), "mixed": mixed,
            "unforked_rows": unforked_rows, "unforked_bounds": bounds(unforked_rows, costs),
            "unforked_ratios": ratios(unforked_rows, args.concurrency), "num_unforked_prompts": len(unforked),
            "model": servers["async"].model, "num_prompts": len(prompts), "prompts": args.prompts,
            "max_tokens": args.max_tokens, "threads": args.threads, "server_logs": str(run_dir)}


def check_inputs(args) -> None:
    """What the servers would refuse minutes apart, refused before either starts: their settings and model folder,
    the prompts file and the output file."""
    from pasta.models import resolve_source
    from pasta.settings import check_settings

    cfg = compose("serve", ["decode=async", *user_overrides(args)])
    check_settings(cfg, "serve")
    resolve_source(cfg.model, "--model-path" if args.model_path else "model.path")
    if not Path(args.prompts).is_file():
        raise PastaError(f"--prompts={args.prompts}: no such file (JSONL with an `instruction` field per line)")
    check_output_file(args.out, "--out")


def main(argv=None) -> None:
    args = parse_args(argv)
    check_inputs(args)
    results = asyncio.run(main_async(args))
    print()
    print_table(results["rows"])
    print()
    print_bounds(results["bounds"])
    if results["unforked_rows"]:
        print(f"\nprompts whose async answers fork nothing ({results['num_unforked_prompts']}):")
        print_table(results["unforked_rows"])
        print_bounds(results["unforked_bounds"])
    print()
    for key, value in results["ratios"].items():
        if isinstance(value, dict):
            print(f"async over sequential at {key}: " + ", ".join(f"{k} {v:.2f}x" for k, v in value.items()))
        else:
            print(f"{key}: {value:.2f}x")
    if results["server_overhead"]:
        overhead = results["server_overhead"]
        print(f"concurrency 1, served vs decoded in this process: served speedup "
              f"{overhead['served_latency_speedup']:.2f}x, direct {overhead['direct_latency_speedup']:.2f}x, "
              f"served/direct {overhead['served_over_direct']:.2f}")
        for mode, p in overhead["profile"].items():
            print(f"  {mode}: step {p['served_step_ms']:.1f} ms served / {p['direct_step_ms']:.1f} ms direct, "
                  f"host {p['served_host_ms_per_step']:.2f} / {p['direct_host_ms_per_step']:.2f} ms per step, "
                  f"latency served/direct {p['served_over_direct_latency']:.2f}x")
    if results["mixed"]:
        print()
        print_mixed(results["mixed"])
    print()
    for what, measured, least in targets(results):
        print(f"{'met ' if measured >= least else 'MISS'} {what}: {measured:.2f} (target >= {least:.2f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**results, "args": vars(args)}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    run_script(main)
