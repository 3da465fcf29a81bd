"""How far each offline quality signal agrees with AlpacaEval's real judge (GPT-4 Turbo), on its saved verdicts.

    python scripts/judge_validity.py                      # all 805 prompts for the cheap signals, 200 for the 135M judge
    python scripts/judge_validity.py --hf-prompts 805 --out outputs/validity.json

The signals are the ones pasta can use without a network: the embedded SmolLM2-135M as a pairwise judge
(`judge=hf`, the study's win-rate column), the embedding similarity to a reference answer (`judge=embedding`, the
preference stage's default quality and the evaluation's emb-sim proxy), the same with a length match against the
reference (`judge.length_control`), and distinct-2 (the repetition proxy). Two tests, from the shared fixtures
(`../shared/data/alpaca_eval_fixtures/`, AlpacaEval 2.0's own files):

- discrimination: alpaca-7b's answers against the GPT-4 Turbo references, which the real judge prefers on all but
  17 of 805 prompts (alpaca-7b's win rate 2.59%). Each signal's win rate for alpaca-7b (a pairwise judge's mean
  probability; a pointwise signal's share of prompts where it scores alpaca-7b higher, ties half), its per-prompt
  agreement with the saved verdicts, and the AUC of its alpaca-7b score for the verdict. A pointwise signal that
  needs a reference cannot score the Turbo answer against itself, so it ranks both answers against GPT-4's concise
  answer to the same prompt (the same model family as the Turbo answer: this favours the Turbo side). A signal
  passes when the upper end of its win rate's 95% bootstrap interval is below 50: it tells the weaker model apart.
- length bias: GPT-4's verbose against its concise answers to the same prompts (the real judge: 64.3% and 22.9%
  win rates against the Turbo answers, the length-controlled 51.6 and 41.9). The share of prompts where each signal
  prefers the verbose answer (reference-based signals: against the Turbo answer).

Every number is printed as a proxy's agreement with the real judge, not as quality.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pasta.errors import ArgumentParser

FIXTURES = "alpaca_eval_fixtures"
REAL_WIN_RATE = 2.5915  # alpaca-7b against gpt4_1106_preview (the leaderboard file)
REAL_VERBOSE, REAL_CONCISE = 64.30, 22.92  # their win rates against gpt4_1106_preview


@dataclass(frozen=True)
class Answers:
    """Four answers per prompt, aligned by instruction, and the real judge's verdict on alpaca-7b vs Turbo."""

    instructions: list[str]
    turbo: list[str]
    alpaca: list[str]
    verbose: list[str]
    concise: list[str]
    alpaca_wins: np.ndarray  # [n] bool: the real judge preferred alpaca-7b (preference > 1.5)


@dataclass(frozen=True)
class Validity:
    """One signal's row."""

    signal: str
    kind: str  # pairwise | reference | reference-free
    num_prompts: int
    win_rate: float  # alpaca-7b against Turbo, percent
    win_rate_ci: tuple[float, float]
    agreement: float  # share of prompts whose winner matches the real judge's
    auc: float | None  # of the alpaca-7b score for the real verdict; None when undefined
    verbose_preference: float  # percent of prompts where the verbose answer is preferred
    passes: bool  # win rate's upper 95% bound below 50


