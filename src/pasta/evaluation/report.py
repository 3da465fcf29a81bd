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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pasta.data import write_json_atomic, write_text_atomic
from pasta.errors import PastaError
from pasta.evaluation.formatting import (
    length_markdown,
    plot_pareto,
    proxies_markdown,
    report_markdown,
    run_markdown,
    structure_markdown,
)
from pasta.evaluation.rows import PAPER_LABEL, PAPER_POINTS, ReportRow, headline
from pasta.evaluation.run_files import SUMMARY_JSON, SUMMARY_MD, read_json
from pasta.evaluation.speed import Interval, SpeedSummary

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PARETO_PNG = "pareto.png"


# ------------------------------------------------------------------------------------------------- one run


def write_run_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json and summary.md in `run_dir`, each written atomically."""
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
