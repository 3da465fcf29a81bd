"""The annotation stage's body (run it with `python -m pasta.annotate`, whose docstring has the command lines).

For each record: records that cannot be used at all (empty response, invalid Unicode, a response that already holds
PASTA-LANG tags) are rejected at once; responses over `max_response_chars` are not sent; the others go to the
teacher, whose answer is validated (pasta.annotation.validate) and measured with the student's tokenizer
(`model`: tokens="N", promises, groups, chunk lengths, and under the `lang.reservation` policy training uses the
theoretical speedup and the main thread's tag steps; cross-thread repetition). The held-out evaluation pool's
prompts are left out before anything is sent (pasta.data.load_training_records). Accepted records, and with
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
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pasta.annotation.config import AnnotateConfig, OnReject, companion_paths
from pasta.annotation.progress import Progress, RunCounts
from pasta.annotation.records import make_record
from pasta.annotation.summary import format_table, summarize
from pasta.annotation.validate import UNUSABLE_CODES, Rejected, check_original, validate_annotation
from pasta.config import schema_from
from pasta.data import (
    JsonlAppender,
    Record,
    check_output_file,
    iter_numbered_jsonl,
    load_training_records,
    write_json_atomic,
)
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, add_tag_tokens
from pasta.models import load_tokenizer
from pasta.parallel import ShardedJsonl, current_processes
from pasta.teachers import Teacher, TeacherError, TeacherReply, TeacherRequest, build_teacher

log = logging.getLogger(__name__)


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

    source: Record
    line: dict[str, Any] | None = None


def annotate(cfg: DictConfig) -> dict[str, Any]:
    """Annotate `cfg.data` with `cfg.teacher` into `cfg.output` (resuming); returns the summary it writes."""
    stage = schema_from(cfg, AnnotateConfig, "", only_known=True)
    output = check_output_file(stage.output, "output")
    rejects_path, summary_path = companion_paths(output)
    # Annotations are training data: the held-out pool's prompts are left out here already (and counted). Records
    # that are not valid Unicode are kept, to be rejected below as invalid_unicode with a count.
    records, loaded = load_training_records(cfg.data, check_unicode=False)
    tokenizer = load_tokenizer(cfg.model)
    add_tag_tokens(tokenizer)  # tokens="N" and the schedule count tags as the student will see them
    teacher = build_teacher(cfg.teacher, device=cfg.get("device", "auto"))
    processes = current_processes()
    stores = [ShardedJsonl(path, processes, key="id") for path in (output, rejects_path)]
    for store in stores:
        # Cuts a line a killed run left half-written and folds in a killed launch's parts: their records are done.
        store.gather()
    with teacher, stores[0].appender() as out, stores[1].appender() as rejected:
        todo, num_already_done, num_duplicates = _todo(records, finished_ids([output, rejects_path], teacher))
        todo = processes.shard(todo)
        log.info(
            "annotating %d records with teacher %s (%s) into %s; %d already done, %d duplicates skipped",
            len(todo), teacher.name, teacher.model, output, num_already_done, num_duplicates,
        )  # fmt: skip
        counts = RunCounts()
        try:
            counted = ReservationPolicy.from_config(cfg.lang.reservation).counts
            _InputOrderWriter(stage, teacher, tokenizer, out, rejected, counts, counted).run(todo)
        except TeacherError as exc:
            raise TeacherError(f"{exc} ({_resume_hint(counts, output)})") from None
        except KeyboardInterrupt:
            raise PastaError(f"interrupted ({_resume_hint(counts, output)})") from None
    if counts.num_requests and counts.num_failed_requests == counts.num_requests:
        raise TeacherError(
            f"the teacher failed all {counts.num_requests} requests of this run (last: {counts.last_error}); "
            "check teacher.model and the endpoint, then rerun to resume"
        )
    input_order = [source.id for source in records]
    for store in stores:
        store.gather(order=input_order)
    if not processes.is_main:
        return {}  # the main process summarizes everything the processes wrote
    all_records = [r for path in (output, rejects_path) for _, r in iter_numbered_jsonl(path)]
    summary = {
        "output": str(output),
        "rejects": str(rejects_path),
        "teacher": teacher.name,
        "teacher_model": teacher.model,
        "prompt": _prompt_info(teacher),
        "data": {"name": cfg.data.get("name"), "path": cfg.data.get("path"), "num_records": len(records),
                 "loaded": loaded.as_dict()},
        "on_reject": stage.on_reject,
        **summarize(all_records),
        "this_run": counts.as_dict(len(todo), num_already_done, num_duplicates),
    }
    write_json_atomic(summary_path, summary)
    print(format_table(summary))
    print(f"wrote {output} ({summary['num_records']} records in all, summary in {summary_path})")
    return summary


def _todo(records: list[Record], done: set[str]) -> tuple[list[Record], int, int]:
    """The records not yet written, the first of duplicates only; and the counts of records already done and of
    duplicates skipped."""
    todo: list[Record] = []
    seen: set[str] = set()
    num_duplicates = 0
    for source in records:
        if source.id in seen:
            num_duplicates += 1
        elif source.id not in done:
            todo.append(source)
        seen.add(source.id)
    return todo, len(seen & done), num_duplicates


def _resume_hint(counts: RunCounts, output: Path) -> str:
    return f"{counts.num_written} records written this run to {output}; rerun the same command to resume"


def _prompt_info(teacher: Teacher) -> dict[str, str] | None:
    prompt = getattr(teacher, "prompt", None)
    return None if prompt is None else {"name": prompt.name, "sha256": prompt.sha256}


class _InputOrderWriter:
    """Sends the records to the teacher and writes each one, answered or decided here, in input order.

    Records rejected before any request (empty, too long, ...) are decided at once but wait in the queue behind the
    answers before them, so the files keep the input order whatever the teacher's concurrency.
    """

    def __init__(self, stage: AnnotateConfig, teacher: Teacher, tokenizer, out: JsonlAppender,
                 rejected: JsonlAppender, counts: RunCounts, counted: bool = False):  # fmt: skip
        self.stage, self.teacher, self.tokenizer, self.counted = stage, teacher, tokenizer, counted
        self.out, self.rejected, self.counts = out, rejected, counts
        self.keep_unannotated = stage.on_reject == OnReject.keep_unannotated
        self.queue: deque[_Pending] = deque()
        self.progress: Progress | None = None

    def run(self, todo: list[Record]) -> None:
        self.progress = Progress(len(todo), self.stage.progress, self.counts)
        replies = self.teacher.annotate(self._requests(todo))
        try:
            for reply in replies:
                self._flush_decided()
                pending = self.queue.popleft()
                if pending.source.id != reply.id:
                    raise RuntimeError(
                        f"teacher {self.teacher.name} answered {reply.id} out of order "
                        f"(expected {pending.source.id})"
                    )
                if reply.error is not None:
                    self.counts.num_failed_requests += 1  # not an answer: nothing written, a rerun asks again
                    self.counts.last_error = reply.error
                    self.progress.update()
                    continue
                self._write(self._answer(pending, reply))
            self._flush_decided()
        finally:
            if hasattr(replies, "close"):  # a generator: stops the teacher's workers and cancels what is queued
                replies.close()
            self.progress.close()

    def _record(self, source: Record, **kwargs: Any) -> dict[str, Any]:
        return make_record(
            source=source, teacher=self.teacher.name, teacher_model=self.teacher.model,
            tokenizer=self.tokenizer, keep_teacher_output_chars=self.stage.keep_teacher_output_chars,
            counted=self.counted, **kwargs,
        )  # fmt: skip

    def _requests(self, todo: list[Record]) -> Iterator[TeacherRequest]:
        # Pulled lazily by the teacher, so a record decided here is queued only after the requests before it.
        for source in todo:
            try:
                check_original(source.instruction, source.input, source.output, self.stage.max_response_chars)
            except Rejected as rejection:
                keep = self.keep_unannotated and rejection.code not in UNUSABLE_CODES
                line = self._record(source, reject_reason=rejection.reason, keep_unannotated=keep)
                self.queue.append(_Pending(source, line))
                continue
            self.queue.append(_Pending(source))
            self.counts.num_requests += 1
            yield TeacherRequest(source.id, source.instruction, source.input, source.output)

    def _write(self, line: dict[str, Any]) -> None:
        (self.out if line["annotated"] is not None else self.rejected).append(line)
        self.counts.num_written += 1
        self.counts.num_accepted += bool(line["accepted"])
        self.progress.update()

    def _flush_decided(self) -> None:
        while self.queue and self.queue[0].line is not None:
            self._write(self.queue.popleft().line)

    def _answer(self, pending: _Pending, reply: TeacherReply) -> dict[str, Any]:
        source = pending.source
        reason = reply.reject_reason
        if reason is None:
            try:
                return self._record(source, doc=validate_annotation(source.output, reply.text))
            except Rejected as rejection:
                reason = rejection.reason
        return self._record(
            source, reject_reason=reason, keep_unannotated=self.keep_unannotated, teacher_output=reply.text
        )
