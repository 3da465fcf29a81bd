"""Gathering evaluated runs: one run's summary files, and the runs of a report as typed table rows.

    python -m pasta.eval report=[outputs/eval/sft-async,outputs/eval/baseline-sequential]
    python -m pasta.eval report='outputs/eval/*' output_dir=outputs/eval/report

The gathered report writes report.json, report.md (also printed) and pareto.png (pasta.evaluation.formatting draws
and writes them): the wall-clock speedup (geometric mean of per-prompt wall-clock speedups against the sequential
run) against win rate, with the Pareto frontier of the runs and the paper's two published end points for reference
(PASTA on Gemma-7B, H100, against Baseline-SFT: 1.21x at +2.2 LC win rate, 1.93x at -7.1). The headline speedup of
a run is its wall-clock speedup or nothing (`SpeedSummary.headline`): a run without one is named in a warning and
left off the plot, never placed by another kind of speedup. Below the main table, for the runs whose summaries
have them: the structure table (pasta.evaluation.structure: forks, promises, malformed output, predicted vs actual
chunk lengths, overruns, every kind of speedup in its own column) and the quality guards
(pasta.evaluation.proxies), every guard labelled "(proxy)".
"""

from __future__ import annotations

import dataclasses
import glob
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pasta.data import write_json_atomic, write_text_atomic
from pasta.errors import PastaError
from pasta.evaluation.run_files import SUMMARY_JSON, SUMMARY_MD, read_json
from pasta.evaluation.speed import Interval, SpeedSummary

# The paper's end points (arXiv 2502.11517): LC win rate against Baseline-SFT, 50 = parity.
PAPER_POINTS = ({"speedup": 1.21, "win_rate": 52.2}, {"speedup": 1.93, "win_rate": 42.9})
PAPER_LABEL = "paper (Gemma-7B, H100)"

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PARETO_PNG = "pareto.png"


# ------------------------------------------------------------------------------------------------- one run


@dataclass
class ReportRow:
    """One run in the gathered table: its win rate (LC when official) and its headline (wall-clock) speedup."""

    name: str | None
    decode: str | None
    win_rate: float | None
    win_rate_kind: str  # LC | raw
    win_rate_se: float | None
    raw_win_rate: float | None
    raw_win_rate_se: float | None
    lc_offline_estimate: float | None
    speedup: Interval | None  # the wall-clock speedup against the sequential run; None when not measured
    theoretical_speedup: float | None
    ms_per_token: float | None
    num_prompts: int | None
    num_with_threads: int | None
    annotator: str | None
    reference: str | None
    device: str | None
    eval_data: str | None
    subset: Any
    run_dir: str | None = None
    cpu_capability: str | None = None  # the CPU's vector instruction set (AVX512, AVX2); None on a GPU or unrecorded
    # The embedding-similarity quality proxy (pasta.evaluation.proxies): the plot's quality axis where the runs have
    # no win rate (eval.win_rate=false, the offline runs whose judges do not discriminate).
    proxy_similarity: float | None = None
    proxy_model: str | None = None
    proxy_reference: str | None = None
    ms_per_token_batched: bool = False  # from batch wall times: no answer of the run was timed alone
    confidence: float | None = None  # the bootstrap intervals' coverage (eval.bootstrap.confidence); None: no speed

    def to_dict(self) -> dict[str, Any]:
        """report.json's row: the fields, with the speedup as a value and its interval."""
        record = dataclasses.asdict(self)
        speedup = record.pop("speedup")
        return {**record, "speedup": None if speedup is None else speedup["value"],
                "speedup_ci": None if speedup is None else [speedup["ci_low"], speedup["ci_high"]],
                "speedup_kind": None if speedup is None else "wall"}


