"""Summaries of evaluated runs: one per run (summary.json, summary.md), and a gathered table with a Pareto plot.

    python -m pasta.eval report=[outputs/eval/sft-async,outputs/eval/baseline-sequential]
    python -m pasta.eval report='outputs/eval/*' output_dir=outputs/eval/report

The gathered report writes report.json, report.md (also printed) and pareto.png: speedup (geometric mean of
per-prompt wall-clock speedups, or the theoretical speedup where a run has no sequential run to compare with) against
win rate, with the Pareto frontier of the runs and the paper's two published end points for reference (PASTA on
Gemma-7B, H100, against Baseline-SFT: 1.21x at +2.2 LC win rate, 1.93x at -7.1). Below the main table, for the runs
whose summaries have them: the structure table (pasta.evaluation.structure: forks, promises, malformed output,
predicted vs actual chunk lengths, overruns, speedups) and the quality guards (pasta.evaluation.proxies), every
guard labelled "(proxy)".
"""

from __future__ import annotations

import glob
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pasta.data import write_json_atomic, write_text_atomic
from pasta.errors import PastaError
from pasta.evaluation.run_files import SUMMARY_JSON, SUMMARY_MD, read_json

# The paper's end points (arXiv 2502.11517): LC win rate against Baseline-SFT, 50 = parity.
PAPER_POINTS = ({"speedup": 1.21, "win_rate": 52.2}, {"speedup": 1.93, "win_rate": 42.9})
PAPER_LABEL = "paper (Gemma-7B, H100)"

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PARETO_PNG = "pareto.png"


