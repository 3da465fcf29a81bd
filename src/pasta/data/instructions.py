"""Load instruction data (Alpaca format) and the AlpacaEval set from a local file or the hub, as a `data:` or
`eval_data:` config (conf/data/*.yaml, conf/eval_data/*.yaml) describes it.

Local files are .jsonl (one object a line) or .json (a list of objects, Stanford Alpaca's format). When the
configured `path` is null or absent and a `hub_id` is set, the hub dataset is used instead (the shared 5k/805
files exist beside the checkout in CI, not on a user's machine). A record that lacks a required field, or whose
field is not a string, is an error naming the file, line (or record number) and field; `on_error: skip` logs and
drops such records instead. Extra fields (such as `annotated`) are kept.

`data.format=sharegpt` reads ShareGPT conversations (pasta.data.sharegpt); `data.answer_paths`, `data.pick` and
`data.max_output_chars` keep one answer per prompt from several files that answer the same prompts
(pasta.data.answers). Training stages and annotation read data through `load_training_records`, which also leaves
out every record whose prompt is in the held-out evaluation pool (pasta.data.heldout) and reports how many.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pasta.choice import Choice
from pasta.config import check_ranges, schema_from
from pasta.data.answers import Pick, pick_answers
from pasta.data.heldout import is_heldout, leave_out_heldout
from pasta.data.jsonl import OnError, invalid_unicode, iter_numbered_jsonl, read_json_file
from pasta.data.sharegpt import SystemPrompt, conversation_record
from pasta.errors import PastaError

log = logging.getLogger(__name__)


class DataFormat(Choice):
    """How a data set's records are written."""

    alpaca = "alpaca"
    sharegpt = "sharegpt"


@dataclass(frozen=True)
class DataConfig:
    """Where a data set comes from and which records of it to take (shuffle, then offset, then limit)."""

    name: str = field(metadata={"help": "short name, used in run outputs"})
    path: str | None = field(default=None, metadata={"help": "local .jsonl or .json file; null = use hub_id"})
    hub_id: str | None = field(default=None, metadata={"help": "hub dataset id, used when path is null or absent"})
    hub_config: str | None = field(default=None, metadata={"help": "hub dataset configuration name"})
    split: str = field(default="train", metadata={"help": "hub dataset split"})
    limit: int | None = field(default=None, metadata={"help": "take at most this many records; null = all"})
    offset: int = field(default=0, metadata={"help": "skip this many records first"})
    shuffle: bool = field(default=False, metadata={"help": "shuffle before offset and limit"})
    seed: int = field(default=0, metadata={"help": "seed of the shuffle"})
    on_error: OnError = field(default=OnError.fail, metadata={"help": "bad record: fail (one-line error) or skip (log)"})
    extra_paths: list[str] = field(
        default_factory=list,
        metadata={"help": "more local .jsonl/.json files (glob patterns allowed) whose records follow the selected ones "
                          "whole (shuffle, offset and limit apply to `path` only), e.g. a preference run's "
                          "`round-*/forking.jsonl`: its students' own well-formed forking answers, as SFT data"},
    )
    format: DataFormat = field(
        default=DataFormat.alpaca,
        metadata={"help": "alpaca: `instruction`, `input`, `output` records | sharegpt: `conversations` of "
                          "system/human/gpt turns, one exchange a record (a malformed one is skipped and counted)"},
    )
    system_prompt: SystemPrompt = field(
        default=SystemPrompt.prepend,
        metadata={"help": "format=sharegpt: a system turn goes in front of the instruction (prepend) or is dropped"},
    )
    answer_paths: list[str] = field(
        default_factory=list,
        metadata={"help": "more local files answering the same prompts as `path` (matched by normalised prompt "
                          "text); one answer per prompt is kept, by `pick`"},
    )
    pick: Pick = field(
        default=Pick.first,
        metadata={"help": "with answer_paths: first (path's answer, then the next file's), shortest, or "
                          "shortest_with_list (the shortest laid out as a list or in sections, else the shortest)"},
    )
    max_output_chars: int | None = field(
        default=None,
        metadata={"help": "answers longer than this many characters are not used (null = any length); a prompt "
                          "left without an answer is dropped and counted"},
    )

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "offset": (lambda v: v >= 0, ">= 0"),
            "limit": (lambda v: v is None or v >= 0, ">= 0 or null"),
            "max_output_chars": (lambda v: v is None or v >= 1, ">= 1 or null"),
        })