def read_fixtures(shared_data_dir: Path) -> Answers:
    from pasta.errors import PastaError

    fixtures = shared_data_dir / FIXTURES

    def by_instruction(path: Path) -> dict[str, dict]:
        if not path.is_file():
            raise PastaError(f"fixture not found: {path} (set PASTA_SHARED_DATA or --shared-data)")
        records = json.loads(path.read_text(encoding="utf-8"))
        return {r["instruction"]: r for r in records}

    annotations = by_instruction(fixtures / "alpaca-7b__weighted_alpaca_eval_gpt4_turbo__annotations.json")
    alpaca = by_instruction(fixtures / "alpaca-7b__model_outputs.json")
    verbose = by_instruction(fixtures / "gpt4_1106_preview_verbose__model_outputs.json")
    concise = by_instruction(fixtures / "gpt4_1106_preview_concise__model_outputs.json")
    instructions = [i for i in annotations if i in alpaca and i in verbose and i in concise]
    return Answers(
        instructions=instructions,
        turbo=[annotations[i]["output_1"] for i in instructions],
        alpaca=[annotations[i]["output_2"] for i in instructions],
        verbose=[verbose[i]["output"] for i in instructions],
        concise=[concise[i]["output"] for i in instructions],
        alpaca_wins=np.array([annotations[i]["preference"] > 1.5 for i in instructions]),
    )


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Probability that a positive scores above a negative (ties half): Mann-Whitney's U over n+ n-."""
    from scipy.stats import rankdata

    num_pos, num_neg = int(positive.sum()), int((~positive).sum())
    if not num_pos or not num_neg:
        return None
    ranks = rankdata(scores)
    return float((ranks[positive].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def row(signal: str, kind: str, wins: np.ndarray, alpaca_score: np.ndarray | None, real_wins: np.ndarray,
        verbose_wins: np.ndarray) -> Validity:
    """`wins` [n]: P(alpaca-7b beats Turbo) per prompt (1, 0, or 0.5 for a tie when pointwise)."""
    from pasta.evaluation.speed import BootstrapConfig, bootstrap_ci

    low, high = bootstrap_ci(100 * wins, lambda samples: samples.mean(axis=-1), BootstrapConfig(num_resamples=2000))
    agree = np.where(wins == 0.5, 0.5, (wins > 0.5) == real_wins)
    return Validity(
        signal=signal, kind=kind, num_prompts=len(wins), win_rate=float(100 * wins.mean()),
        win_rate_ci=(low, high), agreement=float(agree.mean()),
        auc=None if alpaca_score is None else auc(alpaca_score, real_wins),
        verbose_preference=float(100 * verbose_wins.mean()), passes=high < 50.0,
    )


def pointwise_wins(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """1 where `first` scores higher, 0 where lower, 0.5 for a tie."""
    return np.where(first > second, 1.0, np.where(first < second, 0.0, 0.5))


def embedding_rows(answers: Answers, length_controls: list[float]) -> list[Validity]:
    """Embedding similarity to a reference, plain and with each length control."""
    from pasta.judges import JudgeItem, build_judge
    from pasta.judges.embedding import length_match

    judge = build_judge({"kind": "embedding"})
    ins = answers.instructions

    def items(candidates: list[str], references: list[str]) -> list[JudgeItem]:
        return [JudgeItem(i, c, r) for i, c, r in zip(ins, candidates, references, strict=True)]

    pairs = {
        "alpaca|concise": items(answers.alpaca, answers.concise),
        "turbo|concise": items(answers.turbo, answers.concise),
        "alpaca|turbo": items(answers.alpaca, answers.turbo),
        "verbose|turbo": items(answers.verbose, answers.turbo),
        "concise|turbo": items(answers.concise, answers.turbo),
    }
    similarity = {name: np.array(judge.score(batch)) for name, batch in pairs.items()}
    rows = []
    for power in [0.0, *length_controls]:
        score = {name: similarity[name] * np.array([length_match(item, power) for item in pairs[name]])
                 for name in pairs}
        name = judge.name + (f"+len{power:g}" if power else "")
        rows.append(row(name, "reference", pointwise_wins(score["alpaca|concise"], score["turbo|concise"]),
                        score["alpaca|turbo"], answers.alpaca_wins,
                        pointwise_wins(score["verbose|turbo"], score["concise|turbo"])))
    return rows


def distinct_row(answers: Answers) -> Validity:
    from pasta.evaluation.proxies import distinct_n

    def distinct(texts: list[str]) -> np.ndarray:
        return np.array([distinct_n([t], 2) or 0.0 for t in texts])

    alpaca = distinct(answers.alpaca)
    return row("distinct-2", "reference-free", pointwise_wins(alpaca, distinct(answers.turbo)), alpaca,
               answers.alpaca_wins, pointwise_wins(distinct(answers.verbose), distinct(answers.concise)))


def pairwise_row(answers: Answers, judge, indices: list[int]) -> Validity:
    """A pairwise judge (`compare`) on the prompts at `indices`."""
    from pasta.judges import JudgeItem

    def compare(candidates: list[str], references: list[str]) -> np.ndarray:
        items = [JudgeItem(answers.instructions[i], candidates[i], references[i]) for i in indices]
        return np.array(judge.compare(items), dtype=float)

    alpaca = compare(answers.alpaca, answers.turbo)
    return row(judge.name, "pairwise", alpaca, alpaca, answers.alpaca_wins[indices],
               compare(answers.verbose, answers.concise))


def markdown(rows: list[Validity]) -> str:
    lines = [
        "| signal | kind | prompts | alpaca-7b win rate vs GPT-4 Turbo (real judge: 2.59) [95% CI] | "
        "agreement with the real verdicts | AUC | prefers verbose over concise (%) | discrimination |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        auc_text = "-" if r.auc is None else f"{r.auc:.2f}"
        lines.append(
            f"| {r.signal} | {r.kind} | {r.num_prompts} | {r.win_rate:.1f} [{r.win_rate_ci[0]:.1f}, "
            f"{r.win_rate_ci[1]:.1f}] | {100 * r.agreement:.1f}% | {auc_text} | {r.verbose_preference:.1f} | "
            f"{'passes' if r.passes else 'fails'} |"
        )
    lines.append(f"\nReal judge (weighted_alpaca_eval_gpt4_turbo): alpaca-7b {REAL_WIN_RATE:.2f}; win rates against "
                 f"the Turbo answers: verbose {REAL_VERBOSE}, concise {REAL_CONCISE}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from pasta.config import compose
    from pasta.data import check_output_file, write_json_atomic

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared-data", type=Path, default=None, help="default: the config's paths.shared_data_dir")
    parser.add_argument("--hf-prompts", type=int, default=200,
                        help="prompts (a seeded sample) for the 135M pairwise judge, which costs minutes per 100; "
                             "0 = leave it out")
    parser.add_argument("--length-controls", type=float, nargs="*", default=[0.5, 1.0],
                        help="judge.length_control values to check besides 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        check_output_file(args.out, "--out")  # before minutes of judging, not after
    cfg = compose("eval", ["judge=hf"])
    shared = args.shared_data or Path(cfg.paths.shared_data_dir)
    answers = read_fixtures(shared)
    rows = embedding_rows(answers, args.length_controls)
    rows.append(distinct_row(answers))
    if args.hf_prompts:
        from pasta.judges import build_judge

        indices = sorted(random.Random(args.seed).sample(range(len(answers.instructions)),
                                                         min(args.hf_prompts, len(answers.instructions))))
        rows.append(pairwise_row(answers, build_judge(cfg.judge), indices))
    print(markdown(rows))
    if args.out:
        write_json_atomic(args.out, [asdict(r) for r in rows])
    return 0


if __name__ == "__main__":
    from pasta.cli import run_script

    run_script(main)
