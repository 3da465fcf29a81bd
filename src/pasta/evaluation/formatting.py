"""How a person reads evaluated runs: the per-run summary.md, the gathered report.md tables and the Pareto plot.

Formatting only: the numbers are gathered elsewhere (pasta.evaluation.speed's SpeedSummary, pasta.evaluation.rows'
ReportRow, pasta.evaluation.report's table rows) and shown here as they are. The speed axis and the headline speedup are the measured
wall-clock speedup (`SpeedSummary.headline`), never another kind in its place: a run without one shows "-" and
stays off the plot, and the other speedups keep columns and lines of their own, each named.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pasta.evaluation.rows import PAPER_LABEL, PAPER_POINTS, ReportRow, headline, pareto_frontier
from pasta.evaluation.speed import BootstrapConfig, Interval, SpeedSummary


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _percent(share: float) -> str:
    return f"{round(100 * share, 2):g}%"  # 0.9 -> "90%", 0.975 -> "97.5%" (int() would floor 0.29 to 28)


def ci_label(confidences: Iterable[float | None]) -> str:
    """The interval columns' name for runs resampled at these bootstrap confidences ("95% CI"); "CI" when they differ
    (the report then warns), the default's when no run has intervals."""
    levels = {c for c in confidences if c is not None} or {BootstrapConfig().confidence}
    return f"{_percent(levels.pop())} CI" if len(levels) == 1 else "CI"


def _table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table; a "|" inside a cell would split it, so it is shown as "/"."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |" for cells in body]
    return lines



def run_markdown(summary: dict[str, Any]) -> str:
    """summary.md: what was evaluated and its numbers, for a person."""
    row = headline(summary)
    speed = SpeedSummary.from_dict(summary["speed"]) if summary.get("speed") else None
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
        *_speed_lines(speed),
    ]
    if summary.get("structure"):
        lines += ["", "## Structure", "", *_structure_lines(summary["structure"])]
    if summary.get("proxies"):
        lines += ["", "## Quality guards (offline proxies)", "", *_proxy_lines(summary["proxies"])]
    speedup = (f"wall-clock speedup {_with_ci(row.speedup)}" if row.speedup is not None
               else "no wall-clock speedup (eval.sequential=RUN_DIR, with prompts both runs decoded one at a time)")
    lines += ["", f"Headline: {row.win_rate_kind} win rate {_fmt(row.win_rate)}, {speedup}", ""]
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


def _speed_lines(speed: SpeedSummary | None) -> list[str]:
    if speed is None:
        return ["- no per-prompt stats"]
    lines = [f"- answers that forked chunks: {speed.num_with_threads} of {speed.num_prompts}; "
             f"with malformed tags (decoded as text): {speed.num_malformed}",
             f"- theoretical speedup (geomean): {_with_ci(speed.theoretical_speedup_geomean)}"]
    confidence = f"{_percent(speed.bootstrap.confidence)} bootstrap interval"
    if speed.step_speedup_geomean is not None:
        lines.append(f"- step speedup (geomean) against {speed.sequential_run}: "
                     f"{_with_ci(speed.step_speedup_geomean)}, {confidence}; length ratio (tokens, mean) "
                     f"{_fmt(speed.length_ratio_mean)}")
    if speed.cost_speedup_geomean is not None:
        lines.append(f"- cost-model speedup (geomean, every prompt): {_with_ci(speed.cost_speedup_geomean)}")
    if speed.wall_speedup_geomean is not None:
        when = ("each decoded beside the answer in this run (eval.sequential_model)" if speed.wall_timed_beside
                else "timed in its own run")
        lines.append(f"- wall-clock speedup (geomean, {speed.num_timed_prompts} prompts decoded one at a time) "
                     f"against {speed.sequential_run}, {when}: {_with_ci(speed.wall_speedup_geomean)}, {confidence}"
                     + (f"; the cost model on them: {speed.cost_speedup_timed_geomean:.2f}x"
                        if speed.cost_speedup_timed_geomean is not None else ""))
        lines.append(f"- latency per token (median): {_fmt(speed.ms_per_token_median, 1)} ms "
                     f"(sequential {_fmt(speed.sequential_ms_per_token_median, 1)} ms)")
    elif speed.step_speedup_geomean is not None:
        lines.append("- no wall-clock speedup: no prompt was decoded one at a time by both runs "
                     "(eval.timing=wall, or eval.timed_prompts=N)")
    else:
        batched = "; answers decoded in batches: each one's batch wall time over its tokens" \
            if speed.ms_per_token_batched else ""
        lines.append(f"- latency per token (median): {_fmt(speed.ms_per_token_median, 1)} ms "
                     f"(no sequential run given: eval.sequential=RUN_DIR for wall-clock speedups{batched})")
    if speed.parallelism_geomean is not None:
        lines.append(f"- parallelism (geomean): async over the same answer's plain text decoded sequentially by "
                     f"this model, {speed.parallelism_forked_geomean:.2f}x on the {speed.num_replayed} forked "
                     f"answers timed alone; {_with_ci(speed.parallelism_geomean)} over every answer timed alone "
                     "(one that forked nothing counts 1.0)")
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



