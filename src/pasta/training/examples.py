"""Annotated records -> token-level training examples, with an account of every record that was left out and of
what truncation cuts, and the balance of promise-bearing and plain records (`balance_promises`).

An example is a plain dict (so it fits in a `datasets.Dataset` and travels through any data loader):
`prompt_ids`, `main_ids`, and per chunk `opener_ids`, `body_ids`, `num_predicted`. The collator turns examples
into the PASTA-LANG layout. The prompt is the model's chat template (`pasta.models.encode_prompt`), the response
the record's `annotated` text with every promise's `tokens=` re-measured in this tokenizer (teachers' counts are
rough, and the model must learn its own tokenizer's lengths). With `strip_annotations` the response is the plain
text of the same annotation, so Baseline-SFT trains on exactly the records PASTA-SFT trains on, with no tags.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.data import Record
from pasta.errors import PastaError
from pasta.lang import (
    IGNORE_INDEX,
    Document,
    LangError,
    TokenChunk,
    TokenDoc,
    parse,
    plain_text,
    row_targets,
    tokenize_document,
    written_counts,
)
from pasta.lang.tokens import TagIds
from pasta.models import encode_prompt
from pasta.training.config import TrainingData


@dataclass
class ExampleStats:
    """What happened to each record: used, or why it was left out; and what truncation cut from the used ones.

    An example longer than `max_length` rows with `too_long=truncate` is trained on its first `max_length` rows;
    `num_targets_cut` counts the trained tokens whose predicting row is cut, `num_chunk_ends_cut` the chunks whose
    `<|async_end|>` is never trained (the student never sees them end), `num_answer_ends_cut` the answers whose
    eos is never trained.
    """

    max_length: int = 0
    num_records: int = 0
    num_used: int = 0
    num_targets: int = 0  # trained tokens of the used examples, whole
    num_truncated: int = 0
    num_rows_cut: int = 0
    num_targets_cut: int = 0
    num_chunk_ends_cut: int = 0
    num_answer_ends_cut: int = 0
    num_trained_plain: int = 0  # promise-bearing records trained as their plain text (data.min_lead_words)
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_length": self.max_length,
            "num_records": self.num_records,
            "num_used": self.num_used,
            "num_targets": self.num_targets,
            "num_truncated": self.num_truncated,
            "num_rows_cut": self.num_rows_cut,
            "num_targets_cut": self.num_targets_cut,
            "num_chunk_ends_cut": self.num_chunk_ends_cut,
            "num_answer_ends_cut": self.num_answer_ends_cut,
            "num_trained_plain": self.num_trained_plain,
            "skipped": dict(sorted(self.skipped.items())),
        }

    def truncation_message(self) -> str | None:
        """One line saying what truncation cut and why, or None when nothing was cut."""
        if not self.num_truncated:
            return None
        share = self.num_targets_cut / max(self.num_targets, 1)
        return (
            f"{self.num_truncated} of {self.num_used} examples are longer than stage.max_length={self.max_length} "
            f"rows and are trained on their first {self.max_length}: {self.num_rows_cut} rows cut, "
            f"{self.num_targets_cut} trained tokens ({share:.1%}), {self.num_chunk_ends_cut} chunk ends, "
            f"{self.num_answer_ends_cut} answer ends; raise stage.max_length or set stage.too_long=skip"
        )


@dataclass(frozen=True)
class PromiseBalance:
    """Which records SFT trains on when few of them carry promises (`data.min_promise_share`), and why."""

    num_with_promises: int
    num_plain: int
    min_promise_share: float | None  # None = records used as they are
    promise_only: bool  # trained on the promise-bearing records, and `num_plain_kept` plain ones, only
    num_plain_kept: int = 0  # plain records kept beside them (data.plain_per_promise)

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_with_promises": self.num_with_promises,
            "num_plain": self.num_plain,
            "min_promise_share": self.min_promise_share,
            "promise_only": self.promise_only,
            "num_plain_kept": self.num_plain_kept,
        }

    def message(self) -> str:
        total = self.num_with_promises + self.num_plain
        share = self.num_with_promises / max(total, 1)
        found = f"{self.num_with_promises} of {total} records carry promises ({share:.1%})"
        if self.promise_only:
            kept = (f" and {self.num_plain_kept} plain ones (data.plain_per_promise), leaving out "
                    f"{self.num_plain - self.num_plain_kept}" if self.num_plain_kept else
                    f" only, leaving out {self.num_plain}")
            return (
                f"{found}, below data.min_promise_share={self.min_promise_share}: training on those "
                f"{self.num_with_promises}{kept} plain ones (a small student trained mostly on plain answers forks "
                "rarely; data.min_promise_share=null uses every record)"
            )
        if self.min_promise_share is None:
            return f"{found}: using every record (data.min_promise_share=null)"
        return f"{found}, at least data.min_promise_share={self.min_promise_share}: using every record"


def loader_config(data_cfg: DictConfig) -> dict[str, Any]:
    """`cfg.data` without training's own keys (`TrainingData`), for `pasta.data.load_instructions`."""
    raw = OmegaConf.to_container(data_cfg, resolve=True)
    return {k: v for k, v in raw.items() if k not in TrainingData.field_names()}


