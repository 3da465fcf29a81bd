"""Decode the evaluated prompts for one checkpoint and decode mode, resumably: the "generate" half of pasta.eval.

    python -m pasta.eval eval.mode=generate model.path=outputs/sft decode=async eval.limit=50

Writes into the run directory (see pasta.evaluation.run_files), nothing before the model has loaded: run.json first
(what is decoded, where), then one stats.jsonl line per prompt as it finishes (appended whole and fsynced), and model_outputs.json (AlpacaEval format)
atomically once every prompt is done. A rerun into the same directory skips the prompts already in stats.jsonl;
a directory that holds another model's or another decode mode's run is refused, and so are prompts that do not fit
the model's positions with decode.max_new_tokens (one line with their count, before the weights load).

Under `accelerate launch` (pasta.parallel) each process decodes its share of the prompts into its own part file and
the main process gathers them into stats.jsonl and model_outputs.json in prompt order, as one process writes them;
run.json records the process count (`num_processes`, a list when resumed runs used several), and speedups against
a run decoded with another count are refused, like those against another device.

Timing modes: `wall` decodes one request at a time after `eval.warmup_prompts` discarded warm-up decodes (the
paper's batch-1 latency, the only mode per-prompt speedups are computed from); `throughput` decodes batches of
`eval.batch_size` at once, continuously batched (the next prompt joins as one ends; wall_s is then the time from a
request's joining to its end, shared with the requests beside it), after decoding its first
`eval.timed_prompts` prompts one at a time, so that a stated subset has batch-1 wall times. Every stats line keeps
the rows each forward fed (`step_rows`), and a sequential run's `step_costs.json` the model's cost model
(pasta.decoding.cost_model: a step's cost by its rows and the cache it attends, measured through the decoder's own
step), so that every answer's batch-1 latency can also be modelled, batched or not, on both sides of a speedup
against it (eval.sequential). A run whose step_costs.json is of an older version measures it again when it is
rerun, even with nothing left to decode.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from pasta.config import schema_from
from pasta.data import JsonlAppender, write_json_atomic
from pasta.decoding import DECODE_MODES, DecodeConfig, DecodeError, DecodeResult, decode
from pasta.decoding.config import decode_difference
from pasta.decoding.cost_model import VERSION as COST_MODEL_VERSION
from pasta.errors import PastaError
from pasta.evaluation.config import EvalConfig, Timing
from pasta.evaluation.eval_set import eval_prompts, num_outside_heldout_pool, subset_meta
from pasta.evaluation.run_files import (
    MODEL_OUTPUTS,
    RUN_META,
    STATS,
    STEP_COSTS,
    check_unique_instructions,
    read_json,
    read_stats,
)
from pasta.lang import ReservationPolicy
from pasta.models.trained_lang import decoding_policy
from pasta.parallel import Processes, ShardedJsonl, current_processes
from pasta.records import as_json, first_difference

log = logging.getLogger(__name__)

EVAL_DECODE_MODES = (*DECODE_MODES, "sot")  # sot: Skeleton-of-Thought prompting over the sequential decoder
# run.json keys that must match for a rerun to resume into the same directory: every setting that changes the
# tokens (model, decode mode and settings, reservation policy, seed, Skeleton-of-Thought prompts), the prompts
# (eval.subset), and the device (wall times from two machines in one run would make its speedups meaningless); and
# eval.parallelism: forked answers decoded without their replay would drop out of the parallelism geomean while
# the plain ones stayed, drawing it toward 1.
RESUME_KEYS = (
    "generator", "model", "decode", "timing", "eval_data", "decoding", "reservation", "seed", "sot", "subset",
    "device", "cpu_capability", "sequential_model", "parallelism",
)
# Keys run.json did not record before; a run directory written earlier still resumes (make demo into old outputs).
RECORDED_SINCE = ("reservation", "seed", "sot", "subset", "sequential_model", "cpu_capability", "parallelism")


def device_description(device: str) -> str:
    """The hardware a wall time was measured on; speedups compare runs only when this matches."""
    if device.startswith("cuda"):
        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"cpu: {cpu}, {torch.get_num_threads()} threads"


def cpu_capability(device: str) -> str | None:
    """The vector instruction set torch's CPU kernels dispatch to (AVX512, AVX2, ...), None on a GPU. Two hosts
    that /proc/cpuinfo names alike can differ in it, and it changes both the wall times and the rounding."""
    return None if device.startswith("cuda") else torch.backends.cpu.get_cpu_capability()


def decode_mode(cfg: DictConfig) -> str:
    mode = str(cfg.decode.kind)
    if mode not in EVAL_DECODE_MODES:
        raise PastaError(f"decode={mode} is not one of {', '.join(EVAL_DECODE_MODES)}")
    return mode


class Decoder:
    """One callable over the three decode modes: prompts (instructions) in, DecodeResults out."""

    def __init__(self, cfg: DictConfig, ecfg: EvalConfig, mode: str, model, tokenizer, beside=None):
        self.mode, self.model, self.tokenizer, self.ecfg = mode, model, tokenizer, ecfg
        self.beside = beside  # (model, tokenizer) of eval.sequential_model, or None
        self.config = schema_from(cfg.decode, DecodeConfig, "decode")
        self.policy = None
        if mode == "async":
            from pasta.lang import add_tag_tokens

            # A PASTA checkpoint already carries the tag tokens; a plain model gets them (untrained rows).
            add_tag_tokens(tokenizer, model)
            self.policy = decoding_policy(cfg.lang.reservation, cfg.model)

    def __call__(self, records: list[dict[str, Any]], max_batch: int | None = None,
                 on_result: Callable[[int, DecodeResult], None] | None = None) -> list[DecodeResult]:
        """`records`' answers, at most `max_batch` decoding at once (pasta.decoding.decode); `on_result(i, result)`
        hears each as it ends."""
        if self.mode == "sot":
            results = []
            for i, record in enumerate(records):
                results.append(self._sot(record))
                if on_result is not None:
                    on_result(i, results[-1])
            return results
        from pasta.models import encode_prompt

        prompt_ids = [encode_prompt(self.tokenizer, r["instruction"], r.get("input", "")) for r in records]
        return decode(self.model, self.tokenizer, prompt_ids, self.config, mode=self.mode, policy=self.policy,
                      max_batch=max_batch, on_result=on_result)


    @property
    def replays(self) -> bool:
        """Answers decoded alone are replayed sequentially (eval.parallelism, async runs)."""
        return self.mode == "async" and self.ecfg.parallelism

    def replay(self, record: dict[str, Any], result: DecodeResult) -> dict[str, Any]:
        """Time the answer's plain text decoded one token per step (its own tokens forced: the same answer without
        the tags that made it parallel), right after its asynchronous decode, on the same model."""
        from pasta.lang import encode_text
        from pasta.models import encode_prompt

        prompt_ids = encode_prompt(self.tokenizer, record["instruction"], record.get("input", ""))
        plain_ids = encode_text(self.tokenizer, result.text)
        if result.stats.finish_reason == "eos" or not plain_ids:
            plain_ids.append(self.tokenizer.eos_token_id)
        config = dataclasses.replace(self.config, max_new_tokens=len(plain_ids), max_total_tokens=None,
                                     stop_strings=())
        (replayed,) = decode(self.model, self.tokenizer, [prompt_ids], config, mode="sequential",
                             forced_ids=[plain_ids])
        return {"replay_wall_s": replayed.stats.wall_s, "replay_num_tokens": len(plain_ids)}

    def time_beside(self, record: dict[str, Any]) -> dict[str, Any]:
        """Decode the prompt with eval.sequential_model, one token per step, right after the run's own answer: the
        sequential time the wall-clock speedup divides, measured under the same machine state."""
        if self.beside is None:
            return {}
        from pasta.models import encode_prompt

        model, tokenizer = self.beside
        prompt_ids = encode_prompt(tokenizer, record["instruction"], record.get("input", ""))
        (result,) = decode(model, tokenizer, [prompt_ids], self.config, mode="sequential")
        return {"sequential_wall_s": result.stats.wall_s, "sequential_num_tokens": result.stats.num_tokens}

    def _sot(self, record: dict[str, Any]) -> DecodeResult:
        from pasta.evaluation.sot import decode_sot

        try:
            return decode_sot(self.model, self.tokenizer, record["instruction"], self.ecfg.sot, self.config)
        except DecodeError as exc:  # one of its outline's points: the prompt is what failed
            raise PastaError(f"decoding the prompt {record['instruction'][:80]!r} failed: {exc}") from None


def _run_meta(
    cfg: DictConfig, ecfg: EvalConfig, generator: str, mode: str, device: str, num_processes: int
) -> dict[str, Any]:
    return {
        "generator": generator,
        "model": str(cfg.model.path) if cfg.model.get("path") else str(cfg.model.name),
        "decode": mode,
        "timing": ecfg.timing,
        "batch_size": 1 if ecfg.timing == Timing.wall else ecfg.batch_size,
        "decoding": as_json(dataclasses.asdict(schema_from(cfg.decode, DecodeConfig, "decode"))),
        "reservation": (
            as_json(dataclasses.asdict(ReservationPolicy.from_config(cfg.lang.reservation)))
            if mode == "async" else None
        ),
        "seed": cfg.get("seed"),
        "sot": as_json(dataclasses.asdict(ecfg.sot)) if mode == "sot" else None,
        "eval_data": str(cfg.eval_data.name),
        "subset": subset_meta(ecfg.subset, ecfg.subset_seed),
        "device": device_description(device),
        "cpu_capability": cpu_capability(device),
        "sequential_model": ecfg.sequential_model,  # the model timed beside each prompt decoded alone
        "parallelism": ecfg.parallelism if mode == "async" else None,  # forked answers replayed sequentially
        "num_processes": num_processes,
        "torch": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _check_resumable(run_dir: Path, previous: dict[str, Any], meta: dict[str, Any]) -> None:
    """Refuse to resume into `run_dir` (whose run.json holds `previous`) a run that differs in a RESUME_KEYS key."""
    for key in RESUME_KEYS:
        if key in RECORDED_SINCE and key not in previous:
            continue  # an older run.json: its run used the config's value, as this one does
        if key == "decoding":
            difference = decode_difference(previous.get(key), meta[key])
        elif previous.get(key) != meta[key]:
            difference = first_difference(key, previous.get(key), meta[key])
        else:
            difference = None
        if difference is not None:
            name, recorded, asked = difference
            raise PastaError(
                f"{run_dir} holds a run with {name}={recorded!r}, not {asked!r}: "
                "give another output_dir (or eval.generator) for this run"
            )


def check_prompts_fit(cfg: DictConfig, records: list[dict[str, Any]]) -> None:
    """Refuse the prompts that cannot fit the model's positions with decode.max_new_tokens (as the server refuses
    such a request), with their count, before the weights load: a prompt of millions of tokens would otherwise ask
    the decoder for a cache of terabytes. Skipping them instead would evaluate another set than the reference's."""
    from pasta.models import encode_prompt, load_tokenizer, max_positions

    num_positions = max_positions(cfg.model)
    if num_positions is None:
        return
    max_new_tokens = schema_from(cfg.decode, DecodeConfig, "decode").max_new_tokens
    tokenizer = load_tokenizer(cfg.model)
    over = []
    for number, record in enumerate(records, start=1):
        num_tokens = len(encode_prompt(tokenizer, record["instruction"], record.get("input", "")))
        if num_tokens + max_new_tokens > num_positions:
            over.append((number, num_tokens))
    if over:
        number, num_tokens = over[0]
        raise PastaError(
            f"eval_data {cfg.eval_data.name}: {len(over)} of {len(records)} prompts do not fit the model's "
            f"{num_positions} positions with decode.max_new_tokens={max_new_tokens} (the first: prompt {number}, "
            f"{num_tokens} tokens): shorten or remove them, or lower decode.max_new_tokens"
        )


