"""The annotation stage: a teacher adds PASTA-LANG tags to instruction data, validated and measured, durably.

Run:
    python -m pasta.annotate                                         # structural teacher on the embedded sample
    python -m pasta.annotate data=alpaca_5k                          # the shared 5K Alpaca set
    python -m pasta.annotate teacher=hf data.limit=10                # the embedded SmolLM2 as teacher, offline
    python -m pasta.annotate teacher=openai teacher.model=gpt-4o-mini data=alpaca_5k output=out/a5k.jsonl
    python -m pasta.annotate data.path=my.jsonl data.limit=100 on_reject=keep_unannotated

For each record: records that cannot be used at all (empty response, invalid Unicode, a response that already holds
PASTA-LANG tags) are rejected at once; responses over `max_response_chars` are not sent; the others go to the
teacher, whose answer is validated (pasta.annotation.validate) and measured with the student's tokenizer
(`model`: tokens="N", promises, groups, chunk lengths, theoretical speedup). Accepted records, and with
`on_reject=keep_unannotated` rejected ones as plain responses, go to `output`; the rest, with their reasons, to
`<output stem>.rejects.jsonl`. Lines are appended in input order, whole and fsynced, as answers arrive: a rerun
with the same `output` skips every record already in either file (by record id), so a crash or Ctrl-C loses only
the requests in flight. At the end `<output stem>.summary.json` and a short table report acceptance, reject
reasons, promises per response, chunk lengths and theoretical speedups over everything in the files.

`accelerate launch -m pasta.annotate teacher=hf ...` shards the records over the processes (pasta.parallel), each
with its own copy of the teacher model; the main process gathers their part files into `output` and the rejects file
in input order. (The openai teacher needs no launch: it already sends `teacher.concurrency` requests at once.)
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.annotation import (
    UNUSABLE_CODES,
    Rejected,
    check_original,
    format_table,
    make_record,
    summarize,
    validate_annotation,
)
from pasta.cli import run_entry
from pasta.data import JsonlAppender, iter_numbered_jsonl, load_instructions, record_id, write_json_atomic
from pasta.errors import PastaError
from pasta.lang import add_tag_tokens
from pasta.models import load_tokenizer
from pasta.parallel import ShardedJsonl, current_processes
from pasta.teachers import Teacher, TeacherError, TeacherReply, TeacherRequest, build_teacher

log = logging.getLogger(__name__)

ON_REJECT = ("drop", "keep_unannotated")
_LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class AnnotateConfig:
    """The stage's own keys of conf/annotate.yaml (the groups model, data and teacher are read where used)."""

    output: str = field(metadata={"help": "JSONL of annotated records; the same path resumes a stopped run"})
    on_reject: str = field(
        default="drop", metadata={"help": "drop | keep_unannotated: what happens to a rejected record"}
    )
    max_response_chars: int | None = field(
        default=20000,
        metadata={"help": "longer responses are not sent to the teacher (rejected as too_long)"},
    )
    keep_teacher_output_chars: int = field(
        default=2000, metadata={"help": "characters of a rejected teacher answer kept in its record"}
    )
    progress: bool = field(
        default=True, metadata={"help": "progress bar on a terminal, else a log line every 30 s"}
    )

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> AnnotateConfig:
        stage = cls(
            **{k: OmegaConf.to_container(cfg, resolve=True)[k] for k in cls.__dataclass_fields__ if k in cfg}
        )
        if stage.on_reject not in ON_REJECT:
            raise PastaError(f"on_reject: {stage.on_reject!r} is not one of {', '.join(ON_REJECT)}")
        if stage.max_response_chars is not None and stage.max_response_chars < 1:
            raise PastaError(f"max_response_chars: must be >= 1 or null, got {stage.max_response_chars}")
        if stage.keep_teacher_output_chars < 0:
            raise PastaError(f"keep_teacher_output_chars: must be >= 0, got {stage.keep_teacher_output_chars}")
        return stage


def companion_paths(output: Path) -> tuple[Path, Path]:
    """(rejects file, summary file) beside `output`: x.jsonl -> x.rejects.jsonl, x.summary.json."""
    stem = output.name.removesuffix(".jsonl")
    return output.with_name(f"{stem}.rejects.jsonl"), output.with_name(f"{stem}.summary.json")


