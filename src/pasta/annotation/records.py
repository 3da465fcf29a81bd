"""The records the annotation stage writes: one JSON object per input record, with structure stats.

    {"id", "instruction", "input", "output",          # the original record; output is the original response
     "annotated",                                      # inline PASTA-LANG with tokens="N" (null when dropped)
     "accepted", "reject_reason",                      # reason is `code: detail`, null when accepted
     "teacher", "teacher_model",
     "num_promises", "num_groups", "chunk_tokens",     # structure stats, measured with the student's tokenizer
     "num_tokens", "num_steps", "theoretical_speedup",  # of the form training uses (lang.reservation: uncounted)
     "num_tag_steps", "repetition",                    # main-thread tag steps; cross-thread repetition share
     "teacher_output"}                                 # rejected answers only, cut to keep_teacher_output_chars

A record kept unannotated (`on_reject=keep_unannotated`) has `annotated` = the original response, no promises and
a speedup of 1; a dropped record has `annotated` and the stats null.
"""

from __future__ import annotations

from typing import Any

from pasta.data import Record
from pasta.lang import (
    Document,
    cross_thread_repetition,
    drop_token_counts,
    fill_token_counts,
    schedule,
    serialize,
    tokenize_document,
)

STAT_FIELDS = ("num_promises", "num_groups", "chunk_tokens", "num_tokens", "num_steps", "theoretical_speedup",
               "num_tag_steps", "repetition")


def measure(doc: Document, tokenizer, counted: bool = False) -> tuple[str, dict[str, Any]]:
    """The inline form with `tokens=` from `tokenizer` (which must hold the PASTA-LANG tag tokens) and its stats.

    The schedule is the one training sees: promises without `tokens=` unless `counted` (the reservation policy's
    `counts`); the inline form keeps the counts either way (training drops them under the uncounted policy).
    """
    doc = fill_token_counts(doc, tokenizer)
    plan = schedule(tokenize_document(doc if counted else drop_token_counts(doc), tokenizer))
    stats = {
        "num_promises": len(doc.promises),
        "num_groups": len(doc.groups),
        "chunk_tokens": [promise.num_tokens for promise in doc.promises],
        "num_tokens": plan.num_tokens,
        "num_steps": plan.num_steps,
        "theoretical_speedup": round(plan.theoretical_speedup, 4),
        "num_tag_steps": plan.num_tag_steps,
        "repetition": None if not doc.promises else cross_thread_repetition(doc).share,
    }
    return serialize(doc), stats


def writable(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (lone surrogates) escaped, so the line can be written."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def make_record(
    *,
    source: Record,
    teacher: str,
    teacher_model: str,
    doc: Document | None = None,
    reject_reason: str | None = None,
    keep_unannotated: bool = False,
    teacher_output: str | None = None,
    tokenizer=None,
    keep_teacher_output_chars: int = 2000,
    counted: bool = False,
) -> dict[str, Any]:
    """One output line. Accepted: give `doc`. Rejected: give `reject_reason`, and `keep_unannotated` to keep it."""
    instruction, input_text, output = (
        writable(text) for text in (source.instruction, source.input, source.output)
    )
    record: dict[str, Any] = {
        "id": source.id,
        "instruction": instruction,
        "input": input_text,
        "output": output,
        "annotated": None,
        "accepted": reject_reason is None,
        "reject_reason": None if reject_reason is None else writable(reject_reason),  # it may quote the reply
        "teacher": teacher,
        "teacher_model": teacher_model,
        **dict.fromkeys(STAT_FIELDS),
    }
    if reject_reason is None:
        assert doc is not None, "an accepted record needs its document"
        record["annotated"], stats = measure(doc, tokenizer, counted)
        record.update(stats)
    elif keep_unannotated:
        record["annotated"], stats = measure(Document.plain(output), tokenizer, counted)
        record.update(stats)
    if reject_reason is not None and teacher_output is not None:
        cut = teacher_output[:keep_teacher_output_chars]
        record["teacher_output"] = writable(cut) + ("..." if len(teacher_output) > len(cut) else "")
    return record
