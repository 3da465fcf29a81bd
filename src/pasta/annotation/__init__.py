"""The annotation stage's parts: validating a teacher's answer, the records it writes, and the run summary.

The stage itself (reading data, resuming, sharding, writing in input order) is pasta.annotation.stage, run by
`python -m pasta.annotate`; its settings are pasta.annotation.config; the teachers are pasta.teachers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.annotation.summary import format_table, summarize
from pasta.annotation.validate import (
    UNUSABLE_CODES,
    Rejected,
    check_original,
    realign_whitespace,
    reason_code,
    validate_annotation,
)
from pasta.lazy import lazy_exports

# The records tokenize (pasta.lang's tokens, torch): imported on first use, so that a command's config check, which
# reads pasta.annotation.config, does not import torch (pasta.lazy).
__getattr__ = lazy_exports(__name__, {"pasta.annotation.records": ("STAT_FIELDS", "make_record", "measure")}, globals())

if TYPE_CHECKING:
    from pasta.annotation.records import STAT_FIELDS, make_record, measure

__all__ = [
    "STAT_FIELDS",
    "UNUSABLE_CODES",
    "Rejected",
    "check_original",
    "format_table",
    "make_record",
    "measure",
    "realign_whitespace",
    "reason_code",
    "summarize",
    "validate_annotation",
]
