"""The annotation stage's own settings (conf/annotate.yaml), checked, and the files it writes beside `output`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pasta.choice import Choice
from pasta.config import check_ranges


class OnReject(Choice):
    drop = "drop"
    keep_unannotated = "keep_unannotated"


@dataclass(frozen=True)
class AnnotateConfig:
    """The stage's own keys of conf/annotate.yaml (the groups model, data and teacher are read where used)."""

    output: str = field(metadata={"help": "JSONL of annotated records; the same path resumes a stopped run"})
    on_reject: OnReject = field(
        default=OnReject.drop,
        metadata={"help": "a rejected record: drop (to the rejects file) or keep_unannotated (plain, in the output)"},
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

    def validate(self, where: str) -> None:
        # The stage's keys are top-level keys of conf/annotate.yaml: `where` is empty, the messages name the key.
        check_ranges(self, where, {
            "max_response_chars": (lambda v: v is None or v >= 1, ">= 1 or null"),
            "keep_teacher_output_chars": (lambda v: v >= 0, ">= 0"),
        })


def companion_paths(output: Path) -> tuple[Path, Path]:
    """(rejects file, summary file) beside `output`: x.jsonl -> x.rejects.jsonl, x.summary.json."""
    stem = output.name.removesuffix(".jsonl")
    return output.with_name(f"{stem}.rejects.jsonl"), output.with_name(f"{stem}.summary.json")