def _stats_record(record: dict[str, Any], result: DecodeResult, batch_size: int, timed_alone: bool) -> dict[str, Any]:
    stats = result.stats.to_dict()
    return {"instruction": record["instruction"], "output": result.text, "annotated": result.annotated,
            "batch_size": batch_size, "timed_alone": timed_alone, **stats}


def _decode_into(out: JsonlAppender, cfg: DictConfig, ecfg: EvalConfig, mode: str, device: str,
                 records: list[dict[str, Any]], todo: list[dict[str, Any]], generator: str, model, tokenizer) -> None:
    """Decode `todo` into `out`."""
    log.info("%s: decoding %d of %d prompts (%s, timing=%s)", generator, len(todo), len(records), mode, ecfg.timing)
    timed = {r["instruction"] for r in timed_records(ecfg, records)}
    one_at_a_time = [r for r in todo if r["instruction"] in timed]
    batched = [r for r in todo if r["instruction"] not in timed]
    decoder = Decoder(cfg, ecfg, mode, model, tokenizer, beside_model(cfg, ecfg, device) if one_at_a_time else None)
    if one_at_a_time:
        for record in records[: ecfg.warmup_prompts]:
            (result,) = decoder([record])  # discarded: first-call allocations and kernel choices are not latency
            if decoder.replays:  # the sequential path warms up too
                decoder.replay(record, result)
            decoder.time_beside(record)
    with tqdm(total=len(todo), desc=f"decode {generator}") as bar:
        for record in one_at_a_time:
            _decode_one(out, decoder, record)
            bar.update(1)
        if batched:
            _decode_batched(out, decoder, batched, ecfg.batch_size, bar)