def headline(summary: dict[str, Any]) -> ReportRow:
    """The numbers a table row shows for one run summary (summary.json)."""
    quality = summary.get("quality") or {}
    proxies = summary.get("proxies") or {}
    speed = SpeedSummary.from_dict(summary["speed"]) if summary.get("speed") else None
    if quality.get("length_controlled_winrate") is not None:
        win_rate, win_rate_kind, win_rate_se = (
            quality["length_controlled_winrate"], "LC", quality.get("lc_standard_error"))
    else:
        win_rate, win_rate_kind, win_rate_se = quality.get("win_rate"), "raw", quality.get("standard_error")
    return ReportRow(
        name=summary.get("generator"), decode=summary.get("decode"), win_rate=win_rate, win_rate_kind=win_rate_kind,
        win_rate_se=win_rate_se, raw_win_rate=quality.get("win_rate"), raw_win_rate_se=quality.get("standard_error"),
        lc_offline_estimate=quality.get("lc_winrate_offline_estimate"),
        speedup=None if speed is None else speed.headline,
        theoretical_speedup=None if speed is None else speed.theoretical_speedup_geomean.value,
        ms_per_token=None if speed is None else speed.ms_per_token_median,
        ms_per_token_batched=speed is not None and speed.ms_per_token_batched,
        num_prompts=summary.get("num_prompts"), num_with_threads=None if speed is None else speed.num_with_threads,
        annotator=quality.get("annotator"), reference=quality.get("reference"), device=summary.get("device"),
        eval_data=summary.get("eval_data"), subset=summary.get("subset"), run_dir=summary.get("run_dir"),
        cpu_capability=summary.get("cpu_capability"),
        proxy_similarity=proxies.get("embedding_similarity"), proxy_model=proxies.get("embedding_model"),
        proxy_reference=proxies.get("reference"), confidence=None if speed is None else speed.bootstrap.confidence,
    )


def write_run_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json and summary.md in `run_dir`, each written atomically."""
    from pasta.evaluation.formatting import run_markdown

    write_json_atomic(run_dir / SUMMARY_JSON, summary)
    write_text_atomic(run_dir / SUMMARY_MD, run_markdown(summary))


# ------------------------------------------------------------------------------------------------- gathering


def expand_runs(patterns: Sequence[str]) -> list[Path]:
    """Run directories from paths and globs, in the given order (each glob sorted), without repeats."""
    runs: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if not glob.has_magic(pattern) or (Path(m) / SUMMARY_JSON).is_file()]
        if not matches:
            raise PastaError(f"report: {pattern!r} matches no scored run (a folder with {SUMMARY_JSON})")
        for match in matches:
            path = Path(match)
            if path not in runs:
                runs.append(path)
    return runs


def load_summaries(patterns: Sequence[str]) -> list[dict[str, Any]]:
    """The summary.json of each run directory (paths or globs); a folder without one is an error naming it."""
    summaries = []
    for run_dir in expand_runs(patterns):
        if not run_dir.is_dir():
            raise PastaError(f"report: run directory not found: {run_dir}")
        summary = read_json(run_dir / SUMMARY_JSON, f"{SUMMARY_JSON} of {run_dir} (score it first: eval.mode=score)")
        summary["run_dir"] = str(run_dir)
        summaries.append(summary)
    return summaries


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (higher is better), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    frontier, best_y = [], -math.inf
    for index in order:
        if points[index][1] > best_y:
            frontier.append(index)
            best_y = points[index][1]
    return sorted(frontier, key=lambda i: points[i][0])


def report_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[ReportRow], list[str]]:
    """Table rows and warnings about what makes the runs incomparable (other judges, references, devices, prompts)
    or leaves a run off the speed axis (no wall-clock speedup)."""
    rows = [headline(summary) for summary in summaries]
    warnings = []
    for key, what in (("annotator", "judges"), ("reference", "references"), ("device", "devices"),
                      ("cpu_capability", "CPU instruction sets"),
                      ("eval_data", "eval sets"), ("subset", "prompt subsets (eval.subset)"),
                      ("confidence", "bootstrap confidences")):
        values = sorted({str(getattr(row, key)) for row in rows if getattr(row, key) is not None})
        if len(values) > 1:
            warnings.append(f"the runs use different {what} ({', '.join(values)}): their numbers are not comparable")
    kinds = {row.win_rate_kind for row in rows if row.win_rate is not None}
    if len(kinds) > 1:
        # One axis, one metric: fall back to the raw win rate everywhere.
        for row in rows:
            row.win_rate, row.win_rate_kind, row.win_rate_se = row.raw_win_rate, "raw", row.raw_win_rate_se
        warnings.append("some runs have no LC win rate: the table and plot use the raw win rate for all")
    unmeasured = [str(row.name) for row in rows
                  if row.speedup is None and row.theoretical_speedup is not None and row.decode != "sequential"]
    if unmeasured:
        warnings.append(f"no wall-clock speedup for {', '.join(unmeasured)} (give eval.sequential=RUN_DIR and "
                        "decode prompts one at a time: eval.timing=wall or eval.timed_prompts=N): shown as '-' "
                        "and left off the plot; their other speedups are in the structure table")
    return rows, warnings


# ------------------------------------------------------------------------------------------------- structure, proxies


def structure_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The structure table: each run with a structure record, its theoretical and wall-clock speedups beside it."""
    rows = []
    for summary in summaries:
        if not summary.get("structure"):
            continue
        speed = SpeedSummary.from_dict(summary["speed"]) if summary.get("speed") else None

        def interval(value: Interval | None) -> dict[str, float] | None:
            return None if value is None else dataclasses.asdict(value)

        rows.append({
            "name": summary.get("generator"), "decode": summary.get("decode"), **summary["structure"],
            "theoretical_speedup": None if speed is None else speed.theoretical_speedup_geomean.value,
            "step_speedup": None if speed is None or speed.step_speedup_geomean is None
            else speed.step_speedup_geomean.value,
            "cost_speedup": None if speed is None else interval(speed.cost_speedup_geomean),
            "wall_speedup": None if speed is None else interval(speed.wall_speedup_geomean),
            "num_timed_prompts": None if speed is None else speed.num_timed_prompts,
            "cost_speedup_timed": None if speed is None else speed.cost_speedup_timed_geomean,
            "sequential_run": None if speed is None else speed.sequential_run,
            "parallelism": None if speed is None else interval(speed.parallelism_geomean),
            "parallelism_forked": None if speed is None else speed.parallelism_forked_geomean,
            "degenerate": summary.get("degenerate"),
            "confidence": None if speed is None else speed.bootstrap.confidence,
        })
    return rows


