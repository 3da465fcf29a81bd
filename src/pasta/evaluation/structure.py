"""How well a run's answers use PASTA-LANG: forks, promises, malformed output, and chunk lengths against predictions.

Read from a run's stats.jsonl (see pasta.evaluation.run_files): each answer's annotated form is parsed with
pasta.lang, and every chunk's content is measured in tokens of the student's own tokenizer (as `tokens="N"` is
written in training data, `pasta.lang.fill_token_counts`). Per run:

- forked answers (at least one chunk) and promises per answer;
- malformed-output events and duplicate-topic events per answer, as the decoder counted them (`malformed` in the
  stats; a repeated topic falls back to text and is counted as `duplicate_topic`, kept apart from the rest);
- predicted vs actual chunk length: Spearman rank correlation and mean absolute error of `tokens=` against the
  tokens the chunk took (over the counted promises; an uncounted one, `lang.reservation.policy=uncounted`, predicts
  nothing);
- reservation overruns: chunks longer than the positions the run's `lang.reservation` policy reserved for them
  (recorded in run.json), where a chunk's positions run into the main thread's;
- cross-thread repetition: per forked answer, the share of its chunks' content words that another thread of the
  answer also writes (`pasta.lang.cross_thread_repetition`), averaged over the forked answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.errors import PastaError
from pasta.evaluation.run_files import STATS, read_stats
from pasta.lang import LangError, ReservationPolicy, cross_thread_repetition, encode_text, parse

DUPLICATE_TOPIC = "duplicate_topic"


@dataclass(frozen=True)
class ChunkLength:
    """One chunk's length: what its promise predicted, what it took, and what the policy reserved for it."""

    num_predicted: int | None  # the promise's tokens="N"; None when uncounted
    num_actual: int  # tokens of the chunk's content in the student's tokenizer
    num_reserved: int  # positions reserved for the content (ReservationPolicy.num_reserved)

    @property
    def overran(self) -> bool:
        return self.num_actual > self.num_reserved


@dataclass(frozen=True)
class AnswerStructure:
    """The structure of one answer."""

    chunks: tuple[ChunkLength, ...]  # in promise order; empty when the answer forked nothing or did not parse
    num_malformed: int  # the decoder's malformed-output events, duplicate topics excepted
    num_duplicate_topics: int
    parsed: bool  # False when the annotated form is missing or not valid PASTA-LANG (no chunks are counted then)
    repetition: float | None = None  # share of the chunks' content words another thread writes; None: no chunk


