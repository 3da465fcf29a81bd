"""Annotated records -> token-level training examples, with an account of every record that was left out.

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
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.errors import PastaError
from pasta.lang import (
    Document,
    LangError,
    Text,
    TokenChunk,
    TokenDoc,
    fill_token_counts,
    parse,
    plain_text,
    tokenize_document,
)
from pasta.lang.tokens import TagIds
from pasta.models import encode_prompt


@dataclass
class ExampleStats:
    """What happened to each record: used, or why it was left out; truncated examples are used and counted."""

    num_records: int = 0
    num_used: int = 0
    num_truncated: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_records": self.num_records,
            "num_used": self.num_used,
            "num_truncated": self.num_truncated,
            "skipped": dict(sorted(self.skipped.items())),
        }


# `data.strip_annotations` and `data.min_promises` ride on the data config but are training's own switches, not
# loader fields.
TRAINING_DATA_KEYS = ("strip_annotations", "min_promises")


def loader_config(data_cfg: DictConfig) -> dict[str, Any]:
    """`cfg.data` without training's own keys, for `pasta.data.load_instructions`."""
    raw = OmegaConf.to_container(data_cfg, resolve=True)
    return {k: v for k, v in raw.items() if k not in TRAINING_DATA_KEYS}


class SkipRecord(Exception):
    """A record that is left out of training; `args[0]` is the reason counted in `ExampleStats.skipped`."""


def with_min_promises(records: list[dict[str, Any]], min_promises: int) -> list[dict[str, Any]]:
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


def response_document(record: dict[str, Any], *, strip_annotations: bool, min_promises: int = 0) -> Document:
    """The response to train on; raises SkipRecord (or LangError for a malformed annotation) when unusable.

    A record marked `accepted: false` is not used; one without `accepted` (hand-written data) is. Baseline-SFT of a
    plain Alpaca file (no `annotated` field) trains on `output`. `min_promises` leaves out records whose annotation
    has fewer promises, before any stripping, so Baseline-SFT with the same setting keeps the same records.
    """
    if record.get("accepted", True) is False:
        raise SkipRecord("not_accepted")
    annotated = record.get("annotated")
    if not isinstance(annotated, str) or not annotated.strip():
        if min_promises > 0:
            raise SkipRecord("too_few_promises")
        if strip_annotations and isinstance(record.get("output"), str):
            return Document((Text(record["output"]),))
        raise SkipRecord("no_annotation")
    doc = parse(annotated)
    if len(doc.promises) < min_promises:
        raise SkipRecord("too_few_promises")
    if strip_annotations:
        return Document((Text(plain_text(doc)),))
    return doc


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
        TokenChunk(opener_ids=list(o), body_ids=list(b), num_predicted=int(n))
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


def build_sft_examples(
    records: list[dict[str, Any]],
    tokenizer,
    *,
    strip_annotations: bool,
    max_length: int,
    too_long: str,
    min_promises: int = 0,
) -> tuple[list[dict[str, Any]], ExampleStats]:
    """Token-level examples of the usable records, and the account of all records (see the module docstring).

    `min_promises` keeps only records whose annotation holds at least that many promises (`data.min_promises`):
    rule-based teachers annotate a small share of Alpaca, and a small student given mostly plain answers does not
    learn to open one with a promise.

    Too long means the layout has more than `max_length` rows: `too_long=skip` drops the example, `truncate` keeps
    it (the collator cuts it to its first `max_length` rows, a valid layout since a row sees only earlier rows); a
    prompt that alone fills `max_length` leaves nothing to train on and is always skipped.
    """
    stats = ExampleStats(num_records=len(records))
    examples: list[dict[str, Any]] = []
    for record in records:
        try:
            doc = response_document(record, strip_annotations=strip_annotations, min_promises=min_promises)
            token_doc = tokenize_document(fill_token_counts(doc, tokenizer), tokenizer)
        except SkipRecord as exc:
            stats.skipped[exc.args[0]] += 1
            continue
        except LangError:
            stats.skipped["unparseable"] += 1
            continue
        example = example_from_doc(
            encode_prompt(tokenizer, record["instruction"], record.get("input", "")), token_doc
        )
        if num_rows(example) > max_length:
            if too_long == "skip" or len(example["prompt_ids"]) >= max_length:
                stats.skipped["too_long"] += 1
                continue
            stats.num_truncated += 1
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