def report_markdown(rows: Sequence[ReportRow], warnings: Sequence[str]) -> str:
    header = ["run", "decode", "win rate", "kind", "wall-clock speedup", ci_label(row.confidence for row in rows),
              "theor.", "forked", "ms/token", "n", "judge", "reference"]
    body = []
    for row in rows:
        speedup = row.speedup
        body.append([
            row.name, row.decode or "-",
            f"{_fmt(row.win_rate)} ± {_fmt(row.win_rate_se)}", row.win_rate_kind,
            "-" if speedup is None else f"{speedup.value:.2f}x",
            "-" if speedup is None else f"[{speedup.ci_low:.2f}, {speedup.ci_high:.2f}]",
            _fmt(row.theoretical_speedup, suffix="x"), _fmt(row.num_with_threads),
            _fmt(row.ms_per_token, 1, suffix=" (batched)" if row.ms_per_token_batched else ""),
            _fmt(row.num_prompts), row.annotator or "-", row.reference or "-",
        ])
    lines = _table(header, body)
    lines += ["", f"Paper reference: {PAPER_LABEL}, LC win rate against Baseline-SFT: "
              + ", ".join(f"{p['speedup']}x at {p['win_rate'] - 50:+.1f}" for p in PAPER_POINTS) + "."]
    lines += [f"Warning: {w}." for w in warnings]
    return "\n".join(lines) + "\n"


def _names(rows: Sequence[dict[str, Any]], key: str) -> str:
    return ", ".join(sorted({str(row[key]) for row in rows if row.get(key) is not None})) or "-"


def _with_ci(interval: Interval | dict[str, Any] | None) -> str:
    if not interval:
        return "-"
    if isinstance(interval, dict):
        interval = Interval(interval["value"], interval["ci_low"], interval["ci_high"])
    return f"{interval.value:.2f}x [{interval.ci_low:.2f}, {interval.ci_high:.2f}]"


def _timed_wall(row: dict[str, Any]) -> str:
    if not row.get("wall_speedup"):
        return "-"
    cost = row.get("cost_speedup_timed")
    return (f"{_with_ci(row['wall_speedup'])} ({row.get('num_timed_prompts')}"
            + (f"; {cost:.2f}x)" if cost is not None else ")"))



