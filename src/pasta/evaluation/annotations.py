"""alpaca_eval annotations: what a valid preference is, and the checked loading of a saved annotations.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from pasta.data import read_json_file
from pasta.errors import PastaError

ANNOTATION_FIELDS = ("instruction", "output_1", "output_2", "generator_1", "generator_2", "preference")


def preference_problem(value: Any) -> str | None:
    """Why `value` is not an alpaca_eval preference, or None: a number in [1, 2], 0 (alpaca_eval's draw) or null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"preference {value!r} is not a number"
    if not (1 <= value <= 2 or value == 0):
        return f"preference {value!r} is outside [1, 2] (0 = draw, null = not judged)"
    return None


def load_annotations(path: Path) -> pd.DataFrame:
    """alpaca_eval annotations (annotations.json) of one model against one reference, checked row by row.

    Every row is an object with the ANNOTATION_FIELDS, a valid preference (see preference_problem) and an
    instruction no other row has: a bad row would silently drop out of alpaca_eval's totals.
    """
    records = read_json_file(path, "annotations file")
    if not isinstance(records, list) or not records:
        raise PastaError(f"{path}: not alpaca_eval annotations (expected a non-empty JSON list of objects)")
    seen: set[str] = set()
    for index, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise PastaError(f"{path}: row {index}: not a JSON object")
        missing = [key for key in ANNOTATION_FIELDS if key not in record]
        if missing:
            raise PastaError(f"{path}: row {index}: not an alpaca_eval annotation (missing {', '.join(missing)})")
        texts = [key for key in ANNOTATION_FIELDS if key != "preference" and not isinstance(record[key], str)]
        if texts:
            raise PastaError(f"{path}: row {index}: {', '.join(texts)} must be strings")
        problem = preference_problem(record["preference"])
        if problem is not None:
            raise PastaError(f"{path}: row {index}: {problem}")
        if record["instruction"] in seen:
            raise PastaError(f"{path}: row {index}: instruction given twice: {record['instruction'][:80]!r}")
        seen.add(record["instruction"])
    frame = pd.DataFrame(records)
    frame["preference"] = frame["preference"].astype(float)
    for column in ("generator_1", "generator_2"):
        names = sorted(frame[column].astype(str).unique())
        if len(names) > 1:
            raise PastaError(f"{path}: {column} holds several models ({', '.join(names[:4])}); one pair of models a file")
    return frame
