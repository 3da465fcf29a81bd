"""Offline quality guards of a run's answers: cheap proxies that flag a model getting worse, not quality judgements.

- embedding similarity: mean cosine (clipped to [0, 1]) of each plain answer with the eval set's own reference
  answer (GPT-4 Turbo's for AlpacaEval), embedded by all-MiniLM-L6-v2 (the embedding judge, pasta.judges.embedding,
  offline). It says "writes about what the reference writes about", not "as good as the reference";
- repetition: distinct-2 and distinct-3, the share of an answer's word n-grams that are distinct (Li et al. 2016,
  per answer, then averaged over answers): a degenerate loop drives them down;
- length ratio: characters of the answers over characters of Baseline-SFT's answers to the same prompts (the
  sequential run, eval.sequential); a speedup bought by shorter answers shows here.

Every number is labelled as a proxy wherever it is shown (pasta.evaluation.formatting). The pairwise judge's win rate
(pasta.evaluation.quality) stays the quality number where a judge is configured.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pasta.errors import PastaError
from pasta.evaluation.run_files import RUN_META, load_model_outputs, read_run_meta

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class QualityProxies:
    """A run's proxy row."""

    num_answers: int
    embedding_similarity: float  # mean over answers
    embedding_model: str  # the embedding judge's name, e.g. embedding:all-MiniLM-L6-v2
    reference: str  # whose answers the similarity is measured against (the eval set's generator)
    distinct_2: float | None  # None when no answer has two words
    distinct_3: float | None
    length_ratio: float | None  # None without a Baseline-SFT run
    baseline: str | None  # the Baseline-SFT run's generator

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def words(text: str) -> list[str]:
    """Lower-cased word tokens: punctuation and whitespace differences do not count as distinct n-grams."""
    return _WORD.findall(text.lower())


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Mean over answers of (distinct word n-grams / word n-grams); answers shorter than n words are left out."""
    shares = []
    for text in texts:
        tokens = words(text)
        ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        if ngrams:
            shares.append(len(set(ngrams)) / len(ngrams))
    return sum(shares) / len(shares) if shares else None


def length_ratio(answers: dict[str, str], baseline_answers: dict[str, str]) -> float | None:
    """Total characters of `answers` over those of `baseline_answers`, on the instructions both answer.

    A ratio of totals rather than a mean of per-prompt ratios: one near-empty baseline answer cannot dominate it.
    """
    shared = [instruction for instruction in answers if instruction in baseline_answers]
    baseline_chars = sum(len(baseline_answers[instruction]) for instruction in shared)
    if not baseline_chars:
        return None
    return sum(len(answers[instruction]) for instruction in shared) / baseline_chars


@functools.cache
def embedding_judge():
    """The packaged all-MiniLM-L6-v2 embedding judge, loaded once per process."""
    from pasta.judges import build_judge

    return build_judge({"kind": "embedding"})


def answer_similarities(answers: dict[str, str], references: dict[str, str], judge=None) -> dict[str, float]:
    """Each answer's embedding similarity with the reference answer of its instruction, by instruction."""
    from pasta.judges.base import JudgeItem

    judge = judge or embedding_judge()
    missing = [instruction for instruction in answers if instruction not in references]
    if missing:
        raise PastaError(f"no reference answer for {len(missing)} answers (first: {missing[0][:80]!r})")
    items = [JudgeItem(instruction, answer, references[instruction]) for instruction, answer in answers.items()]
    return dict(zip(answers, judge.score(items), strict=True))


def embedding_similarity(answers: dict[str, str], references: dict[str, str], judge=None) -> float:
    """Mean embedding similarity of each answer with the reference answer of its instruction."""
    scores = answer_similarities(answers, references, judge)
    return sum(scores.values()) / len(scores)


def baseline_answers(sequential_dir: Path) -> tuple[dict[str, str], str]:
    """(answers by instruction, generator) of the Baseline-SFT sequential run."""
    meta = read_run_meta(sequential_dir) if (sequential_dir / RUN_META).is_file() else {}
    outputs = load_model_outputs(sequential_dir, expected_generator=meta.get("generator"))
    return {r["instruction"]: r["output"] for r in outputs}, outputs[0]["generator"]


def quality_proxies(
    answers: dict[str, str],
    references: dict[str, str],
    reference_name: str,
    baseline: tuple[dict[str, str], str] | None = None,
    judge=None,
) -> QualityProxies:
    """The proxy row of a run's plain answers (by instruction) against the eval set's references and Baseline-SFT."""
    if not answers:
        raise PastaError("no answers to compute quality proxies of")
    judge = judge or embedding_judge()
    texts = list(answers.values())
    return QualityProxies(
        num_answers=len(answers),
        embedding_similarity=embedding_similarity(answers, references, judge),
        embedding_model=judge.name,
        reference=reference_name,
        distinct_2=distinct_n(texts, 2),
        distinct_3=distinct_n(texts, 3),
        length_ratio=None if baseline is None else length_ratio(answers, baseline[0]),
        baseline=None if baseline is None else baseline[1],
    )


def run_proxies(
    model_outputs: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]], sequential: str | None
) -> QualityProxies:
    """The proxy row of a run's AlpacaEval-format outputs, against the evaluated records' own answers (`output`,
    by `generator`) and the Baseline-SFT sequential run `sequential` (a run directory; None = no length ratio)."""
    references = {record["instruction"]: record["output"] for record in records}
    answers = {record["instruction"]: record["output"] for record in model_outputs}
    baseline = None if sequential is None else baseline_answers(Path(sequential))
    return quality_proxies(answers, references, str(records[0].get("generator", "reference")), baseline)