def finished_ids(paths: list[Path], teacher: Teacher) -> set[str]:
    """Ids of the records already written; a file made by another teacher is an error, not something to extend."""
    done: set[str] = set()
    for path in paths:
        if not path.is_file():
            continue
        for line_no, record in iter_numbered_jsonl(path):
            made_by = (record.get("teacher"), record.get("teacher_model"))
            if made_by != (teacher.name, teacher.model):
                raise PastaError(
                    f"{path}:{line_no} was written by teacher {made_by[0]} ({made_by[1]}), not {teacher.name} "
                    f"({teacher.model}); choose another output= or rerun with that teacher"
                )
            if "id" not in record:
                raise PastaError(f"{path}:{line_no}: record has no 'id'; is this an annotation output?")
            done.add(record["id"])
    return done


@dataclass
class _Pending:
    """A record on its way to the output, in input order: decided already (`line`), or waiting for the teacher."""

    record_id: str
    source: dict[str, Any]
    line: dict[str, Any] | None = None


@dataclass
class _RunCounts:
    num_written: int = 0
    num_accepted: int = 0
    num_failed_requests: int = 0
    num_requests: int = 0
    last_error: str | None = None
    started: float = field(default_factory=time.monotonic)

    def as_dict(self, num_todo: int, num_already_done: int, num_duplicates: int) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "num_todo": num_todo,
            "num_written": self.num_written,
            "num_accepted": self.num_accepted,
            "num_failed_requests": self.num_failed_requests,
            "num_already_done": num_already_done,
            "num_duplicates_in_input": num_duplicates,
            "elapsed_s": round(elapsed, 2),
            "records_per_s": round(self.num_written / elapsed, 2) if elapsed > 0 else None,
        }


class _Progress:
    """tqdm on a terminal (records/s, ETA, acceptance so far); a log line every 30 s elsewhere."""

    def __init__(self, total: int, enabled: bool, counts: _RunCounts):
        from tqdm.auto import tqdm

        self.counts = counts
        self.total = total
        interactive = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="rec", desc="annotate", disable=not interactive, dynamic_ncols=True)
        self.log_lines = enabled and not interactive
        self.last_log = time.monotonic()

    def update(self) -> None:
        counts = self.counts
        acceptance = counts.num_accepted / counts.num_written if counts.num_written else 0.0
        self.bar.set_postfix(accepted=f"{100 * acceptance:.1f}%", refresh=False)
        self.bar.update(1)
        now = time.monotonic()
        if self.log_lines and now - self.last_log >= _LOG_EVERY_S:
            self.last_log = now
            rate = counts.num_written / max(now - counts.started, 1e-9)
            eta = (self.total - counts.num_written) / rate if rate > 0 else float("inf")
            log.info(
                "%d/%d records, %.1f%% accepted, %.1f records/s, ETA %.0f s",
                counts.num_written, self.total, 100 * acceptance, rate, eta,
            )  # fmt: skip

    def close(self) -> None:
        self.bar.close()


def annotate(cfg: DictConfig) -> dict[str, Any]:
    """Annotate `cfg.data` with `cfg.teacher` into `cfg.output` (resuming); returns the summary it writes."""
    stage = AnnotateConfig.from_cfg(cfg)
    output = Path(stage.output)
    rejects_path, summary_path = companion_paths(output)
    records = load_instructions(cfg.data, check_unicode=False)  # rejected below as invalid_unicode, with a count
    tokenizer = load_tokenizer(cfg.model)
    add_tag_tokens(tokenizer)  # tokens="N" and the schedule count tags as the student will see them
    teacher = build_teacher(cfg.teacher, device=cfg.get("device", "auto"))
    processes = current_processes()
    stores = [ShardedJsonl(path, processes) for path in (output, rejects_path)]
    for store in stores:
        store.gather(_record_id)  # a killed launch's part files: their records are done
    # Opening the appenders first cuts a line that a killed run left half-written, before it is read back.
    with teacher, stores[0].appender() as out, stores[1].appender() as rejected:
        done = finished_ids([output, rejects_path], teacher)
        todo: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        num_duplicates = 0
        for source in records:
            rid = record_id(source)
            if rid in seen:
                num_duplicates += 1
            elif rid not in done:
                todo.append((rid, source))
            seen.add(rid)
        num_already_done = len(seen & done)
        todo = processes.shard(todo)
        log.info(
            "annotating %d records with teacher %s (%s) into %s; %d already done, %d duplicates skipped",
            len(todo), teacher.name, teacher.model, output, num_already_done, num_duplicates,
        )  # fmt: skip
        counts = _RunCounts()
        try:
            _run(stage, teacher, todo, tokenizer, out, rejected, counts)
        except TeacherError as exc:
            raise TeacherError(f"{exc} ({_resume_hint(counts, output)})") from None
        except KeyboardInterrupt:
            raise PastaError(f"interrupted ({_resume_hint(counts, output)})") from None
    if counts.num_requests and counts.num_failed_requests == counts.num_requests:
        raise TeacherError(
            f"the teacher failed all {counts.num_requests} requests of this run (last: {counts.last_error}); "
            "check teacher.model and the endpoint, then rerun to resume"
        )
    input_order = [record_id(source) for source in records]
    for store in stores:
        store.gather(_record_id, order=input_order)
    if not processes.is_main:
        return {}  # the main process summarizes everything the processes wrote
    all_records = [r for path in (output, rejects_path) for _, r in iter_numbered_jsonl(path)]
    summary = {
        "output": str(output),
        "rejects": str(rejects_path),
        "teacher": teacher.name,
        "teacher_model": teacher.model,
        "prompt": _prompt_info(teacher),
        "data": {"name": cfg.data.get("name"), "path": cfg.data.get("path"), "num_records": len(records)},
        "on_reject": stage.on_reject,
        **summarize(all_records),
        "this_run": counts.as_dict(len(todo), num_already_done, num_duplicates),
    }
    write_json_atomic(summary_path, summary)
    print(format_table(summary))
    print(f"wrote {output} ({summary['num_records']} records in all, summary in {summary_path})")
    return summary