def _failed(records: list[dict[str, Any]], error: DecodeError) -> PastaError:
    instruction = records[error.failed_indices[0]]["instruction"]
    return PastaError(f"decoding the prompt {instruction[:80]!r} failed: {error}")


def _decode_one(out: JsonlAppender, decoder: Decoder, record: dict[str, Any]) -> None:
    """The prompt's answer, decoded alone, into `out`, with its replay and the sequential model's answer timed beside
    it; a failed decode stops the run naming the prompt (a rerun decodes it again)."""
    try:
        (result,) = decoder([record])
    except DecodeError as exc:
        raise _failed([record], exc) from None
    # An answer that forked nothing is already its plain text decoded one token per step: nothing to replay.
    replay = decoder.replay(record, result) if result.stats.num_threads > 0 and decoder.replays else {}
    out.append({**_stats_record(record, result, 1, timed_alone=True), **replay, **decoder.time_beside(record)})


def _decode_batched(out: JsonlAppender, decoder: Decoder, records: list[dict[str, Any]], batch_size: int,
                    bar: tqdm) -> None:
    """The prompts' answers into `out`, `batch_size` decoding at once and the next prompt joining as one ends
    (continuous batching), each written as it ends. A prompt whose decode failed ends alone: the others are
    written, then the run stops naming it (a rerun decodes it again)."""

    at_once = min(batch_size, len(records))

    def ended(i: int, result: DecodeResult) -> None:
        out.append(_stats_record(records[i], result, at_once, timed_alone=False))
        bar.update(1)

    try:
        decoder(records, max_batch=batch_size, on_result=ended)
    except DecodeError as exc:
        raise _failed(records, exc) from None