class SkipRecord(Exception):
    """A record that is left out of training; `args[0]` is the reason counted in `ExampleStats.skipped`."""


def with_min_promises(records: list[Record], min_promises: int) -> list[Record]:
    """The records whose annotation holds at least `min_promises` promises (unannotated or malformed: none)."""
    if min_promises <= 0:
        return records
    kept = []
    for record in records:
        try:
            response_document(record, strip_annotations=False, min_promises=min_promises)
        except (SkipRecord, LangError):
            continue
        kept.append(record)
    return kept


def has_promises(record: Record) -> bool:
    """Whether the record is used (not `accepted: false`) and its annotation holds a promise."""
    try:
        return bool(response_document(record, strip_annotations=False, min_promises=1).promises)
    except (SkipRecord, LangError):
        return False


def balance_promises(
    records: list[Record], *, min_promise_share: float | None, plain_per_promise: float = 0.0, seed: int = 0
) -> tuple[list[Record], PromiseBalance]:
    """The records to train on: the promise-bearing ones, and `plain_per_promise` plain ones for each (a seeded
    sample, kept in data order), when fewer than `min_promise_share` carry promises.

    Rule-based teachers put promises in few answers (the structural teacher in about 6% of Alpaca's). Measured on
    the shared 5K with SmolLM2-135M (README, "The CPU study"): mixing them 50/50 with plain answers (each used 4
    times) gave a student that forked in 7 of 100 held-out answers, and looped in promise lists when it did;
    training on the 281 promise-bearing ones only (not 2,248 examples) gave 33 of 100, every one ending cleanly.
    But a student that never saw a plain answer end does not learn to end one: plain answers beside them teach it.
    The decision depends only on the annotations and the seed, so Baseline-SFT (`strip_annotations`) gets the
    same records.
    """
    flags = [has_promises(r) for r in records]
    with_promises = [r for r, flag in zip(records, flags, strict=True) if flag]
    num_with, num_plain = len(with_promises), len(records) - len(with_promises)
    scarce = min_promise_share is not None and 0 < num_with < min_promise_share * len(records)
    if not scarce:
        return records, PromiseBalance(num_with, num_plain, min_promise_share, promise_only=False)
    plain_indices = [i for i, flag in enumerate(flags) if not flag]
    num_kept = min(num_plain, round(plain_per_promise * num_with))
    kept = set(random.Random(seed).sample(plain_indices, num_kept))
    chosen = [r for i, (r, flag) in enumerate(zip(records, flags, strict=True)) if flag or i in kept]
    return chosen, PromiseBalance(num_with, num_plain, min_promise_share, promise_only=True, num_plain_kept=num_kept)


def response_document(record: Record, *, strip_annotations: bool, min_promises: int = 0) -> Document:
    """The response to train on; raises SkipRecord (or LangError for a malformed annotation) when unusable.

    A record marked `accepted: false` is not used; one without `accepted` (hand-written data) is. Baseline-SFT of a
    plain Alpaca file (no `annotated` field) trains on `output`. `min_promises` leaves out records whose annotation
    has fewer promises, before any stripping, so Baseline-SFT with the same setting keeps the same records.
    """
    if not record.accepted:
        raise SkipRecord("not_accepted")
    if record.annotated is None or not record.annotated.strip():
        if min_promises > 0:
            raise SkipRecord("too_few_promises")
        if strip_annotations:
            return Document.plain(record.output)
        raise SkipRecord("no_annotation")
    doc = parse(record.annotated)
    if len(doc.promises) < min_promises:
        raise SkipRecord("too_few_promises")
    if strip_annotations:
        return Document.plain(plain_text(doc))
    return doc


def plain_answer_ids(tokenizer, text: str, ended: bool) -> list[int]:
    """A plain answer's ids as Baseline-SFT trains on them (eos appended when the answer `ended`)."""
    return tokenize_document(Document.plain(text), tokenizer, add_eos=ended).main_ids


def example_from_doc(prompt_ids: list[int], doc: TokenDoc) -> dict[str, Any]:
    return {
        "prompt_ids": list(prompt_ids),
        "main_ids": list(doc.main_ids),
        "opener_ids": [c.opener_ids for c in doc.chunks],
        "body_ids": [c.body_ids for c in doc.chunks],
        "num_predicted": [c.num_predicted for c in doc.chunks],
    }