@dataclass(frozen=True)
class Record:
    """One Alpaca-format instruction record, as `load_instructions` gives it.

    `annotated` and `accepted` are what pasta.annotate adds; any other field of the file (its `id`, the teacher's
    statistics) is kept, untyped, in `extra`.
    """

    instruction: str
    output: str
    input: str = ""
    annotated: str | None = None  # the PASTA-LANG annotation of `output`; None: none (plain data, a rejected record)
    accepted: bool = True  # False: pasta.annotate rejected the annotation; hand-written data has no such field
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def id(self) -> str:
        """The record's one id, what every stage resumes and dedups by: a hash of instruction, input and output, so
        the same text has the same id on any machine."""
        content = json.dumps([self.instruction, self.input, self.output])
        return hashlib.sha256(content.encode("utf-8")).hexdigest()[:16]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Record:
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        typed = {name: raw[name] for name in names if name in raw}
        return cls(**typed, extra={k: v for k, v in raw.items() if k not in typed})


@dataclass
class LoadReport:
    """What loading left out and why: train_info.json and the annotation summary keep it."""

    num_heldout_left_out: int = 0  # records whose prompt is in the held-out evaluation pool
    num_malformed: int = 0  # format=sharegpt records that are not one system/human/gpt exchange
    num_too_long: int = 0  # prompts without an answer within max_output_chars
    answer_sources: dict[str, int] = field(default_factory=dict)  # with answer_paths: answers kept per file

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def why_empty(self) -> str:
        """Why loading kept no record, in words: what it left out, else an empty window of the data."""
        left_out = [f"{count} {why}" for count, why in (
            (self.num_malformed, "malformed ShareGPT records skipped"),
            (self.num_heldout_left_out, "records of the held-out pool left out"),
            (self.num_too_long, "answers over data.max_output_chars left out")) if count]
        return ", ".join(left_out) or ("the data is empty, or data.offset/data.limit select none of it (records "
                                       "skipped under data.on_error=skip are logged)")


