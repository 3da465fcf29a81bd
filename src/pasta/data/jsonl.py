"""JSON Lines and JSON files that survive crashes: line-numbered reading, durable appends, atomic writes.

Readers name the file and line of a bad record (`data/x.jsonl:17: invalid JSON (...)`) and either fail or skip it.
`JsonlAppender` writes whole lines and fsyncs each, so a killed run loses at most the line being written, and on
open it drops such a truncated last line; stages resume by reading back what is there. `write_json_atomic` and
`write_jsonl_atomic` write a temporary file beside the target and rename it over, so readers never see half a file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pasta.errors import PastaError

log = logging.getLogger(__name__)

OnError = Literal["fail", "skip"]


def check_on_error(on_error: str) -> None:
    if on_error not in ("fail", "skip"):
        raise PastaError(f"on_error={on_error} is not one of fail, skip")


def iter_numbered_jsonl(path: str | Path, on_error: OnError = "fail") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, record) for each JSON object in a .jsonl file; blank lines are ignored.

    A line that is not a JSON object raises PastaError naming file and line, or is logged and skipped when
    `on_error="skip"`.
    """
    check_on_error(on_error)
    path = Path(path)
    if not path.is_file():
        raise PastaError(f"file not found: {path}")
    with path.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"expected a JSON object, got {type(record).__name__}")
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                message = f"{path}:{line_no}: invalid JSON ({exc})"
                if on_error == "fail":
                    raise PastaError(message) from None
                log.warning("skipping %s", message)
                continue
            yield line_no, record


def iter_jsonl(path: str | Path, on_error: OnError = "fail") -> Iterator[dict[str, Any]]:
    """Yield each JSON object of a .jsonl file (see iter_numbered_jsonl for errors)."""
    for _, record in iter_numbered_jsonl(path, on_error):
        yield record


def read_jsonl(path: str | Path, on_error: OnError = "fail") -> list[dict[str, Any]]:
    """All JSON objects of a .jsonl file (see iter_numbered_jsonl for errors)."""
    return list(iter_jsonl(path, on_error))


def _drop_truncated_tail(path: Path) -> None:
    """Cut a last line that has no newline: the remains of a write that a crash interrupted."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        # Walk back in blocks to the last newline; everything after it is the partial line.
        end = handle.seek(0, os.SEEK_END)
        position = end
        keep = 0
        while position > 0:
            step = min(65536, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            newline = block.rfind(b"\n")
            if newline != -1:
                keep = position + newline + 1
                break
        log.warning("%s: dropping a truncated last line (%d bytes) left by an interrupted write", path, end - keep)
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())


class JsonlAppender:
    """Append records to a .jsonl file durably: one whole line per record, flushed and fsynced.

        with JsonlAppender(run_dir / "annotations.jsonl") as out:
            out.append({"id": ..., "annotated": ...})
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_truncated_tail(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        # One write of the full line: a crash leaves either nothing or a line without its newline.
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def append_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Durably append records to a .jsonl file (see JsonlAppender)."""
    with JsonlAppender(path) as out:
        for record in records:
            out.append(record)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file all at once (temporary file beside it, fsync, rename): no reader ever sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any, indent: int = 2) -> None:
    """Write `obj` as JSON to `path` all at once (temporary file + rename)."""
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON Lines to `path` all at once (temporary file + rename)."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