def structure_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The structure table and what its columns mean."""
    ci = ci_label(row.get("confidence") for row in rows)
    header = ["run", "decode", "answers", "forked", "promises/answer", "malformed/answer", "dup-topic/answer",
              "chunks", "length Spearman", "length MAE", "overruns", "cross-thread repetition",
              "loops / budget cuts / topic loops", "theor. speedup", "step speedup", f"cost-model speedup [{ci}]",
              f"wall speedup [{ci}] (timed prompts; cost model on them)", f"parallelism [{ci}] (forked)"]
    body = [
        [row["name"], row["decode"] or "-", row["num_answers"],
         f"{row['num_forked']} ({100 * row['fork_share']:.0f}%)", _fmt(row["promises_per_answer"]),
         _fmt(row["malformed_per_answer"]), _fmt(row["duplicate_topics_per_answer"]), row["num_chunks"],
         _fmt(row["length_spearman"]), _fmt(row["length_mae"], 1), row["num_overruns"],
         _fmt(row.get("cross_thread_repetition")), _degenerate_cell(row.get("degenerate")),
         _fmt(row["theoretical_speedup"], suffix="x"), _fmt(row.get("step_speedup"), suffix="x"),
         _with_ci(row.get("cost_speedup")), _timed_wall(row), _parallelism_cell(row)]
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
             "Loops / budget cuts / topic loops: answers stopped by the token budget while repeating a word n-gram, "
             "answers stopped by the budget, and promise lists whose topics loop (pasta.evaluation.degenerate). "
             f"Speedups: geometric means over prompts against {_names(rows, 'sequential_run')}: steps (its tokens "
             "over the run's steps), the cost model (both runs' steps priced on the sequential run's measured "
             "cost per forward by rows fed), and wall-clock on the prompts both runs decoded one at a time. "
             "Parallelism: each answer decoded alone against its own plain text replayed one token per step by the "
             "same model (the speedup that is not a shorter answer), and over the answers that forked."]
    unparsed = [f"{row['name']} {row['num_unparsed']}" for row in rows if row.get("num_unparsed")]
    if unparsed:
        lines.append(f"Answers without a valid PASTA-LANG form (left out of the chunk columns): {', '.join(unparsed)}.")
    return "\n".join(lines) + "\n"


def _degenerate_cell(counts: dict[str, Any] | None) -> str:
    if not counts:
        return "-"
    return f"{counts['num_loops']} / {counts['num_budget_cuts']} / {counts['num_topic_loops']}"


def _parallelism_cell(row: dict[str, Any]) -> str:
    if not row.get("parallelism"):
        return "-"
    forked = row.get("parallelism_forked")
    return _with_ci(row["parallelism"]) + (f" ({forked:.2f}x)" if forked is not None else "")


def length_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Where the answers' tokens and steps go, per answer, against Baseline-SFT's answers to the same prompts."""
    header = ["run", "answers", "tokens", "content", "promise tags + topic + count", "async_end + sync + eos",
              "overrun", "repeated words", "steps", "main text / tag / wait steps", "forced", "kept guesses",
              "Baseline-SFT tokens", "content / Baseline-SFT", "steps / Baseline-SFT", "at the token limit"]
    body = [
        [row["name"], f"{row['group']} {row['num_answers']}", _fmt(row["tokens"], 1), _fmt(row["content"], 1),
         f"{_fmt(row['promise_tags'], 1)} + {_fmt(row['topic'], 1)} + {_fmt(row['count'], 1)}",
         f"{_fmt(row['async_end'], 1)} + {_fmt(row['sync'], 1)} + {_fmt(row['eos'], 1)}", _fmt(row["overrun"], 1),
         _fmt(None if row["repeated_share"] is None else 100 * row["repeated_share"], 1, "%"), _fmt(row["steps"], 1),
         f"{_fmt(row['main_text_steps'], 1)} / {_fmt(row['main_tag_steps'], 1)} / {_fmt(row['wait_steps'], 1)}",
         _fmt(row.get("forced"), 2), _fmt(row.get("draft_kept"), 2), _fmt(row["baseline_tokens"], 1), _fmt(row["content_over_baseline"]), _fmt(row["steps_over_baseline"]),
         row["num_hit_limit"]]
        for row in rows
    ]
    lines = ["## Where the tokens and steps go (per answer)", "", *_table(header, body), "",
             "Each answer's annotated form re-tokenized with the student's tokenizer (pasta.evaluation.length). "
             "Content: text a reader sees; overrun: chunk tokens past the promise's count; repeated words: content "
             "words in a word 4-gram another thread of the answer also writes. Steps of the ideal schedule: the "
             "main thread sampling text (or eos), sampling tags, and waiting for chunks. Forced: tokens the "
             "constrained decoder had one legal choice for (the steps jump-forward would save). Kept guesses: "
             "main-thread tokens decode.draft_skeleton guessed and the model chose, each a step the main thread "
             "did not take (the decode took up to that many fewer steps than this schedule: fewer where the main "
             "thread then waited for a chunk anyway). Baseline-SFT takes one step per token, so steps / "
             "Baseline-SFT below 1 is the step speedup."]
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