def length_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tokens-and-steps table: each run's groups (all, forked, plain answers) with a length record."""
    return [{"name": summary.get("generator"), **group}
            for summary in summaries for group in summary.get("length") or []]


def proxy_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The quality-guard table: each run with a proxies record."""
    return [{"name": summary.get("generator"), **summary["proxies"]} for summary in summaries if summary.get("proxies")]


def gather(patterns: Sequence[str], output_dir: Path) -> dict[str, Any]:
    """Gather the runs into output_dir: report.json, report.md and pareto.png; returns the report."""
    from pasta.evaluation.formatting import (
        length_markdown,
        plot_pareto,
        proxies_markdown,
        report_markdown,
        structure_markdown,
    )

    summaries = load_summaries(patterns)
    rows, warnings = report_rows(summaries)
    structure, proxies, length = structure_rows(summaries), proxy_rows(summaries), length_rows(summaries)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {"runs": [row.to_dict() for row in rows], "warnings": warnings, "paper_points": list(PAPER_POINTS),
              "paper_label": PAPER_LABEL, "structure": structure, "proxies": proxies, "length": length}
    write_json_atomic(output_dir / REPORT_JSON, report)
    markdown = report_markdown(rows, warnings)
    if structure:
        markdown += "\n" + structure_markdown(structure)
    if length:
        markdown += "\n" + length_markdown(length)
    if proxies:
        markdown += "\n" + proxies_markdown(proxies)
    write_text_atomic(output_dir / REPORT_MD, markdown)
    plot_pareto(rows, output_dir / PARETO_PNG)
    report["markdown"] = markdown
    return report
