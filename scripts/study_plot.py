"""The CPU study's plot and table: speedup against the quality proxy, one line per lambda across rounds.

    python scripts/study_plot.py outputs/study/eval outputs/study/report/study.png

Reads the evaluation runs in EVAL_DIR from their `summary.json`, each named by its folder as scripts/cpu_study.sh
names them (`baseline-sft`, `pasta-sft`, `pasta-lambda<L>-round<R>`); runs decoded under other names are plotted by
linking their folders into one EVAL_DIR under these names. Each lambda's line starts at the SFT model (round 0) and
follows its rounds. The left panel is the theoretical speedup and the right one the cost-model wall-clock speedup
against Baseline-SFT (every prompt's steps priced on the measured cost per forward by rows; pasta.evaluation.speed),
both against the embedding similarity to the eval set's reference answers. The table adds the step speedup, the
measured wall-clock speedup on the prompts decoded one at a time, and the length ratio. That similarity is an
offline proxy, labelled as one, not a judge's win rate. The markdown table goes to stdout.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from pasta.cli import run_script
from pasta.data import check_output_file
from pasta.errors import ArgumentParser, PastaError
from pasta.evaluation.formatting import ci_label
from pasta.evaluation.report import load_summaries
from pasta.evaluation.speed import BootstrapConfig

NAME = re.compile(r"^pasta-lambda(?P<lam>.+?)-round(?P<round>\d+)$")  # a lambda may hold a minus: 1e-3
PROXY = "emb-sim to reference (proxy)"


def point(summary: dict[str, Any]) -> dict[str, Any]:
    """One run, named by its folder: its speedups (geometric means; Baseline-SFT, the sequential reference, is 1 on
    both), fork share, malformed events and quality proxy, from its summary.json."""
    speed = summary.get("speed") or {}
    structure = summary.get("structure") or {}
    proxies = summary.get("proxies") or {}
    sequential = summary.get("decode") == "sequential"

    def speedup(key: str) -> dict[str, float] | None:
        return {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0} if sequential else speed.get(key)

    name = Path(summary["run_dir"]).name
    match = NAME.match(name)
    return {
        "name": name,
        # The plot labels a point by its round, not its place on the line: the study decodes only the last round
        # by default (PASTA_STUDY_EVAL_ROUNDS=last), so a line of two points is r0 and r2.
        "round": 0 if name == "pasta-sft" else int(match["round"]) if match else None,
        "lam": match["lam"] if match else None,  # the sweep line of a preference round's run
        "theoretical": (speed.get("theoretical_speedup_geomean") or {}).get("value"),
        "step": (speedup("step_speedup_geomean") or {}).get("value"),
        "cost": speedup("cost_speedup_geomean"),
        "wall": speedup("wall_speedup_geomean"),
        "num_timed": speed.get("num_timed_prompts"),
        "confidence": (speed.get("bootstrap") or {}).get("confidence", BootstrapConfig().confidence) if speed else None,
        "fork_share": structure.get("fork_share"),
        "malformed": None if structure.get("malformed_per_answer") is None
        else structure["malformed_per_answer"] + structure["duplicate_topics_per_answer"],
        "proxy": proxies.get("embedding_similarity"),
        "distinct_2": proxies.get("distinct_2"),
        "length_ratio": 1.0 if sequential else proxies.get("length_ratio"),
    }


def sweep_lines(points: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """lambda -> its points in round order, the SFT model first (round 0)."""
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points.values():
        if p["lam"] is not None:
            lines[p["lam"]].append(p)
    start = points.get("pasta-sft")
    return {
        lam: ([start] if start else []) + sorted(rounds, key=lambda p: p["round"])
        for lam, rounds in sorted(lines.items(), key=lambda item: float(item[0]))  # 4 before 10, inf last
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def with_ci(summary: dict[str, float] | None) -> str:
    if not summary:
        return "-"
    return f"{summary['value']:.2f}x [{summary['ci_low']:.2f}, {summary['ci_high']:.2f}]"


def table(points: dict[str, dict[str, Any]]) -> str:
    timed = sorted({p["num_timed"] for p in points.values() if p["num_timed"]})
    ci = ci_label(p["confidence"] for p in points.values())
    header = ["run", "forks", "malformed + duplicate topics / answer", "theoretical speedup", "step speedup",
              f"cost-model speedup [{ci}]", f"measured wall-clock speedup, {'/'.join(map(str, timed)) or 'no'} "
              f"prompts [{ci}]", PROXY, "distinct-2 (proxy)", "length ratio (proxy)"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in points.values():
        share = "-" if p["fork_share"] is None else f"{100 * p['fork_share']:.0f}%"
        rows.append(
            f"| {p['name']} | {share} | {fmt(p['malformed'])} | {fmt(p['theoretical'])}x | {fmt(p['step'])}x "
            f"| {with_ci(p['cost'])} | {with_ci(p['wall'])} | {fmt(p['proxy'], 3)} | {fmt(p['distinct_2'], 3)} "
            f"| {fmt(p['length_ratio'])} |"
        )
    return "\n".join(rows)


def plot(points: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    baseline = points.get("baseline-sft")
    def x_of(p: dict[str, Any], key: str) -> float | None:
        return (p[key] or {}).get("value") if key == "cost" else p[key]

    for ax, key, label in ((axes[0], "theoretical", "theoretical"), (axes[1], "cost", "cost-model wall-clock")):
        for lam, line in sweep_lines(points).items():
            drawn = [p for p in line if x_of(p, key) is not None and p["proxy"] is not None]
            ax.plot([x_of(p, key) for p in drawn], [p["proxy"] for p in drawn], "o-", label=f"lambda={lam}")
            for p in drawn:
                ax.annotate(f"r{p['round']}", (x_of(p, key), p["proxy"]), textcoords="offset points", xytext=(4, 4))
        if baseline and baseline["proxy"] is not None:
            ax.plot([1.0], [baseline["proxy"]], "ks", label="Baseline-SFT")
        ax.set_xlabel(f"{label} speedup vs Baseline-SFT")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(PROXY)
    axes[0].legend()
    fig.suptitle("PASTA preference rounds: speed vs quality proxy (r0 = SFT)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def load_points(eval_dir: Path) -> dict[str, dict[str, Any]]:
    """Every run under `eval_dir` as a plot point, by name (its folder's)."""
    return {p["name"]: p for p in map(point, load_summaries([str(eval_dir / "*")]))}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("eval_dir", type=Path, help="folder holding the study's evaluation runs")
    parser.add_argument("plot", type=Path, help="where to write the PNG")
    args = parser.parse_args(argv)
    check_output_file(args.plot, "plot")
    points = load_points(args.eval_dir)
    if "pasta-sft" not in points:
        raise PastaError(f"{args.eval_dir} holds no pasta-sft run: run scripts/cpu_study.sh first")
    print(table(points))
    plot(points, args.plot)
    print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    run_script(main)
