"""One evaluated run as a row of the report: its headline numbers (`headline`, from its summary.json), the Pareto
frontier over the rows, and the paper's two end points they are drawn against. pasta.evaluation.report gathers the
rows, pasta.evaluation.formatting draws them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pasta.evaluation.speed import Interval, SpeedSummary

# The paper's end points (arXiv 2502.11517): LC win rate against Baseline-SFT, 50 = parity.
PAPER_POINTS = ({"speedup": 1.21, "win_rate": 52.2}, {"speedup": 1.93, "win_rate": 42.9})
PAPER_LABEL = "paper (Gemma-7B, H100)"


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


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (higher is better), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    frontier, best_y = [], -math.inf
    for index in order:
        if points[index][1] > best_y:
            frontier.append(index)
            best_y = points[index][1]
    return sorted(frontier, key=lambda i: points[i][0])