# ------------------------------------------------------------------------------------------------- one run


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The numbers a table row shows for one run summary: win rate (LC when official), speedup, and their kinds."""
    quality = summary.get("quality") or {}
    speed = summary.get("speed") or {}
    if quality.get("length_controlled_winrate") is not None:
        win_rate, win_rate_kind, win_rate_se = (
            quality["length_controlled_winrate"], "LC", quality.get("lc_standard_error"))
    else:
        win_rate, win_rate_kind, win_rate_se = quality.get("win_rate"), "raw", quality.get("standard_error")
    if "wall_speedup_geomean" in speed:
        speedup, speedup_kind = speed["wall_speedup_geomean"], "wall"
    elif "theoretical_speedup_geomean" in speed:
        speedup, speedup_kind = speed["theoretical_speedup_geomean"], "theoretical"
    else:
        speedup, speedup_kind = None, None
    return {
        "name": summary.get("generator"),
        "decode": summary.get("decode"),
        "win_rate": win_rate,
        "win_rate_kind": win_rate_kind,
        "win_rate_se": win_rate_se,
        "raw_win_rate": quality.get("win_rate"),
        "lc_offline_estimate": quality.get("lc_winrate_offline_estimate"),
        "speedup": None if speedup is None else speedup["value"],
        "speedup_ci": None if speedup is None else [speedup["ci_low"], speedup["ci_high"]],
        "speedup_kind": speedup_kind,
        "theoretical_speedup": (speed.get("theoretical_speedup_geomean") or {}).get("value"),
        "ms_per_token": speed.get("ms_per_token_median"),
        "num_prompts": summary.get("num_prompts"),
        "num_with_threads": speed.get("num_with_threads"),
        "annotator": quality.get("annotator"),
        "reference": quality.get("reference"),
        "device": summary.get("device"),
        "eval_data": summary.get("eval_data"),
        "subset": summary.get("subset"),
    }


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table; a "|" inside a cell would split it, so it is shown as "/"."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |" for cells in body]
    return lines


def run_markdown(summary: dict[str, Any]) -> str:
    """summary.md: what was evaluated and its numbers, for a person."""
    row = headline(summary)
    lines = [
        f"# Evaluation: {summary.get('generator')}",
        "",
        f"- model: {summary.get('model') or '-'}; decode: {summary.get('decode') or '-'}; "
        f"timing: {summary.get('timing') or '-'}; device: {summary.get('device') or '-'}",
        f"- prompts: {summary.get('num_prompts')} of {summary.get('eval_data') or '-'}",
        "",
        "## Quality",
        "",
        *_quality_lines(summary.get("quality") or {}),
        "",
        "## Speed",
        "",
        *_speed_lines(summary.get("speed") or {}),
    ]
    if summary.get("structure"):
        lines += ["", "## Structure", "", *_structure_lines(summary["structure"])]
    if summary.get("proxies"):
        lines += ["", "## Quality guards (offline proxies)", "", *_proxy_lines(summary["proxies"])]
    lines += ["", f"Headline: {row['win_rate_kind']} win rate {_fmt(row['win_rate'])}, "
              f"{row['speedup_kind'] or 'no'} speedup {_fmt(row['speedup'])}x", ""]
    return "\n".join(lines)


def _quality_lines(quality: dict[str, Any]) -> list[str]:
    if not quality:
        return ["- not scored"]
    if quality.get("not_judged"):
        return [f"- no win rate ({quality['not_judged']}); reference: {quality.get('reference')}"]
    lines = [
        f"- judge: {quality.get('annotator')}; reference: {quality.get('reference')}",
        f"- win rate: {_fmt(quality.get('win_rate'))} ± {_fmt(quality.get('standard_error'))} "
        f"(n = {quality.get('n_total')}, unjudged {quality.get('n_unjudged', 0)})",
    ]
    if quality.get("length_controlled_winrate") is not None:
        lines.append(f"- length-controlled win rate: {_fmt(quality['length_controlled_winrate'])} "
                     f"± {_fmt(quality.get('lc_standard_error'))} ({quality.get('lc_method')})")
    if quality.get("lc_winrate_offline_estimate") is not None:
        lines.append(f"- offline LC estimate: {_fmt(quality['lc_winrate_offline_estimate'])} "
                     f"({quality.get('lc_method')})")
    if quality.get("lc_unavailable"):
        lines.append(f"- no length-controlled win rate: {quality['lc_unavailable']}")
    return lines


def _speed_lines(speed: dict[str, Any]) -> list[str]:
    if not speed:
        return ["- no per-prompt stats"]
    lines = []
    theoretical = speed["theoretical_speedup_geomean"]
    if "num_with_threads" in speed:
        lines.append(f"- answers that forked chunks: {speed['num_with_threads']} of {speed['num_prompts']}; "
                     f"with malformed tags (decoded as text): {speed['num_malformed']}")
    lines.append(f"- theoretical speedup (geomean): {_fmt(theoretical['value'])}x "
                 f"[{_fmt(theoretical['ci_low'])}, {_fmt(theoretical['ci_high'])}]")
    confidence = f"{int(100 * speed['bootstrap']['confidence'])}% bootstrap interval"
    if "step_speedup_geomean" in speed:
        lines.append(f"- step speedup (geomean) against {speed.get('sequential_run')}: "
                     f"{_with_ci(speed['step_speedup_geomean'])}, {confidence}; length ratio (tokens, mean) "
                     f"{_fmt(speed.get('length_ratio_mean'))}")
    if "cost_speedup_geomean" in speed:
        lines.append(f"- cost-model speedup (geomean, every prompt): {_with_ci(speed['cost_speedup_geomean'])}")
    if "wall_speedup_geomean" in speed:
        lines.append(f"- wall-clock speedup (geomean, {speed.get('num_timed_prompts')} prompts decoded one at a time) "
                     f"against {speed.get('sequential_run')}: {_with_ci(speed['wall_speedup_geomean'])}, {confidence}"
                     + (f"; the cost model on them: {speed['cost_speedup_timed_geomean']:.2f}x"
                        if speed.get("cost_speedup_timed_geomean") is not None else ""))
        lines.append(f"- latency per token (median): {_fmt(speed['ms_per_token_median'], 1)} ms "
                     f"(sequential {_fmt(speed['sequential_ms_per_token_median'], 1)} ms)")
    elif "step_speedup_geomean" in speed:
        lines.append("- no wall-clock speedup: no prompt was decoded one at a time by both runs "
                     "(eval.timing=wall, or eval.timed_prompts=N)")
    else:
        lines.append(f"- latency per token (median): {_fmt(speed['ms_per_token_median'], 1)} ms "
                     "(no sequential run given: eval.sequential=RUN_DIR for wall-clock speedups)")
    return lines


def _structure_lines(structure: dict[str, Any]) -> list[str]:
    return [f"- answers that forked: {structure['num_forked']} of {structure['num_answers']}; promises per "
            f"answer {_fmt(structure['promises_per_answer'])}; per answer, malformed-output events "
            f"{_fmt(structure['malformed_per_answer'])} and duplicate topics "
            f"{_fmt(structure['duplicate_topics_per_answer'])}",
            f"- chunk length, predicted vs actual ({structure['num_chunks']} chunks): Spearman "
            f"{_fmt(structure['length_spearman'])}, mean absolute error {_fmt(structure['length_mae'], 1)} "
            f"tokens; {structure['num_overruns']} chunks overran their reservation"]


def _proxy_lines(proxies: dict[str, Any]) -> list[str]:
    return [f"- emb-sim (proxy): {_fmt(proxies['embedding_similarity'], 3)} with {proxies['reference']}'s "
            f"answers ({proxies['embedding_model']})",
            f"- distinct-2 (proxy): {_fmt(proxies['distinct_2'], 3)}; distinct-3 (proxy): "
            f"{_fmt(proxies['distinct_3'], 3)}",
            f"- length ratio (proxy): {_fmt(proxies['length_ratio'])} against {proxies['baseline'] or '-'}"]


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


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (higher is better), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    frontier, best_y = [], -math.inf
    for index in order:
        if points[index][1] > best_y:
            frontier.append(index)
            best_y = points[index][1]
    return sorted(frontier, key=lambda i: points[i][0])


def report_rows(summaries: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Table rows and warnings about what makes the runs incomparable (other judges, references, devices, prompts)."""
    rows = [{**headline(summary), "run_dir": summary.get("run_dir")} for summary in summaries]
    warnings = []
    for key, what in (("annotator", "judges"), ("reference", "references"), ("device", "devices"),
                      ("eval_data", "eval sets"), ("subset", "prompt subsets (eval.subset)")):
        values = sorted({str(row[key]) for row in rows if row[key] is not None})
        if len(values) > 1:
            warnings.append(f"the runs use different {what} ({', '.join(values)}): their numbers are not comparable")
    kinds = {row["win_rate_kind"] for row in rows if row["win_rate"] is not None}
    if len(kinds) > 1:
        # One axis, one metric: fall back to the raw win rate everywhere.
        for row in rows:
            row["win_rate"], row["win_rate_kind"] = row["raw_win_rate"], "raw"
        warnings.append("some runs have no LC win rate: the table and plot use the raw win rate for all")
    return rows, warnings