def quality_axis(rows: Sequence[ReportRow]) -> tuple[str, Callable[[ReportRow], float | None]]:
    """The plot's quality axis: the win rate when every run with a speedup has one, else the embedding-similarity
    proxy (the offline signal that discriminates: docs/judges.md), labelled as a proxy with its model."""
    timed = [row for row in rows if row.speedup is not None]
    if timed and all(row.win_rate is not None for row in timed):
        kinds = sorted({row.win_rate_kind for row in timed})
        references = sorted({str(row.reference) for row in timed})
        return f"{'/'.join(kinds)} win rate (%) against {', '.join(references)}", lambda row: row.win_rate
    models = sorted({str(row.proxy_model) for row in timed if row.proxy_model}) or ["-"]
    references = sorted({str(row.proxy_reference) for row in timed if row.proxy_reference}) or ["-"]
    return (f"emb-sim with {', '.join(references)}'s answers (offline proxy, {', '.join(models)})",
            lambda row: row.proxy_similarity)


def paper_legend(axis_label: str) -> str:
    """The paper points' name on a win-rate axis: they are LC win rates against the paper's own Baseline-SFT, which
    the legend says, and says louder on an axis of raw win rates or of another reference."""
    paper = f"{PAPER_LABEL}: LC win rate vs its Baseline-SFT"
    return paper if axis_label.startswith("LC win rate") else f"{paper} (not this axis' metric)"


def plot_pareto(rows: Sequence[ReportRow], path: Path, title: str = "Speedup vs quality") -> None:
    """pareto.png: each run with a wall-clock speedup against its quality (`quality_axis`), the frontier of the runs,
    the sequential run's level; with win rates, parity and the paper's points (wall clock too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, quality = quality_axis(rows)
    win_rates = "win rate" in label
    plotted = [row for row in rows if row.speedup is not None and quality(row) is not None]
    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    ax.axvline(1.0, color="0.6", linestyle="--", linewidth=1, label="sequential speed (1x)")
    if win_rates:
        ax.axhline(50.0, color="0.6", linestyle=":", linewidth=1, label="parity with the reference (50%)")
        ax.plot([p["speedup"] for p in PAPER_POINTS], [p["win_rate"] for p in PAPER_POINTS], linestyle="--",
                marker="*", markersize=12, color="tab:gray", label=paper_legend(label))
    else:
        for row in rows:
            if row.decode == "sequential" and row.proxy_similarity is not None:
                ax.axhline(row.proxy_similarity, color="0.6", linestyle=":", linewidth=1,
                           label=f"{row.name} (sequential)")
    for index, row in enumerate(plotted):
        speedup = row.speedup
        xerr = [[max(speedup.value - speedup.ci_low, 0.0)], [max(speedup.ci_high - speedup.value, 0.0)]]
        yerr = None if not win_rates or row.win_rate_se is None else [[row.win_rate_se], [row.win_rate_se]]
        container = ax.errorbar(speedup.value, quality(row), xerr=xerr, yerr=yerr, fmt="o", capsize=3,
                                markersize=7, label=row.name)
        # Runs often sit close together: stagger the names over four heights, alternately above and below.
        offset = (8, -14, 20, -26)[index % 4]
        ax.annotate(row.name, (speedup.value, quality(row)), textcoords="offset points", xytext=(6, offset),
                    fontsize=8, color=container.lines[0].get_color())
    frontier = pareto_frontier([(row.speedup.value, quality(row)) for row in plotted])
    if len(frontier) > 1:
        ax.plot([plotted[i].speedup.value for i in frontier], [quality(plotted[i]) for i in frontier],
                color="black", linewidth=1.5, alpha=0.6, drawstyle="steps-pre", label="Pareto frontier (runs)")
    ax.set_xlabel("wall-clock speedup (geometric mean over prompts)")
    ax.set_ylabel(textwrap.fill(label, 48))  # the proxy's full name runs past the axis on one line
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
