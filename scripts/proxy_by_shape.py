"""Where a run's quality proxy is lost: each answer's emb-sim minus Baseline-SFT's on the same prompt, by answer shape.

    python scripts/proxy_by_shape.py outputs/study/eval/baseline-sft outputs/study/eval/pasta-*
    python scripts/proxy_by_shape.py BASELINE RUN... --eval-data sample    # runs decoded on another eval set

emb-sim is the study's offline proxy (pasta.evaluation.proxies: the packaged all-MiniLM-L6-v2 embedding judge, the
cosine similarity of an answer to its prompt's reference answer in the eval set), here per answer: the runs' answers
(their stats.jsonl) and Baseline-SFT's (the first directory, a sequential run) on the prompts both answered. Each
answer has one shape: `plain` (no promise), `opens with promises` (at most one word before its first promise, such as
"1."), or `lead, then promises`. Per run and shape: its answers, their mean emb-sim minus Baseline-SFT's on the same
prompts, and the shape's part of the run's difference (its sum over all the run's answers): the parts add up to the
run's emb-sim minus Baseline-SFT's.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from pasta.errors import ArgumentParser

PLAIN, OPENS, LEAD = "plain", "opens with promises", "lead, then promises"
SHAPES = (PLAIN, OPENS, LEAD)


@dataclass(frozen=True)
class ShapeRow:
    """One shape's answers in one run."""

    shape: str
    num_answers: int
    mean_difference: float  # emb-sim minus Baseline-SFT's on the same prompts
    part: float  # the shape's sum of differences over all the run's answers


def answer_shape(annotated: str) -> str:
    """PLAIN, OPENS or LEAD: where the answer's first promise sits (an answer that does not parse is plain text, as
    the decoder writes its malformed tags)."""
    from pasta.lang import LangError, parse

    try:
        num_lead_words = parse(annotated).num_lead_words
    except LangError:
        return PLAIN
    if num_lead_words is None:
        return PLAIN
    return OPENS if num_lead_words <= 1 else LEAD


def outputs(answers: list[dict]) -> dict[str, str]:
    """Each answer's text by its instruction (what `answer_similarities` scores)."""
    return {answer["instruction"]: answer["output"] for answer in answers}


def shape_rows(differences: dict[str, float], shapes: dict[str, str]) -> list[ShapeRow]:
    """The rows of the shapes the run's answers have, in SHAPES order (`differences` and `shapes` by instruction)."""
    rows = []
    for shape in SHAPES:
        values = [difference for instruction, difference in differences.items() if shapes[instruction] == shape]
        if values:
            rows.append(ShapeRow(shape, len(values), statistics.fmean(values), sum(values) / len(differences)))
    return rows


def run_table(name: str, rows: list[ShapeRow], mean: float, baseline_mean: float, num: int) -> list[str]:
    lines = [f"{name}: emb-sim (proxy) {mean:.4f} against Baseline-SFT's {baseline_mean:.4f} on the same {num} prompts "
             f"(difference {mean - baseline_mean:+.4f})",
             "| shape | answers | emb-sim minus Baseline-SFT's, mean | part of the difference |",
             "|---|---|---|---|"]
    lines += [f"| {r.shape} | {r.num_answers} | {r.mean_difference:+.4f} | {r.part:+.4f} |" for r in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="Baseline-SFT's evaluation directory (python -m pasta.eval ... decode=sequential)")
    parser.add_argument("runs", nargs="+", help="evaluation directories of the runs to split")
    parser.add_argument("--eval-data", default="alpaca_eval", help="the eval_data config the runs were decoded on "
                                                                   "(its answers are the references)")
    args = parser.parse_args(argv)

    from pasta.config import compose
    from pasta.errors import PastaError, one_line
    from pasta.evaluation.eval_set import eval_prompts
    from pasta.evaluation.proxies import answer_similarities, embedding_judge
    from pasta.evaluation.run_files import read_stats

    try:
        baseline = read_stats(Path(args.baseline))  # a wrong directory is named before the eval set loads
        records, _, _ = eval_prompts(compose("eval", [f"eval_data={args.eval_data}"]), limit=None)
        references = {record["instruction"]: record["output"] for record in records}  # as the evaluation's proxies
        unknown = [answer["instruction"] for answer in baseline if answer["instruction"] not in references]
        if unknown:
            raise PastaError(f"{args.baseline} answers {len(unknown)} prompts that eval_data={args.eval_data} does "
                             f"not hold (first: {unknown[0][:60]!r}): pass the runs' --eval-data")
        judge = embedding_judge()
        baseline_similarities = answer_similarities(outputs(baseline), references, judge)
        print(f"emb-sim: {judge.name}, an offline proxy; references: eval_data={args.eval_data}")
        for run_dir in args.runs:
            answers = [a for a in read_stats(Path(run_dir)) if a["instruction"] in baseline_similarities]
            if not answers:
                raise PastaError(f"{run_dir} answered none of the prompts {args.baseline} answered")
            run_similarities = answer_similarities(outputs(answers), references, judge)
            differences = {i: s - baseline_similarities[i] for i, s in run_similarities.items()}
            shapes = {a["instruction"]: answer_shape(a.get("annotated", a["output"])) for a in answers}
            baseline_mean = statistics.fmean(baseline_similarities[i] for i in run_similarities)
            print()
            print("\n".join(run_table(Path(run_dir).name, shape_rows(differences, shapes),
                                      statistics.fmean(run_similarities.values()), baseline_mean, len(answers))))
    except (PastaError, OSError) as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