def report_markdown(rows: Sequence[dict[str, Any]], warnings: Sequence[str]) -> str:
    header = ["run", "decode", "win rate", "kind", "speedup", "95% CI", "kind", "theor.", "forked", "ms/token", "n",
              "judge", "reference"]
    body = []
    for row in rows:
        ci = row["speedup_ci"]
        body.append([
            row["name"], row["decode"] or "-",
            f"{_fmt(row['win_rate'])} ± {_fmt(row['win_rate_se'])}", row["win_rate_kind"],
            _fmt(row["speedup"], suffix="x"), "-" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]",
            row["speedup_kind"] or "-", _fmt(row["theoretical_speedup"], suffix="x"), _fmt(row["num_with_threads"]),
            _fmt(row["ms_per_token"], 1),
            _fmt(row["num_prompts"]), row["annotator"] or "-", row["reference"] or "-",
        ])
    lines = _table(header, body)
    lines += ["", f"Paper reference: {PAPER_LABEL}, LC win rate against Baseline-SFT: "
              + ", ".join(f"{p['speedup']}x at {p['win_rate'] - 50:+.1f}" for p in PAPER_POINTS) + "."]
    lines += [f"Warning: {w}." for w in warnings]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- structure, proxies


def structure_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The structure table: each run with a structure record, its theoretical and wall-clock speedups beside it."""
    rows = []
    for summary in summaries:
        if not summary.get("structure"):
            continue
        speed = summary.get("speed") or {}
        rows.append({
            "name": summary.get("generator"), "decode": summary.get("decode"), **summary["structure"],
            "theoretical_speedup": (speed.get("theoretical_speedup_geomean") or {}).get("value"),
            "step_speedup": (speed.get("step_speedup_geomean") or {}).get("value"),
            "cost_speedup": speed.get("cost_speedup_geomean"),
            "wall_speedup": speed.get("wall_speedup_geomean"),
            "num_timed_prompts": speed.get("num_timed_prompts"),
            "cost_speedup_timed": speed.get("cost_speedup_timed_geomean"),
            "sequential_run": speed.get("sequential_run"),
        })
    return rows


def length_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tokens-and-steps table: each run's groups (all, forked, plain answers) with a length record."""
    return [{"name": summary.get("generator"), **group}
            for summary in summaries for group in summary.get("length") or []]