def beside_model(cfg: DictConfig, ecfg: EvalConfig, device: str):
    """eval.sequential_model loaded as the run's model would be from that folder, or None."""
    if ecfg.sequential_model is None:
        return None
    from pasta.models import load_model, model_at

    return load_model(model_at(cfg.model, ecfg.sequential_model), device=device, path_key="eval.sequential_model")


def _has_current_costs(path: Path) -> bool:
    """step_costs.json holds a cost model of this version (an older one is measured again)."""
    return path.is_file() and read_json(path, STEP_COSTS).get("version") == COST_MODEL_VERSION


def timed_records(ecfg: EvalConfig, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompts decoded one at a time: all of them under timing=wall, the first eval.timed_prompts else."""
    return records if ecfg.timing == Timing.wall else records[: ecfg.timed_prompts]


def process_counts(previous: Any, count: int) -> int | list[int]:
    """run.json's `num_processes` once a run with `count` processes has decoded into it."""
    counts = set(previous) if isinstance(previous, list) else {1 if previous is None else previous}
    counts.add(count)
    return count if counts == {count} else sorted(counts)


def generate_run(
    cfg: DictConfig, ecfg: EvalConfig, run_dir: Path, generator: str, processes: Processes | None = None
) -> Path:
    """Decode every evaluated prompt not yet in run_dir's stats.jsonl; write model_outputs.json; return its path.
    Every process of a launch calls this with its `processes` (default: this launch's)."""
    from pasta.config import resolve_device

    processes = processes or current_processes()
    mode = decode_mode(cfg)
    if mode == "async":
        decoding_policy(cfg.lang.reservation, cfg.model)  # a checkpoint trained with another policy: before loading
    records, instructions, _ = eval_prompts(cfg, ecfg.limit, ecfg.subset, ecfg.subset_seed)
    check_unique_instructions(records, f"eval_data {cfg.eval_data.name}")
    check_prompts_fit(cfg, records)
    num_outside = num_outside_heldout_pool(records, instructions)
    if num_outside:
        log.warning("%d of the %d prompts are outside the held-out pool (eval.subset=300 eval.subset_seed=0): a "
                    "model trained on data=alpaca_eval_gpt4* has seen them", num_outside, len(records))
    from pasta.models import load_model

    device = resolve_device(str(cfg.device))
    meta = {**_run_meta(cfg, ecfg, generator, mode, device, processes.count), "num_outside_heldout_pool": num_outside}
    previous = read_json(run_dir / RUN_META, "run.json") if (run_dir / RUN_META).is_file() else None
    if previous is not None:
        _check_resumable(run_dir, previous, meta)  # every process refuses alike, so none is left waiting below
    stats = ShardedJsonl(run_dir / STATS, processes, key="instruction")
    # Cuts a line a kill left half-written and folds in a killed launch's part files: their prompts are done.
    stats.gather()
    done = {r["instruction"] for r in read_stats(run_dir)} if (run_dir / STATS).is_file() else set()
    todo = [record for record in records if record["instruction"] not in done]
    # The main process of a sequential run measures the model's cost model, unless the run holds one of this version
    # already (a rerun with nothing left to decode measures a stale one again). Only a sequential run's is read:
    # eval.sequential prices both sides on it, so an asynchronous run's would be seconds to minutes spent unread.
    measure_costs = processes.is_main and mode == "sequential" and not _has_current_costs(run_dir / STEP_COSTS)
    mine = processes.shard(todo)
    # The model loads before anything is written: weights that do not load leave output_dir as it was.
    model, tokenizer = load_model(cfg.model, device=device) if mine or measure_costs else (None, None)
    run_dir.mkdir(parents=True, exist_ok=True)
    if processes.is_main and (previous is None or todo):
        if previous is not None:
            meta = {**previous, "num_processes": process_counts(previous.get("num_processes"), processes.count)}
        write_json_atomic(run_dir / RUN_META, meta)
    with stats.appender() as out:
        if mine:
            _decode_into(out, cfg, ecfg, mode, device, records, mine, generator, model, tokenizer)
    if measure_costs:
        from pasta.decoding.step_costs import measure_step_costs

        write_json_atomic(run_dir / STEP_COSTS, measure_step_costs(model).to_dict())
    del model
    stats.gather(order=[r["instruction"] for r in records])
    if processes.is_main:
        by_instruction = {r["instruction"]: r for r in read_stats(run_dir)}
        outputs = [
            {"instruction": r["instruction"], "output": by_instruction[r["instruction"]]["output"],
             "generator": generator, "dataset": r.get("dataset", str(cfg.eval_data.name))}
            for r in records
        ]
        write_json_atomic(run_dir / MODEL_OUTPUTS, outputs)
    return run_dir / MODEL_OUTPUTS