def _raw_records(cfg: DataConfig, group: str, check_unicode: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (where, record) pairs, `where` naming the record for error messages; `group` is the config key."""
    if cfg.path is not None and Path(cfg.path).is_file():
        yield from _file_records(Path(cfg.path), cfg.on_error, check_unicode)
        return
    if cfg.path is not None and Path(cfg.path).exists():  # a folder, say: not a reason to train on the hub's copy
        raise PastaError(f"data {cfg.name}: {group}.path={cfg.path} is not a file (a .jsonl or .json of records)")
    if cfg.hub_id is None:
        raise PastaError(f"data {cfg.name}: file not found: {cfg.path}; set {group}.path=/path/to/file.jsonl")
    if cfg.path is not None:
        log.info("data %s: %s not found, loading %s from the hub", cfg.name, cfg.path, cfg.hub_id)
    for index, record in enumerate(_hub_records(cfg, group), start=1):
        yield f"{cfg.hub_id}[{cfg.split}] record {index}", record


def _converted(records: Iterator[tuple[str, Any]], cfg: DataConfig, report: LoadReport, leave_out: bool
               ) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records as instruction records: ShareGPT conversations converted, malformed ones skipped and counted;
    with `leave_out`, one whose human or system turn is a held-out prompt too (data.system_prompt may drop the latter)."""
    if cfg.format != DataFormat.sharegpt:
        yield from records
        return
    for where, raw in records:
        converted = conversation_record(raw, cfg.system_prompt)
        if isinstance(converted, str):
            report.num_malformed += 1
            if report.num_malformed <= 3:  # the count says the rest
                log.warning("skipping %s: malformed ShareGPT record (%s)", where, converted)
            continue
        # Both turns, whatever data.system_prompt keeps: the answer of a pool prompt given as the system turn is the
        # pool's answer too.
        human, system = converted.pop("human"), converted.pop("system")
        if leave_out and (is_heldout(human) or is_heldout(system)):
            report.num_heldout_left_out += 1
            continue
        yield where, converted


def _file_records(path: Path, on_error: OnError, check_unicode: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    if path.suffix == ".json":
        yield from _json_records(path, on_error, check_unicode)
    else:
        for line_no, record in iter_numbered_jsonl(path, on_error, check_unicode):
            yield f"{path}:{line_no}", record


def extra_files(cfg: DataConfig, group: str) -> list[Path]:
    """The files of `extra_paths`, each pattern's matches sorted; a pattern that matches no file is an error (a typo
    would otherwise train on less data without a word)."""
    files: list[Path] = []
    for pattern in cfg.extra_paths:
        matches = sorted(Path(m) for m in glob.glob(pattern, recursive=True) if Path(m).is_file())
        if not matches:
            raise PastaError(f"{group}.extra_paths: no file matches {pattern!r}")
        files.extend(matches)
    return files


def _json_records(path: Path, on_error: OnError, check_unicode: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    records = read_json_file(path, check_unicode=check_unicode)
    if not isinstance(records, list):
        raise PastaError(f"{path}: expected a JSON list of records, got {type(records).__name__}")
    for index, record in enumerate(records, start=1):
        if isinstance(record, dict):
            yield f"{path}: record {index}", record
        elif on_error == OnError.fail:
            raise PastaError(f"{path}: record {index}: expected a JSON object, got {type(record).__name__}")
        else:
            log.warning("skipping %s: record %d: not a JSON object", path, index)


def _hub_records(cfg: DataConfig, group: str) -> Iterator[dict[str, Any]]:
    import datasets

    try:
        dataset = datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=cfg.split)
    except Exception as exc:  # datasets raises many types (offline, not found, gated); all mean "not available"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        local = f"{cfg.path} is absent" if cfg.path else f"{group}.path is not set"
        raise PastaError(
            f"data {cfg.name}: {local} and hub dataset {cfg.hub_id} could not be loaded ({first}); "
            f"set {group}.path=/path/to/file.jsonl"
        ) from None
    yield from dataset


def _answer_files(cfg: DataConfig, group: str) -> list[Path]:
    """The files of `answer_paths`; a missing one is an error naming it and the key."""
    for index, path in enumerate(cfg.answer_paths):
        if not Path(path).is_file():
            raise PastaError(f"data {cfg.name}: file not found: {path}; set {group}.answer_paths[{index}]="
                             "/path/to/file.json")
    return [Path(path) for path in cfg.answer_paths]


def _checked(
    records: Iterator[tuple[str, dict[str, Any]]],
    required: tuple[str, ...],
    optional: tuple[str, ...],
    on_error: OnError,
    check_unicode: bool = True,
    check_lang: bool = False,
) -> list[dict[str, Any]]:
    kept = []
    for where, record in records:
        problem = next((f"missing field '{f}'" for f in required if f not in record), None)
        problem = problem or next(
            (f"field '{f}' is not a string" for f in required + optional
             if f in record and not isinstance(record[f], str)),
            None,
        )
        problem = problem or _annotation_problem(record)
        if check_lang:
            problem = problem or _lang_problem(record)
        if check_unicode:  # hub records: files are checked as they are read
            problem = problem or invalid_unicode(record)
        if problem is None:
            kept.append(record)
        elif on_error == OnError.fail:
            raise PastaError(f"{where}: {problem}")
        else:
            log.warning("skipping %s: %s", where, problem)
    return kept


def _annotation_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the fields pasta.annotate writes, if they are present."""
    if record.get("annotated") is not None and not isinstance(record["annotated"], str):
        return "field 'annotated' is not a string or null"
    if "accepted" in record and not isinstance(record["accepted"], bool):
        return "field 'accepted' is not true or false"
    return None


def _lang_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the PASTA-LANG of a record that training would use (not `accepted: false`)."""
    annotated = record.get("annotated")
    if record.get("accepted") is False or not isinstance(annotated, str) or not annotated.strip():
        return None
    from pasta.lang import LangError, parse  # the language pulls in torch: only for files that need it

    try:
        parse(annotated)
    except LangError as exc:
        return f"field 'annotated' is not well-formed PASTA-LANG ({exc})"
    return None


def _select(records: list, cfg: DataConfig) -> list:
    if cfg.shuffle:
        records = records.copy()
        random.Random(cfg.seed).shuffle(records)
    end = None if cfg.limit is None else cfg.offset + cfg.limit
    return records[cfg.offset : end]


def load_instructions(data_cfg: DataConfig | DictConfig | dict[str, Any], check_unicode: bool = True) -> list[Record]:
    """The data's records (`input` "" when absent, extra fields kept in `Record.extra`).

    `check_unicode=False` keeps records whose text is not valid Unicode, for a stage that rejects them itself. A
    stage that trains on the records reads them with `load_training_records` instead.
    """
    cfg = schema_from(data_cfg, DataConfig, "data", only_known=True)
    records, _ = _selected_records(cfg, "data", ("instruction", "output"), ("input",), check_unicode)
    return [Record.from_dict(record) for record in records]


def load_training_records(data_cfg: DataConfig | DictConfig | dict[str, Any], check_unicode: bool = True
                          ) -> tuple[list[Record], LoadReport]:
    """The data's records as `load_instructions` gives them, less every record whose prompt is in the held-out
    evaluation pool (whatever the data config says: pasta.data.heldout), and the report of what was left out.

    Every stage that trains on records, or annotates them for training, reads them here: SFT and Baseline-SFT,
    the preference stage's prompts, `extra_paths` (a round's forking.jsonl) and pasta.annotate.
    """
    cfg = schema_from(data_cfg, DataConfig, "data", only_known=True)
    records, report = _selected_records(cfg, "data", ("instruction", "output"), ("input",), check_unicode,
                                        leave_out=True)
    if report.num_heldout_left_out:
        log.warning("data %s: left out %d records whose prompt is in the held-out evaluation pool (eval.subset=300 "
                    "eval.subset_seed=0 of AlpacaEval)", cfg.name, report.num_heldout_left_out)
    return [Record.from_dict(record) for record in records], report


def _selected_records(
    cfg: DataConfig, group: str, required: tuple[str, ...], optional: tuple[str, ...], check_unicode: bool,
    leave_out: bool = False,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """The checked records of `path` (or the hub), one answer per prompt with `answer_paths`, those within
    `max_output_chars`, without the held-out pool's when `leave_out`, after shuffle, offset and limit; then every
    `extra_paths` file's (Alpaca format, whole but for the held-out pool's)."""
    report = LoadReport()
    extras = extra_files(cfg, group)  # before the main file is read: a typo fails at once

    def checked(records: Iterator[tuple[str, Any]]) -> list[dict[str, Any]]:
        return _checked(_converted(records, cfg, report, leave_out), required, optional, cfg.on_error,
                        check_unicode)

    records = checked(_raw_records(cfg, group, check_unicode))
    if report.num_malformed:
        log.warning("data %s: skipped %d malformed ShareGPT records", cfg.name, report.num_malformed)
    if leave_out:
        records, num_left_out = leave_out_heldout(records)
        report.num_heldout_left_out += num_left_out
    answer_files = _answer_files(cfg, group)
    if answer_files:
        files = [records]
        for path in answer_files:  # their held-out prompts are `path`'s too: counted once, above
            files.append(leave_out_heldout(checked(_file_records(path, cfg.on_error, check_unicode)))[0]
                         if leave_out else checked(_file_records(path, cfg.on_error, check_unicode)))
        answers, report.num_too_long = pick_answers(files, cfg.pick, cfg.max_output_chars)
        records = [answer.record for answer in answers]
        names = [Path(cfg.path).name if cfg.path else str(cfg.hub_id)] + [path.name for path in answer_files]
        report.answer_sources = {name: sum(a.source == i for a in answers) for i, name in enumerate(names)}
    elif cfg.max_output_chars is not None:
        fitting = [record for record in records if len(record["output"]) <= cfg.max_output_chars]
        report.num_too_long = len(records) - len(fitting)
        records = fitting
    records = _select(records, cfg)
    for path in extras:
        # An extra file is SFT data as it stands (a round's forking.jsonl): a record whose annotation does not parse
        # is a bad record, not one to drop unseen; the main file's go to pasta.annotate's checks and are counted.
        raw = list(_file_records(path, cfg.on_error, check_unicode))
        extra = _checked(iter(raw), required, optional, cfg.on_error, check_unicode, check_lang=group == "data")
        if len(extra) < len(raw):
            log.warning("%s.extra_paths: skipped %d of %d records of %s (%s.on_error=skip)", group,
                        len(raw) - len(extra), len(raw), path, group)
        if leave_out:
            extra, num_left_out = leave_out_heldout(extra)
            report.num_heldout_left_out += num_left_out
        records.extend(extra)
    return records, report


def load_alpaca_eval(eval_data_cfg: DataConfig | DictConfig | dict[str, Any]) -> list[dict[str, Any]]:
    """AlpacaEval records: `instruction`, `output` (the reference answer), `generator` and `dataset`.

    `generator` defaults to "reference" and `dataset` to the config's name when a file leaves them out.
    """
    cfg = schema_from(eval_data_cfg, DataConfig, "eval_data", only_known=True)
    records, _ = _selected_records(cfg, "eval_data", ("instruction", "output"), ("generator", "dataset"), True)
    for record in records:
        record.setdefault("generator", "reference")
        record.setdefault("dataset", cfg.name)
    return records
