"""scripts/study_plot.py: each lambda's line runs from the SFT model through its rounds, at the speedups and the
proxy that the runs' summary.json files record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.scripts import load_script
from pasta.errors import PastaError


def summary(name: str, decode: str, theoretical: float, cost: float | None, proxy: float) -> dict:
    speed = {"theoretical_speedup_geomean": {"value": theoretical, "ci_low": theoretical, "ci_high": theoretical}}
    if cost is not None:
        speed["cost_speedup_geomean"] = {"value": cost, "ci_low": cost - 0.1, "ci_high": cost + 0.1}
        speed["step_speedup_geomean"] = {"value": cost + 0.2, "ci_low": cost, "ci_high": cost + 0.3}
        speed["wall_speedup_geomean"] = {"value": cost - 0.01, "ci_low": cost - 0.2, "ci_high": cost + 0.2}
        speed["num_timed_prompts"] = 20
    return {
        "generator": name, "decode": decode, "speed": speed,
        "structure": {"fork_share": 0.4, "malformed_per_answer": 0.0, "duplicate_topics_per_answer": 0.0},
        "proxies": {"embedding_similarity": proxy, "distinct_2": 0.5, "length_ratio": None if cost is None else 1.1},
    }


def write_runs(eval_dir: Path, confidence: float | None = None) -> None:
    runs = [
        summary("baseline-sft", "sequential", 1.0, None, 0.58),
        summary("pasta-sft", "async", 1.24, 0.98, 0.60),
        summary("pasta-lambda1-round2", "async", 1.41, 0.88, 0.59),
        summary("pasta-lambda1-round1", "async", 1.32, 0.83, 0.599),
    ]
    for run in runs:
        if confidence is not None:  # as eval.bootstrap.confidence records it; older summaries have no record
            run["speed"]["bootstrap"] = {"num_resamples": 100, "confidence": confidence, "seed": 0}
        (eval_dir / run["generator"]).mkdir(parents=True)
        (eval_dir / run["generator"] / "summary.json").write_text(json.dumps(run))


def test_each_lambda_line_starts_at_sft_and_follows_its_rounds_at_the_recorded_speedups(tmp_path, capsys):
    study_plot = load_script("study_plot")
    write_runs(tmp_path / "eval")
    assert study_plot.main([str(tmp_path / "eval"), str(tmp_path / "study.png")]) == 0
    assert (tmp_path / "study.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert ("| pasta-lambda1-round2 | 40% | 0.00 | 1.41x | 1.08x | 0.88x [0.78, 0.98] | 0.87x [0.68, 1.08] | 0.590 "
            "| 0.500 | 1.10 |") in table
    assert "| baseline-sft | 40% | 0.00 | 1.00x | 1.00x | 1.00x [1.00, 1.00] | 1.00x [1.00, 1.00] |" in table
    assert "measured wall-clock speedup, 20 prompts [95% CI]" in table
    points = study_plot.load_points(tmp_path / "eval")
    line = study_plot.sweep_lines(points)["1"]
    assert [(p["name"], p["theoretical"], p["cost"]["value"]) for p in line] == [
        ("pasta-sft", 1.24, 0.98), ("pasta-lambda1-round1", 1.32, 0.83), ("pasta-lambda1-round2", 1.41, 0.88)]


def test_the_table_names_the_confidence_the_runs_were_resampled_at(tmp_path, capsys):
    study_plot = load_script("study_plot")
    write_runs(tmp_path / "eval", confidence=0.9)
    assert study_plot.main([str(tmp_path / "eval"), str(tmp_path / "study.png")]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "cost-model speedup [90% CI]" in header and "20 prompts [90% CI]" in header


def test_an_eval_folder_without_the_sft_run_is_refused(tmp_path):
    study_plot = load_script("study_plot")
    write_runs(tmp_path / "eval")
    (tmp_path / "eval" / "pasta-sft" / "summary.json").unlink()
    with pytest.raises(PastaError, match="holds no pasta-sft run"):
        study_plot.main([str(tmp_path / "eval"), str(tmp_path / "study.png")])


def test_runs_are_named_by_their_folder_so_runs_decoded_elsewhere_plot_when_linked_under_the_studys_names(
        tmp_path, capsys):
    study_plot = load_script("study_plot")
    write_runs(tmp_path / "decoded")
    (tmp_path / "eval").mkdir()
    for link, run in (("pasta-sft", "pasta-sft"), ("pasta-lambda4-round1", "pasta-lambda1-round1")):
        (tmp_path / "eval" / link).symlink_to(tmp_path / "decoded" / run)
    assert study_plot.main([str(tmp_path / "eval"), str(tmp_path / "study.png")]) == 0
    assert "| pasta-lambda4-round1 | 40% | 0.00 | 1.32x |" in capsys.readouterr().out
    points = study_plot.load_points(tmp_path / "eval")
    assert {lam: [p["name"] for p in line] for lam, line in study_plot.sweep_lines(points).items()} == {
        "4": ["pasta-sft", "pasta-lambda4-round1"]}


def test_sweep_lines_are_in_lambdas_order_and_a_lambda_may_hold_a_minus():
    study_plot = load_script("study_plot")
    names = ["pasta-sft", *(f"pasta-lambda{lam}-round1" for lam in ("inf", "10", "4", "1e-3"))]
    points = {name: study_plot.point({"run_dir": f"/runs/{name}", "decode": "async"}) for name in names}
    assert list(study_plot.sweep_lines(points)) == ["1e-3", "4", "10", "inf"]


def test_a_line_of_the_last_round_only_labels_its_points_by_their_rounds(tmp_path):
    """The study decodes each lambda's last round only: the line is r0 (SFT) and r2, not r0 and r1."""
    study_plot = load_script("study_plot")
    write_runs(tmp_path / "decoded")
    (tmp_path / "eval").mkdir()
    for run in ("pasta-sft", "pasta-lambda1-round2"):
        (tmp_path / "eval" / run).symlink_to(tmp_path / "decoded" / run)
    line = study_plot.sweep_lines(study_plot.load_points(tmp_path / "eval"))["1"]
    assert [p["round"] for p in line] == [0, 2]