@dataclass(frozen=True)
class StructureStats:
    """A run's structure table row."""

    num_answers: int
    num_forked: int  # answers with at least one chunk
    fork_share: float
    promises_per_answer: float
    malformed_per_answer: float
    duplicate_topics_per_answer: float
    num_chunks: int
    length_spearman: float | None  # None with fewer than two counted chunks or a constant side (undefined)
    length_mae: float | None  # mean |actual - predicted| in tokens; None without counted chunks
    num_overruns: int  # chunks longer than their reservation
    num_unparsed: int  # answers whose annotated form is missing or not valid PASTA-LANG
    reservation: dict[str, Any] | None  # the policy the overruns were counted under
    # Mean over forked answers of the share of their chunks' content words that another thread also writes; None
    # when no answer forked.
    cross_thread_repetition: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def answer_structure(
    record: dict[str, Any], count_tokens: Callable[[str], int], policy: ReservationPolicy
) -> AnswerStructure:
    """The structure of one stats.jsonl record (`annotated`, `malformed`); `count_tokens` measures a chunk."""
    malformed = record.get("malformed") or {}
    num_duplicates = int(malformed.get(DUPLICATE_TOPIC, 0))
    num_malformed = sum(int(count) for kind, count in malformed.items() if kind != DUPLICATE_TOPIC)
    try:
        doc = parse(record["annotated"])
    except (KeyError, TypeError, LangError):  # no annotated string (not this decoder's stats), or not PASTA-LANG
        return AnswerStructure((), num_malformed, num_duplicates, parsed=False)
    chunks = []
    for promise in doc.promises:
        chunks.append(ChunkLength(promise.num_tokens, count_tokens(promise.content),
                                  policy.num_reserved(promise.num_tokens)))
    return AnswerStructure(tuple(chunks), num_malformed, num_duplicates, parsed=True,
                           repetition=cross_thread_repetition(doc).share if doc.promises else None)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (scipy), or None when undefined: fewer than two pairs, or a constant side."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def structure_stats(answers: Sequence[AnswerStructure], reservation: dict[str, Any] | None = None) -> StructureStats:
    """The run's row from its answers' structures."""
    if not answers:
        raise PastaError("no answers to measure the structure of")
    chunks = [chunk for answer in answers for chunk in answer.chunks]
    counted = [chunk for chunk in chunks if chunk.num_predicted is not None]
    predicted = [chunk.num_predicted for chunk in counted]
    actual = [chunk.num_actual for chunk in counted]
    num = len(answers)
    num_forked = sum(1 for answer in answers if answer.chunks)
    shares = [answer.repetition for answer in answers if answer.repetition is not None]
    return StructureStats(
        num_answers=num,
        num_forked=num_forked,
        fork_share=num_forked / num,
        promises_per_answer=len(chunks) / num,
        malformed_per_answer=sum(answer.num_malformed for answer in answers) / num,
        duplicate_topics_per_answer=sum(answer.num_duplicate_topics for answer in answers) / num,
        num_chunks=len(chunks),
        length_spearman=spearman(predicted, actual),
        length_mae=sum(abs(a - p) for p, a in zip(predicted, actual, strict=True)) / len(counted) if counted else None,
        num_overruns=sum(1 for chunk in chunks if chunk.overran),
        num_unparsed=sum(1 for answer in answers if not answer.parsed),
        reservation=reservation,
        cross_thread_repetition=sum(shares) / len(shares) if shares else None,
    )


def student_tokenizer(model_cfg: DictConfig, recorded_model: str | None):
    """The tokenizer the run's model decoded with: the checkpoint folder run.json names, else the `model` config.

    A run recorded with another model than the config names (and no folder to load) is refused: its chunks would be
    measured in the wrong tokens.
    """
    from pasta.models import load_tokenizer

    cfg = OmegaConf.to_container(model_cfg, resolve=True)
    if recorded_model is not None and Path(recorded_model).is_dir():
        cfg["path"] = recorded_model
    elif recorded_model not in (None, cfg.get("path"), cfg.get("name")):
        raise PastaError(
            f"the run was decoded by {recorded_model!r}, not model {cfg.get('path') or cfg.get('name')!r}: give "
            "its model (model=... or model.path=...) so that chunk lengths are counted in its tokens"
        )
    return load_tokenizer(cfg)


def run_structure(
    stats: Sequence[dict[str, Any]], meta: dict[str, Any], model_cfg: DictConfig, lang_cfg: DictConfig
) -> StructureStats:
    """The structure row of a run's stats records; `meta` is its run.json (model, reservation policy).

    The reservation is the one run.json records; a run decoded before it was recorded is counted under the
    config's `lang.reservation`. The tokenizer is loaded only when some answer made a promise.
    """
    reservation = meta.get("reservation") or OmegaConf.to_container(lang_cfg.reservation, resolve=True)
    policy = ReservationPolicy.from_config(reservation)
    tokenizer = None

    def count_tokens(text: str) -> int:
        nonlocal tokenizer
        if tokenizer is None:
            tokenizer = student_tokenizer(model_cfg, meta.get("model"))
        return len(encode_text(tokenizer, text))

    answers = [answer_structure(record, count_tokens, policy) for record in stats]
    return structure_stats(answers, asdict(policy))


def run_dir_structure(
    run_dir: Path, meta: dict[str, Any], instructions: Sequence[str], model_cfg: DictConfig, lang_cfg: DictConfig
) -> StructureStats | None:
    """The structure row of the evaluated `instructions` in run_dir's stats.jsonl; None when it has none."""
    if not (run_dir / STATS).is_file():
        return None
    wanted = set(instructions)
    return run_structure([r for r in read_stats(run_dir) if r["instruction"] in wanted], meta, model_cfg, lang_cfg)
