"""Reports: the per-run summary, the gathered table and Pareto plot on fixture results, and the notebook."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pasta.config import compose
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation.formatting import paper_legend, quality_axis, run_markdown
from pasta.evaluation.report import report_rows
from pasta.evaluation.rows import headline, pareto_frontier

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "pareto.ipynb"


def test_pareto_frontier_of_hand_made_points():
    points = [(1.0, 50.0), (1.18, 51.3), (1.4, 44.0), (1.52, 46.0), (1.35, 38.5), (1.52, 45.0)]
    assert pareto_frontier(points) == [1, 3]
    assert pareto_frontier([(1.0, 1.0)]) == [0]
    # Equal points: one of them stands for both.
    assert len(pareto_frontier([(1.0, 1.0), (1.0, 1.0)])) == 1


def test_gathered_report_of_fixture_runs_has_table_plot_and_paper_points(tmp_path, capsys):
    cfg = compose("eval", [f"report={FIXTURES}/*", f"output_dir={tmp_path}"])
    result = evaluate(cfg)
    assert result["mode"] == "report"
    names = [row["name"] for row in result["report"]["runs"]]
    assert names == sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
    png = (tmp_path / "pareto.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    markdown = (tmp_path / "report.md").read_text()
    assert "| pasta-r1-lambda1-async | async | 46.00 ± 2.30 | raw | 1.52x | [1.41, 1.63] |" in markdown
    assert "paper (Gemma-7B, H100)" in markdown and "1.21x at +2.2" in markdown and "1.93x at -7.1" in markdown
    assert markdown in capsys.readouterr().out
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["warnings"] == [] and len(saved["runs"]) == 5


def test_explicit_list_of_runs_keeps_its_order(tmp_path):
    runs = [FIXTURES / "sot-smollm2-135m", FIXTURES / "baseline-sft-sequential"]
    cfg = compose("eval", [f"report=[{runs[0]},{runs[1]}]", f"output_dir={tmp_path}"])
    assert [row["name"] for row in evaluate(cfg)["report"]["runs"]] == ["sot-smollm2-135m", "baseline-sft-sequential"]


def test_runs_judged_differently_are_flagged_as_not_comparable(tmp_path):
    for name in ("baseline-sft-sequential", "sot-smollm2-135m"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    summary_path = tmp_path / "sot-smollm2-135m" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["quality"]["annotator"] = "openai:gpt-4o-mini"
    summary_path.write_text(json.dumps(summary))
    cfg = compose("eval", [f"report={tmp_path}/*", f"output_dir={tmp_path / 'report'}"])
    warnings = evaluate(cfg)["report"]["warnings"]
    assert any("different judges" in warning for warning in warnings)


def test_runs_decoded_on_other_prompt_subsets_are_flagged():
    summaries = [{"generator": "a", "eval_data": "alpaca_eval", "subset": {"size": 100, "seed": 0}},
                 {"generator": "b", "eval_data": "alpaca_eval", "subset": {"size": 100, "seed": 1}}]
    _, warnings = report_rows(summaries)
    assert any("different prompt subsets" in warning for warning in warnings)
    assert report_rows([summaries[0], {**summaries[1], "subset": summaries[0]["subset"]}])[1] == []


def test_runs_decoded_on_other_cpu_instruction_sets_are_flagged_and_an_unrecorded_one_matches():
    """Two hosts /proc/cpuinfo names alike ("AMD EPYC") differ in speed and rounding when one has AVX-512."""
    avx512 = {"generator": "a", "eval_data": "alpaca_eval", "device": "cpu: AMD EPYC, 2 threads",
              "cpu_capability": "AVX512"}
    avx2 = {**avx512, "generator": "b", "cpu_capability": "AVX2"}
    assert any("different CPU instruction sets (AVX2, AVX512)" in warning for warning in report_rows([avx512, avx2])[1])
    older = {key: value for key, value in avx2.items() if key != "cpu_capability"}  # a summary from before the key
    assert report_rows([avx512, older])[1] == []


def test_lc_win_rate_is_the_headline_when_official_and_raw_everywhere_when_mixed():
    lc = {"generator": "a", "quality": {"win_rate": 40.0, "length_controlled_winrate": 45.0, "lc_standard_error": 1.0}}
    raw = {"generator": "b", "quality": {"win_rate": 30.0, "standard_error": 2.0}}
    assert (headline(lc).win_rate, headline(lc).win_rate_kind) == (45.0, "LC")
    rows, warnings = report_rows([lc, raw])
    # The error bar is the raw win rate's too, not the LC one's.
    assert [(r.win_rate, r.win_rate_kind, r.win_rate_se) for r in rows] == [(40.0, "raw", None), (30.0, "raw", 2.0)]
    assert warnings


def test_the_headline_speedup_is_wall_clock_or_none_never_another_kind(tmp_path):
    """A run whose prompts were never decoded one at a time has a theoretical speedup only: its row shows no
    speedup, a warning names it, and the plot leaves it out rather than place it by another kind."""
    timed = json.loads((FIXTURES / "pasta-r1-lambda1-async" / "summary.json").read_text())
    untimed = {**timed, "generator": "untimed", "speed": {
        key: value for key, value in timed["speed"].items() if not key.startswith(("wall", "sequential_ms"))}}
    rows, warnings = report_rows([timed, untimed])
    assert rows[0].speedup.value == pytest.approx(1.52) and rows[0].to_dict()["speedup_kind"] == "wall"
    assert rows[1].speedup is None and rows[1].theoretical_speedup is not None
    assert any("no wall-clock speedup for untimed" in warning for warning in warnings)
    assert "Headline: raw win rate 46.00, no wall-clock speedup" in run_markdown(untimed)


def test_the_interval_columns_name_the_confidence_the_runs_were_resampled_at(tmp_path):
    """A run scored with eval.bootstrap.confidence=0.9 shows "90% CI", not the default's "95% CI"; runs at two
    confidences share a plain "CI" column and a warning."""
    for name in ("baseline-sft-sequential", "pasta-r1-lambda1-async"):  # the PASTA run last: its summary is kept
        shutil.copytree(FIXTURES / name, tmp_path / name)
        summary_path = tmp_path / name / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary["speed"]["bootstrap"] = {**summary["speed"].get("bootstrap", {}), "confidence": 0.9}
        summary_path.write_text(json.dumps(summary))
    summary["structure"] = {"num_answers": 5, "num_forked": 2, "fork_share": 0.4, "promises_per_answer": 1.0,
                            "malformed_per_answer": 0.0, "duplicate_topics_per_answer": 0.0, "num_chunks": 4,
                            "length_spearman": None, "length_mae": None, "num_overruns": 0}
    summary_path.write_text(json.dumps(summary))
    report = evaluate(compose("eval", [f"report={tmp_path}/*", f"output_dir={tmp_path / 'one'}"]))["report"]
    markdown = (tmp_path / "one" / "report.md").read_text()
    assert "| wall-clock speedup | 90% CI |" in markdown and "95% CI" not in markdown
    assert "cost-model speedup [90% CI]" in markdown and report["warnings"] == []
    assert "90% bootstrap interval" in run_markdown(summary)

    shutil.copytree(FIXTURES / "pasta-r1-lambda2-async", tmp_path / "pasta-r1-lambda2-async")  # resampled at 0.95
    report = evaluate(compose("eval", [f"report={tmp_path}/*", f"output_dir={tmp_path / 'two'}"]))["report"]
    markdown = (tmp_path / "two" / "report.md").read_text()
    assert "| wall-clock speedup | CI |" in markdown.splitlines()[0]
    assert any("different bootstrap confidences (0.9, 0.95)" in warning for warning in report["warnings"])


def test_the_plot_names_the_paper_points_lc_and_says_so_on_a_raw_win_rate_axis():
    lc = {"generator": "a", "speed": json.loads((FIXTURES / "pasta-r1-lambda1-async" / "summary.json").read_text())[
        "speed"], "quality": {"win_rate": 40.0, "length_controlled_winrate": 45.0, "reference": "baseline-sft"}}
    raw = {**lc, "quality": {"win_rate": 40.0, "reference": "baseline-sft"}}
    lc_axis, raw_axis = (quality_axis(report_rows([summary])[0])[0] for summary in (lc, raw))
    assert paper_legend(lc_axis) == "paper (Gemma-7B, H100): LC win rate vs its Baseline-SFT"
    assert paper_legend(raw_axis) == "paper (Gemma-7B, H100): LC win rate vs its Baseline-SFT (not this axis' metric)"


def test_report_glob_matching_nothing_is_a_clear_error(tmp_path):
    cfg = compose("eval", [f"report={tmp_path}/none-*", f"output_dir={tmp_path / 'report'}"])
    with pytest.raises(PastaError, match="matches no scored run"):
        evaluate(cfg)


def test_run_markdown_states_missing_speed_and_lc_plainly():
    summary = json.loads((FIXTURES / "sot-smollm2-135m" / "summary.json").read_text())
    text = run_markdown({**summary, "speed": None})
    assert "- no per-prompt stats" in text
    assert "no length-controlled win rate: the evaluation set is not" in text


@pytest.mark.timeout(300)
def test_pareto_notebook_executes_headless_on_fixture_results(tmp_path, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv("PASTA_REPORT_RUNS", f"{FIXTURES}/*")
    monkeypatch.setenv("PASTA_REPORT_OUT", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.get("output_type") == "error"]
    text = "".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")
    assert "frontier: pasta-r1-lambda8-async, pasta-r1-lambda1-async" in text
    assert any("image/png" in out.get("data", {}) for out in outputs)
    assert (tmp_path / "pareto_notebook.png").read_bytes().startswith(b"\x89PNG")


def test_the_plot_measures_quality_by_the_embedding_proxy_and_says_so_when_the_runs_have_no_win_rate():
    from pasta.evaluation.formatting import quality_axis
    from pasta.evaluation.rows import ReportRow
    from pasta.evaluation.speed import Interval

    def row(name, win_rate, similarity, speedup=Interval(1.3, 1.1, 1.5)):
        return ReportRow(name=name, decode="async", win_rate=win_rate, win_rate_kind="raw", win_rate_se=None,
                         raw_win_rate=win_rate, raw_win_rate_se=None, lc_offline_estimate=None, speedup=speedup, theoretical_speedup=1.2,
                         ms_per_token=10.0, num_prompts=8, num_with_threads=3, annotator=None,
                         reference="baseline-sft", device="cpu", eval_data="sample", subset=None,
                         proxy_similarity=similarity, proxy_model="all-MiniLM-L6-v2", proxy_reference="GPT-4")
    label, quality = quality_axis([row("a", None, 0.61), row("b", None, 0.58)])
    assert "proxy" in label and "all-MiniLM-L6-v2" in label and "GPT-4" in label
    assert quality(row("a", None, 0.61)) == 0.61
    label, quality = quality_axis([row("a", 52.0, 0.61), row("b", 48.0, 0.58)])
    assert label.startswith("raw win rate") and quality(row("a", 52.0, 0.61)) == 52.0