def proxy_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The quality-guard table: each run with a proxies record."""
    return [{"name": summary.get("generator"), **summary["proxies"]} for summary in summaries if summary.get("proxies")]


def _names(rows: Sequence[dict[str, Any]], key: str) -> str:
    return ", ".join(sorted({str(row[key]) for row in rows if row.get(key) is not None})) or "-"


def _with_ci(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    return f"{summary['value']:.2f}x [{summary['ci_low']:.2f}, {summary['ci_high']:.2f}]"


def _timed_wall(row: dict[str, Any]) -> str:
    if not row.get("wall_speedup"):
        return "-"
    cost = row.get("cost_speedup_timed")
    return (f"{_with_ci(row['wall_speedup'])} ({row.get('num_timed_prompts')}"
            + (f"; {cost:.2f}x)" if cost is not None else ")"))


def structure_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The structure table and what its columns mean."""
    header = ["run", "decode", "answers", "forked", "promises/answer", "malformed/answer", "dup-topic/answer",
              "chunks", "length Spearman", "length MAE", "overruns", "cross-thread repetition", "theor. speedup",
              "step speedup",
              "cost-model speedup [95% CI]", "wall speedup [95% CI] (timed prompts; cost model on them)"]
    body = [
        [row["name"], row["decode"] or "-", row["num_answers"],
         f"{row['num_forked']} ({100 * row['fork_share']:.0f}%)", _fmt(row["promises_per_answer"]),
         _fmt(row["malformed_per_answer"]), _fmt(row["duplicate_topics_per_answer"]), row["num_chunks"],
         _fmt(row["length_spearman"]), _fmt(row["length_mae"], 1), row["num_overruns"],
         _fmt(row.get("cross_thread_repetition")), _fmt(row["theoretical_speedup"], suffix="x"), _fmt(row.get("step_speedup"), suffix="x"),
         _with_ci(row.get("cost_speedup")), _timed_wall(row)]
        for row in rows
    ]
    policies = sorted({", ".join(f"{k}={v}" for k, v in row["reservation"].items())
                       for row in rows if row.get("reservation")})
    lines = ["## Structure", "", *_table(header, body), "",
             "Length: each promise's `tokens=` against the tokens its chunk took (student's tokenizer), Spearman and "
             "mean absolute error in tokens; '-' = undefined (under two chunks, or one length predicted for all). "
             f"Overruns: chunks longer than the positions reserved for them ({'; '.join(policies) or '-'}). "
             "Cross-thread repetition: per forked answer, the share of its chunks' content words that another "
             "thread of the answer also writes (main thread text and topics, sibling chunks), averaged. "
             f"Speedups: geometric means over prompts against {_names(rows, 'sequential_run')}: steps (its tokens "
             "over the run's steps), the cost model (both runs' steps priced on the sequential run's measured "
             "cost per forward by rows fed), and wall-clock on the prompts both runs decoded one at a time."]
    unparsed = [f"{row['name']} {row['num_unparsed']}" for row in rows if row.get("num_unparsed")]
    if unparsed:
        lines.append(f"Answers without a valid PASTA-LANG form (left out of the chunk columns): {', '.join(unparsed)}.")
    return "\n".join(lines) + "\n"


def length_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Where the answers' tokens and steps go, per answer, against Baseline-SFT's answers to the same prompts."""
    header = ["run", "answers", "tokens", "content", "promise tags + topic + count", "async_end + sync + eos",
              "overrun", "repeated words", "steps", "main text / tag / wait steps", "forced", "Baseline-SFT tokens",
              "content / Baseline-SFT", "steps / Baseline-SFT", "at the token limit"]
    body = [
        [row["name"], f"{row['group']} {row['num_answers']}", _fmt(row["tokens"], 1), _fmt(row["content"], 1),
         f"{_fmt(row['promise_tags'], 1)} + {_fmt(row['topic'], 1)} + {_fmt(row['count'], 1)}",
         f"{_fmt(row['async_end'], 1)} + {_fmt(row['sync'], 1)} + {_fmt(row['eos'], 1)}", _fmt(row["overrun"], 1),
         _fmt(None if row["repeated_share"] is None else 100 * row["repeated_share"], 1, "%"), _fmt(row["steps"], 1),
         f"{_fmt(row['main_text_steps'], 1)} / {_fmt(row['main_tag_steps'], 1)} / {_fmt(row['wait_steps'], 1)}",
         _fmt(row.get("forced"), 2), _fmt(row["baseline_tokens"], 1), _fmt(row["content_over_baseline"]), _fmt(row["steps_over_baseline"]),
         row["num_hit_limit"]]
        for row in rows
    ]
    lines = ["## Where the tokens and steps go (per answer)", "", *_table(header, body), "",
             "Each answer's annotated form re-tokenized with the student's tokenizer (pasta.evaluation.length). "
             "Content: text a reader sees; overrun: chunk tokens past the promise's count; repeated words: content "
             "words in a word 4-gram another thread of the answer also writes. Steps of the ideal schedule: the "
             "main thread sampling text (or eos), sampling tags, and waiting for chunks. Forced: tokens the "
             "constrained decoder had one legal choice for (the steps jump-forward would save). Baseline-SFT takes "
             "one step per token, so steps / Baseline-SFT below 1 is the step speedup."]
    return "\n".join(lines) + "\n"


def proxies_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The quality-guard table, every number labelled as a proxy."""
    header = ["run", "answers", "emb-sim (proxy)", "distinct-2 (proxy)", "distinct-3 (proxy)", "length ratio (proxy)"]
    body = [[row["name"], row["num_answers"], _fmt(row["embedding_similarity"], 3), _fmt(row["distinct_2"], 3),
             _fmt(row["distinct_3"], 3), _fmt(row["length_ratio"])] for row in rows]
    lines = ["## Quality guards (offline proxies, not quality judgements)", "", *_table(header, body), "",
             f"emb-sim (proxy): mean cosine similarity ({_names(rows, 'embedding_model')}) of the plain answer with "
             f"{_names(rows, 'reference')}'s answer; distinct-n (proxy): share of distinct word n-grams per answer, "
             "a repetition guard only (it fails discrimination against GPT-4 Turbo's judgments: docs/judges.md); "
             f"length ratio (proxy): characters against {_names(rows, 'baseline')}'s answers."]
    return "\n".join(lines) + "\n"


