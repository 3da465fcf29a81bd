"""JSON Lines and JSON files that survive crashes: line-numbered reading, durable appends, atomic writes.

Every stage reads its input files through this module: `iter_numbered_jsonl` (JSON Lines), `read_json_file` (one
JSON document) and `read_text_file` (plain text). Bytes that are not UTF-8, invalid JSON and strings that are not
valid Unicode (a lone surrogate such as "\ud800" is valid JSON but no tokenizer or file can take it) are named by
file and line (`data/x.jsonl:17: invalid JSON (...)`): a PastaError, or a logged skip with `on_error="skip"`.
`JsonlAppender` writes whole lines and fsyncs each, so a killed run loses at most the line being written, and on
open it drops such a truncated last line; stages resume by reading back what is there. `write_json_atomic` and
`write_jsonl_atomic` write a temporary file beside the target and rename it over, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pasta.choice import Choice
from pasta.errors import PastaError

log = logging.getLogger(__name__)


class OnError(Choice):
    """A bad record or line: fail (one-line error) or skip (logged)."""

    fail = "fail"
    skip = "skip"


def check_on_error(on_error: str) -> None:
    if on_error not in tuple(OnError):
        raise PastaError(f"on_error={on_error} is not one of {', '.join(OnError)}")


class BadInput(ValueError):
    """Why one line or file cannot be read (not UTF-8, invalid JSON, invalid Unicode)."""


def invalid_unicode(value: Any) -> str | None:
    """Where a string in `value` (a str or parsed JSON) is not valid Unicode (a lone surrogate), or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # iterative: JSON nesting may be deeper than Python's recursion limit
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                # The path may hold the surrogate itself, or a newline, in a key: escaped, so that the message
                # prints, on one line.
                shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in where.removeprefix("."))
                place = f" in {shown}" if where else ""
                return f"invalid Unicode{place} (lone surrogate {item[exc.start]!r} at char {exc.start})"
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((f"{where}.{key}", key))
                stack.append((f"{where}.{key}", child))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
    return None


def check_text(text: str, where: str) -> str:
    """`text` if it is valid Unicode, else a PastaError `<where>: invalid Unicode (...)`."""
    problem = invalid_unicode(text)
    if problem is not None:
        raise PastaError(f"{where}: {problem}")
    return text


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"not valid UTF-8 (byte {exc.start}: {exc.reason}); re-encode the file as UTF-8") from None