def token_doc_of(example: dict[str, Any], tag_ids: TagIds) -> TokenDoc:
    chunks = [
        TokenChunk(opener_ids=list(o), body_ids=list(b), num_predicted=None if n is None else int(n))
        for o, b, n in zip(example["opener_ids"], example["body_ids"], example["num_predicted"], strict=True)
    ]
    return TokenDoc(main_ids=list(example["main_ids"]), chunks=chunks, tag_ids=tag_ids)


def num_rows(example: dict[str, Any]) -> int:
    """Rows of the example's layout: prompt, main thread, and every chunk's opener and body."""
    return (
        len(example["prompt_ids"])
        + len(example["main_ids"])
        + sum(len(o) + len(b) for o, b in zip(example["opener_ids"], example["body_ids"], strict=True))
    )


def skipped_as_too_long(num_layout_rows: int, num_prompt_ids: int, max_length: int, too_long: str) -> bool:
    """Whether a layout of `num_layout_rows` rows is left out under `stage.max_length`/`too_long` (SFT's examples and
    the preference stage's pairs alike): longer than `max_length` with `too_long=skip`, or a prompt that alone fills
    `max_length`, leaving nothing to train on. A longer one kept is trained on its first `max_length` rows."""
    return num_layout_rows > max_length and (too_long == "skip" or num_prompt_ids >= max_length)


def count_cut(stats: ExampleStats, num_prompt_ids: int, doc: TokenDoc, max_length: int) -> None:
    """Add to `stats` what cutting the example's layout to its first `max_length` rows leaves out of training."""
    cut = row_targets(num_prompt_ids, doc)[max_length:]
    trained = [t for t in cut if t != IGNORE_INDEX]
    stats.num_truncated += 1
    stats.num_rows_cut += len(cut)
    stats.num_targets_cut += len(trained)
    stats.num_chunk_ends_cut += trained.count(doc.tag_ids.async_end)
    stats.num_answer_ends_cut += doc.main_ids[-1] in trained


def build_sft_examples(
    records: list[Record],
    tokenizer,
    *,
    strip_annotations: bool,
    max_length: int,
    too_long: str,
    min_promises: int = 0,
    counts: bool = True,
    min_lead_words: int = 0,
) -> tuple[list[dict[str, Any]], ExampleStats]:
    """Token-level examples of the usable records, and the account of all records (see the module docstring).

    `min_promises` keeps only records whose annotation holds at least that many promises (`data.min_promises`);
    `counts` writes each promise's tokens="N" (false: the uncounted form, `ReservationPolicy.counts`);
    `min_lead_words` trains a record whose first promise follows fewer words as its plain text
    (`data.min_lead_words`: which records are used does not change, so Baseline-SFT's stay the same).

    Too long means the layout has more than `max_length` rows: `too_long=skip` drops the example, `truncate` keeps
    it (the collator builds only its first `max_length` rows, a valid layout since a row sees only earlier rows)
    and counts what is cut; a prompt that alone fills `max_length` leaves nothing to train on and is always
    skipped.
    """
    stats = ExampleStats(max_length=max_length, num_records=len(records))
    examples: list[dict[str, Any]] = []
    for record in records:
        try:
            doc = response_document(record, strip_annotations=strip_annotations, min_promises=min_promises)
            if doc.promises and doc.num_lead_words < min_lead_words:
                doc = Document.plain(plain_text(doc))
                stats.num_trained_plain += 1
            token_doc = tokenize_document(written_counts(doc, tokenizer, counts), tokenizer)
        except SkipRecord as exc:
            stats.skipped[exc.args[0]] += 1
            continue
        except LangError:
            stats.skipped["unparseable"] += 1
            continue
        example = example_from_doc(
            encode_prompt(tokenizer, record.instruction, record.input), token_doc
        )
        rows, num_prompt_ids = num_rows(example), len(example["prompt_ids"])
        if skipped_as_too_long(rows, num_prompt_ids, max_length, too_long):
            stats.skipped["too_long"] += 1
            continue
        if rows > max_length:
            count_cut(stats, num_prompt_ids, token_doc, max_length)
        stats.num_targets += token_doc.num_tokens
        examples.append(example)
    stats.num_used = len(examples)
    if not examples:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(stats.skipped.items())) or "the data is empty"
        raise PastaError(
            f"no usable training records out of {stats.num_records} ({reasons}); give annotated JSONL from "
            "pasta.annotate with data.path=..., or data.strip_annotations=true for Baseline-SFT on plain data"
        )
    return examples, stats


def examples_sha256(examples: list[dict[str, Any]]) -> str:
    """A hash of exactly what was trained on (token ids of every thread, in order)."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(example, sort_keys=True).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()