def _record_id(record: dict[str, Any]) -> str:
    return record["id"]


def _resume_hint(counts: _RunCounts, output: Path) -> str:
    return f"{counts.num_written} records written this run to {output}; rerun the same command to resume"


def _prompt_info(teacher: Teacher) -> dict[str, str] | None:
    prompt = getattr(teacher, "prompt", None)
    return None if prompt is None else {"name": prompt.name, "sha256": prompt.sha256}


def _run(
    stage: AnnotateConfig,
    teacher: Teacher,
    todo: list[tuple[str, dict[str, Any]]],
    tokenizer,
    out: JsonlAppender,
    rejected: JsonlAppender,
    counts: _RunCounts,
) -> None:
    keep_unannotated = stage.on_reject == "keep_unannotated"
    queue: deque[_Pending] = deque()

    def record(rid: str, source: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return make_record(
            record_id=rid, source=source, teacher=teacher.name, teacher_model=teacher.model, tokenizer=tokenizer,
            keep_teacher_output_chars=stage.keep_teacher_output_chars, **kwargs,
        )  # fmt: skip

    def requests() -> Iterator[TeacherRequest]:
        # Pulled lazily by the teacher: records decided here wait in the queue for the answers before them, so
        # lines are written in input order whatever the teacher's concurrency.
        for rid, source in todo:
            try:
                check_original(
                    source["instruction"], source["input"], source["output"], stage.max_response_chars
                )
            except Rejected as rejection:
                keep = keep_unannotated and rejection.code not in UNUSABLE_CODES
                queue.append(
                    _Pending(
                        rid,
                        source,
                        record(rid, source, reject_reason=rejection.reason, keep_unannotated=keep),
                    )
                )
                continue
            queue.append(_Pending(rid, source))
            counts.num_requests += 1
            yield TeacherRequest(rid, source["instruction"], source["input"], source["output"])

    def write(line: dict[str, Any]) -> None:
        (out if line["annotated"] is not None else rejected).append(line)
        counts.num_written += 1
        counts.num_accepted += bool(line["accepted"])
        progress.update()

    def flush_decided() -> None:
        while queue and queue[0].line is not None:
            write(queue.popleft().line)

    def answer(pending: _Pending, reply: TeacherReply) -> dict[str, Any]:
        rid, source = pending.record_id, pending.source
        reason = reply.reject_reason
        if reason is None:
            try:
                doc = validate_annotation(source["output"], reply.text)
                return record(rid, source, doc=doc)
            except Rejected as rejection:
                reason = rejection.reason
        return record(
            rid, source, reject_reason=reason, keep_unannotated=keep_unannotated, teacher_output=reply.text
        )

    progress = _Progress(len(todo), stage.progress, counts)
    replies = teacher.annotate(requests())
    try:
        for reply in replies:
            flush_decided()
            pending = queue.popleft()
            if pending.record_id != reply.id:
                raise RuntimeError(
                    f"teacher {teacher.name} answered {reply.id} out of order (expected {pending.record_id})"
                )
            if reply.error is not None:
                counts.num_failed_requests += 1  # not an answer: nothing written, a rerun asks again
                counts.last_error = reply.error
                progress.update()
                continue
            write(answer(pending, reply))
        flush_decided()
    finally:
        if hasattr(replies, "close"):  # a generator: stops the teacher's workers and cancels what is queued
            replies.close()
        progress.close()


cli = run_entry(annotate, "annotate")

if __name__ == "__main__":
    cli()
