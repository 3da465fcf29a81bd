"""Score one evaluated run: quality (pasta.evaluation.quality), speed (pasta.evaluation.speed), structure
(pasta.evaluation.structure), quality proxies (pasta.evaluation.proxies), and its summary.

    python -m pasta.eval eval.mode=score output_dir=outputs/eval/sft-async eval.reference=outputs/eval/base-seq \
        eval.sequential=outputs/eval/base-seq
    python -m pasta.eval eval.annotations=PATH/annotations.json output_dir=outputs/eval/rescored

The evaluated prompts are eval_data's (pasta.evaluation.eval_set: eval.subset, then eval.limit). The run's outputs
must answer every one of them and come from the run's own model; the reference and the sequential run must cover
them; otherwise one line says which file lacks what.
"""

from __future__ import annotations

import datetime
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from pasta.data import write_json_atomic, write_text_atomic
from pasta.errors import PastaError
from pasta.evaluation import quality as quality_lib
from pasta.evaluation.config import EvalConfig
from pasta.evaluation.degenerate import DegenerateCounts, count_degenerate
from pasta.evaluation.eval_set import ALPACA_EVAL_SIZE, check_same_subset, eval_prompts, subset_meta
from pasta.evaluation.proxies import QualityProxies, run_proxies
from pasta.evaluation.report import write_run_summary
from pasta.evaluation.run_files import (
    ANNOTATIONS,
    LEADERBOARD,
    MODEL_OUTPUTS,
    QUALITY,
    RUN_META,
    SPEED,
    STATS,
    check_covers,
    check_known,
    load_model_outputs,
    machine,
    outputs_path,
    read_run_meta,
    read_stats,
    read_step_costs,
    same_machine,
)
from pasta.evaluation.speed import SpeedSummary, speed_metrics
from pasta.evaluation.structure import run_dir_structure, student_tokenizer

log = logging.getLogger(__name__)