def parse_json(text: str, check_unicode: bool = True) -> Any:
    """One JSON document whose strings are all valid Unicode (unless not `check_unicode`), else BadInput saying
    why."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise BadInput("invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise BadInput(f"invalid JSON ({exc})") from None
    problem = invalid_unicode(value) if check_unicode else None
    if problem is not None:
        raise BadInput(problem)
    return value


def iter_numbered_jsonl(
    path: str | Path, on_error: OnError | str = OnError.fail, check_unicode: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, record) for each JSON object in a .jsonl file; blank lines are ignored.

    A line that is not UTF-8, not a JSON object, or holds invalid Unicode raises PastaError naming file and line,
    or is logged and skipped when `on_error="skip"`. `check_unicode=False` lets lone surrogates through, for a stage
    that rejects such records itself with a reason (annotate).
    """
    check_on_error(on_error)
    path = Path(path)
    if not path.is_file():
        raise PastaError(f"file not found: {path}")
    num_skipped = 0
    with path.open("rb") as lines:
        for line_no, raw in enumerate(lines, start=1):
            try:
                line = _decode(raw.removeprefix(b"\xef\xbb\xbf") if line_no == 1 else raw)
                if not line.strip():
                    continue
                record = parse_json(line, check_unicode)
                if not isinstance(record, dict):
                    raise BadInput(f"invalid JSON (expected a JSON object, got {type(record).__name__})")
            except BadInput as exc:
                message = f"{path}:{line_no}: {exc}"
                if on_error == "fail":
                    raise PastaError(message) from None
                log.warning("skipping %s", message)
                num_skipped += 1
                continue
            yield line_no, record
    if num_skipped:
        log.warning("%s: skipped %d bad lines (on_error=skip)", path, num_skipped)


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's content; PastaError `<file>:<line>: <why>` when it is missing, not UTF-8 or not Unicode."""
    path = Path(path)
    if not path.is_file():
        raise PastaError(f"file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = raw.count(b"\n", 0, exc.start) + 1
        raise PastaError(
            f"{path}:{line_no}: not valid UTF-8 (byte {exc.start}: {exc.reason}); re-encode the file as UTF-8"
        ) from None
    return check_text(text, str(path))


def read_json_file(path: str | Path, what: str = "file", check_unicode: bool = True) -> Any:
    """One JSON document from a file; PastaError naming `what`/file (and line) when missing or unreadable (see
    iter_numbered_jsonl for `check_unicode`)."""
    path = Path(path)
    if not path.is_file():
        raise PastaError(f"{what} not found: {path}")
    text = read_text_file(path).removeprefix("\ufeff")
    try:
        return parse_json(text, check_unicode)
    except BadInput as exc:  # json's message names the line and column
        raise PastaError(f"{path}: {exc}") from None


def iter_jsonl(path: str | Path, on_error: OnError | str = OnError.fail) -> Iterator[dict[str, Any]]:
    """Yield each JSON object of a .jsonl file (see iter_numbered_jsonl for errors)."""
    for _, record in iter_numbered_jsonl(path, on_error):
        yield record


def read_jsonl(path: str | Path, on_error: OnError | str = OnError.fail) -> list[dict[str, Any]]:
    """All JSON objects of a .jsonl file (see iter_numbered_jsonl for errors)."""
    return list(iter_jsonl(path, on_error))


def _drop_truncated_tail(path: Path) -> None:
    """Cut a last line that has no newline: the remains of a write that a crash interrupted. A last line that is a
    whole JSON object (a hand-written file without a final newline, or a crash between a record and its newline)
    is data, never cut: it gets its newline."""
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
        handle.seek(keep)
        if _is_json_object(handle.read(end - keep)):
            handle.write(b"\n")
            handle.flush()
            os.fsync(handle.fileno())
            return
        log.warning("%s: dropping a truncated last line (%d bytes) left by an interrupted write", path, end - keep)
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line.decode("utf-8")), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def _write_error(exc: OSError, path: Path) -> OSError:
    """`exc` naming the file: a write or flush error has no file name of its own (pasta.cli prints it)."""
    return OSError(exc.errno, exc.strerror, str(path))


class JsonlAppender:
    """Append records to a .jsonl file durably: one whole line per record, written and fsynced.

        with JsonlAppender(run_dir / "annotations.jsonl") as out:
            out.append({"id": ..., "annotated": ...})

    A write that fails (the disk full) raises an OSError naming the file, and the part of the line it wrote is cut
    off again: the file keeps every whole line appended before it. The file is unbuffered, so closing it after such
    an error has nothing left to write and fails nothing again.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_truncated_tail(self.path)
        self._handle = self.path.open("ab", buffering=0)

    def append(self, record: dict[str, Any]) -> None:
        line = memoryview((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        start = self._handle.seek(0, os.SEEK_END)
        try:
            while line:  # an unbuffered write may take part of the line; a crash leaves a line without its newline
                line = line[self._handle.write(line) :]
            os.fsync(self._handle.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):  # not every file can be cut (a device); a rerun drops the part then
                os.ftruncate(self._handle.fileno(), start)
            raise _write_error(exc, self.path) from None

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
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:  # the disk full: the close after it fails again; one error naming the target
            raise _write_error(exc, path) from None
        try:
            os.replace(tmp, path)
        except OSError as exc:  # a folder at `path`, say: the error would name the temporary file
            raise _write_error(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any, indent: int = 2) -> None:
    """Write `obj` as JSON to `path` all at once (temporary file + rename)."""
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSON Lines to `path` all at once (temporary file + rename)."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