def plot_pareto(rows: Sequence[dict[str, Any]], path: Path, title: str = "Speedup vs quality") -> None:
    """pareto.png: each run, the frontier of the runs, parity lines, and the paper's points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plotted = [row for row in rows if row["speedup"] is not None and row["win_rate"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    ax.axhline(50.0, color="0.6", linestyle=":", linewidth=1, label="parity with the reference (50%)")
    ax.axvline(1.0, color="0.6", linestyle="--", linewidth=1, label="sequential speed (1x)")
    ax.plot([p["speedup"] for p in PAPER_POINTS], [p["win_rate"] for p in PAPER_POINTS], linestyle="--",
            marker="*", markersize=12, color="tab:gray", label=PAPER_LABEL)
    for index, row in enumerate(plotted):
        ci = row["speedup_ci"]
        xerr = None if ci is None else [[max(row["speedup"] - ci[0], 0.0)], [max(ci[1] - row["speedup"], 0.0)]]
        yerr = None if row["win_rate_se"] is None else [[row["win_rate_se"]], [row["win_rate_se"]]]
        hollow = row["speedup_kind"] == "theoretical"
        container = ax.errorbar(
            row["speedup"], row["win_rate"], xerr=xerr, yerr=yerr, fmt="o", capsize=3, markersize=7,
            markerfacecolor="none" if hollow else None,
            label=f"{row['name']}" + (" (theoretical speedup)" if hollow else ""),
        )
        # Alternate above and below: runs often share a win rate (ties with the reference sit on 50).
        ax.annotate(row["name"], (row["speedup"], row["win_rate"]), textcoords="offset points",
                    xytext=(6, 6 if index % 2 == 0 else -14), fontsize=8, color=container.lines[0].get_color())
    frontier = pareto_frontier([(row["speedup"], row["win_rate"]) for row in plotted])
    if len(frontier) > 1:
        ax.plot([plotted[i]["speedup"] for i in frontier], [plotted[i]["win_rate"] for i in frontier],
                color="black", linewidth=1.5, alpha=0.6, drawstyle="steps-pre", label="Pareto frontier (runs)")
    kinds = sorted({row["win_rate_kind"] for row in plotted}) or ["raw"]
    references = sorted({str(row["reference"]) for row in plotted}) or ["-"]
    ax.set_xlabel("speedup (geometric mean over prompts)")
    ax.set_ylabel(f"{'/'.join(kinds)} win rate (%) against {', '.join(references)}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def gather(patterns: Sequence[str], output_dir: Path) -> dict[str, Any]:
    """Gather the runs into output_dir: report.json, report.md and pareto.png; returns the report."""
    summaries = load_summaries(patterns)
    rows, warnings = report_rows(summaries)
    structure, proxies, length = structure_rows(summaries), proxy_rows(summaries), length_rows(summaries)
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {"runs": rows, "warnings": warnings, "paper_points": list(PAPER_POINTS), "paper_label": PAPER_LABEL,
              "structure": structure, "proxies": proxies, "length": length}
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