def _reference_outputs(ecfg: EvalConfig, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if ecfg.reference is None:
        return [{key: record[key] for key in ("instruction", "output", "generator", "dataset")} for record in records]
    path = Path(ecfg.reference)
    meta = read_run_meta(path) if path.is_dir() and (path / RUN_META).is_file() else {}
    return load_model_outputs(path, expected_generator=meta.get("generator"))


def _write_quality(results_dir: Path, metrics: dict[str, Any], annotations: pd.DataFrame | None) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    if annotations is not None:
        write_json_atomic(results_dir / ANNOTATIONS, annotations.to_dict(orient="records"))
    buffer = io.StringIO()
    pd.DataFrame([metrics]).set_index("generator").to_csv(buffer)
    write_text_atomic(results_dir / LEADERBOARD, buffer.getvalue())
    write_json_atomic(results_dir / QUALITY, metrics)


def _comparable(metrics: dict[str, Any]) -> bool:
    return (
        metrics.get("annotator") == quality_lib.LEADERBOARD_ANNOTATOR
        and metrics.get("reference") == quality_lib.LEADERBOARD_REFERENCE
        and metrics.get("n_total") == ALPACA_EVAL_SIZE
        and metrics.get("lc_method") == "alpaca_eval length_controlled_v1"
    )


def checked_sequential(ecfg: EvalConfig, run_dir: Path, meta: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """eval.sequential's run directory and run.json, refused unless speedups against it mean something: a
    sequential run, on the same machine, with as many processes. Checked before any judging. Wall-clock speedups
    come from the prompts both runs decoded one at a time (pasta.evaluation.speed)."""
    if ecfg.sequential is None or not (run_dir / STATS).is_file():
        return None  # no speed to compare (_speed says so when eval.sequential is set)
    sequential_dir = Path(ecfg.sequential)
    sequential_meta = read_run_meta(sequential_dir)
    if sequential_meta.get("decode") != "sequential":
        raise PastaError(
            f"eval.sequential={sequential_dir} was decoded with decode={sequential_meta.get('decode')}, "
            "not sequential: give Baseline-SFT's sequential run"
        )
    if not same_machine(sequential_meta, meta):
        raise PastaError(
            f"wall-clock speedups need both runs on one machine: {sequential_dir} ran on "
            f"{machine(sequential_meta)!r}, {run_dir} on {machine(meta)!r}"
        )
    counts = [run_meta.get("num_processes", 1) for run_meta in (sequential_meta, meta)]
    if counts[0] != counts[1]:
        raise PastaError(
            f"wall-clock speedups need both runs decoded with as many processes (each shares the machine): "
            f"{sequential_dir} used {counts[0]}, {run_dir} {counts[1]}"
        )
    return sequential_dir, sequential_meta


def _degenerate(run_dir: Path, instructions: list[str]) -> DegenerateCounts | None:
    """Loops, budget cuts and looping promise lists among the run's answers (None without per-prompt stats)."""
    if not (run_dir / STATS).is_file():
        return None
    wanted = set(instructions)
    return count_degenerate(record for record in read_stats(run_dir) if record["instruction"] in wanted)


def _speed(
    ecfg: EvalConfig, run_dir: Path, instructions: list[str], sequential_run: tuple[Path, dict[str, Any]] | None
) -> SpeedSummary | None:
    if not (run_dir / STATS).is_file():
        if ecfg.sequential is not None:
            raise PastaError(f"eval.sequential is set but {run_dir / STATS} does not exist: nothing to compare")
        return None
    wanted = set(instructions)
    stats = [record for record in read_stats(run_dir) if record["instruction"] in wanted]
    check_covers(stats, instructions, str(run_dir / STATS))
    sequential = None
    sequential_name = "sequential"
    costs = None
    if sequential_run is not None:
        sequential_dir, sequential_meta = sequential_run
        sequential = read_stats(sequential_dir)
        sequential_name = sequential_meta.get("generator", str(sequential_dir))
        costs = read_step_costs(sequential_dir)
    return speed_metrics(stats, sequential, sequential_name=sequential_name, bootstrap=ecfg.bootstrap, costs=costs)


def run_dir_length(run_dir: Path, meta: dict[str, Any], instructions: list[str], model_cfg: DictConfig,
                   sequential_run: tuple[Path, dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Where the run's tokens and steps go (pasta.evaluation.length), beside Baseline-SFT's answers when the
    sequential run is given; None without stats."""
    from pasta.evaluation.length import run_length
    from pasta.lang import add_tag_tokens

    if not (run_dir / STATS).is_file():
        return None
    wanted = set(instructions)
    stats = [record for record in read_stats(run_dir) if record["instruction"] in wanted]
    baseline = None
    if sequential_run is not None:
        baseline = {record["instruction"]: record for record in read_stats(sequential_run[0])}
    try:
        tokenizer = student_tokenizer(model_cfg, meta.get("model"))
    except PastaError as exc:  # a diagnostic table: the rest of the summary stands without it
        log.warning("no token decomposition for %s: %s", run_dir, exc)
        return None
    add_tag_tokens(tokenizer)  # a sequential run's plain model has none; plain text tokenizes the same with them
    return run_length(stats, tokenizer, baseline)


@dataclass
class _ScoredQuality:
    """The quality side of a scored run: its metrics, and what the rest of the scoring needs from it."""

    generator: str
    metrics: dict[str, Any]  # quality.json
    instructions: list[str]  # the scored prompts
    annotations: pd.DataFrame | None  # written beside quality.json; None when a saved file was re-scored
    proxies: QualityProxies | None


def score_run(cfg: DictConfig, ecfg: EvalConfig, run_dir: Path) -> dict[str, Any]:
    """Score the run in `run_dir` (or saved annotations, eval.annotations) and write its summary; returns it."""
    records, all_instructions, positions = eval_prompts(cfg, ecfg.limit, ecfg.subset, ecfg.subset_seed)
    metric_fn = quality_lib.make_metric_fn(positions, ecfg.length_controlled)
    meta = read_run_meta(run_dir) if (run_dir / RUN_META).is_file() else {}
    if meta:
        check_same_subset(meta, ecfg.subset, ecfg.subset_seed, run_dir)
    sequential_run = checked_sequential(ecfg, run_dir, meta)
    if ecfg.annotations is not None:
        scored = _rescored_quality(ecfg, all_instructions, metric_fn)
        if meta.get("generator") not in (None, scored.generator):  # its speed and structure are another model's
            raise PastaError(f"eval.annotations judge {scored.generator!r}, but {run_dir} holds a run of "
                             f"{meta['generator']!r}: score them into another output_dir (by default, one named "
                             "after the annotations' model)")
    else:
        scored = _judged_quality(cfg, ecfg, run_dir, meta, records, all_instructions, metric_fn)
    metrics = scored.metrics
    metrics["generator"] = scored.generator
    metrics["comparable_with_leaderboard"] = _comparable(metrics)
    if metrics.get("annotator") is not None:
        _write_quality(run_dir / quality_lib.annotator_slug(metrics["annotator"]), metrics, scored.annotations)
    speed = _speed(ecfg, run_dir, scored.instructions, sequential_run)
    if speed is not None:
        write_json_atomic(run_dir / SPEED, speed.to_dict())
    structure = run_dir_structure(run_dir, meta, scored.instructions, cfg.model, cfg.lang)
    degenerate = _degenerate(run_dir, scored.instructions)
    length = run_dir_length(run_dir, meta, scored.instructions, cfg.model, sequential_run)
    summary = {
        "generator": scored.generator,
        "model": meta.get("model"),
        "decode": meta.get("decode"),
        "timing": meta.get("timing"),
        "device": meta.get("device"),
        "cpu_capability": meta.get("cpu_capability"),
        "eval_data": cfg.eval_data.name,
        "subset": subset_meta(ecfg.subset, ecfg.subset_seed),
        "num_prompts": len(scored.instructions),
        "quality": metrics,
        "speed": None if speed is None else speed.to_dict(),
        "structure": None if structure is None else structure.to_dict(),
        "length": length,
        "degenerate": None if degenerate is None else degenerate.to_dict(),
        "proxies": None if scored.proxies is None else scored.proxies.to_dict(),
        "scored_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_run_summary(run_dir, summary)
    log.info("scored %s: win rate %.2f", scored.generator, metrics["win_rate"] or float("nan"))
    return summary


def _rescored_quality(ecfg: EvalConfig, all_instructions: list[str], metric_fn: Callable) -> _ScoredQuality:
    """eval.annotations: saved verdicts re-scored; no judge is called and nothing new is computed."""
    metrics, annotations = quality_lib.rescore_annotations(Path(ecfg.annotations), metric_fn)
    metrics["reference"] = str(annotations["generator_1"].iloc[0])
    metrics["annotations"] = str(ecfg.annotations)
    instructions = list(annotations["instruction"])
    check_known([{"instruction": i} for i in instructions], all_instructions, str(ecfg.annotations))
    # The user's file stays where it is (quality.json names it), so no annotations are written.
    return _ScoredQuality(str(annotations["generator_2"].iloc[0]), metrics, instructions, None, None)


def _judged_quality(
    cfg: DictConfig,
    ecfg: EvalConfig,
    run_dir: Path,
    meta: dict[str, Any],
    records: list[dict[str, Any]],
    all_instructions: list[str],
    metric_fn: Callable,
) -> _ScoredQuality:
    """The run's outputs judged against the reference's (an alpaca_eval annotator or a pasta judge), and proxies."""
    outputs_file = outputs_path(Path(ecfg.outputs)) if ecfg.outputs else run_dir / MODEL_OUTPUTS
    if not outputs_file.is_file() and ecfg.outputs is None:
        raise PastaError(f"{outputs_file} not found: generate first (eval.mode=generate) or give eval.outputs=PATH")
    model_outputs = load_model_outputs(outputs_file, expected_generator=None if ecfg.outputs else meta.get("generator"))
    check_known(model_outputs, all_instructions, str(outputs_file))
    instructions = [record["instruction"] for record in records]
    check_covers(model_outputs, instructions, str(outputs_file))
    wanted = set(instructions)
    model_outputs = [record for record in model_outputs if record["instruction"] in wanted]
    references = _reference_outputs(ecfg, records)
    check_covers(references, instructions, f"reference {ecfg.reference or cfg.eval_data.name}")
    references = [record for record in references if record["instruction"] in wanted]
    generator = model_outputs[0]["generator"]
    proxies = run_proxies(model_outputs, records, ecfg.sequential)
    if not ecfg.win_rate:
        metrics = {"annotator": None, "win_rate": None, "reference": references[0]["generator"],
                   "outputs": str(outputs_file), "not_judged": "eval.win_rate=false: offline proxies only"}
        return _ScoredQuality(generator, metrics, instructions, None, proxies)
    judge, settings = None, None
    if ecfg.annotators_config is None:
        from pasta.evaluation.judge_annotator import judge_settings
        from pasta.judges import build_judge

        judge, settings = build_judge(cfg.judge), judge_settings(cfg.judge)
    name = ecfg.annotators_config or judge.name
    metrics, annotation_records = quality_lib.evaluate_outputs(
        model_outputs, references, results_dir=run_dir / quality_lib.annotator_slug(name), metric_fn=metric_fn,
        annotators_config=ecfg.annotators_config, judge=judge, chunk_size=ecfg.judge_chunk_size,
        judge_settings=settings,
    )
    metrics["reference"] = references[0]["generator"]
    metrics["outputs"] = str(outputs_file)
    return _ScoredQuality(generator, metrics, instructions, pd.DataFrame(annotation_records), proxies)
