"""Output paths checked before a stage loads or writes anything: one `<key>=<path>: <why>` PastaError.

Every stage checks where it will write with these two (annotate its `output`, eval and train their `output_dir`):
an existing file where a folder is wanted or the reverse, a file on the way to it, something that is not a regular
file (`/dev/full`), a folder it may not write in. Writability is probed by creating and removing a temporary file
in the nearest folder that exists: permission bits say nothing for root, and a read-only mount shows only on a
write. Nothing is left behind. What only a write can show (the disk fills up during the run) is pasta.cli's: such
an OSError is one `error: <file>: <why>` line too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pasta.errors import PastaError


def check_output_dir(path: str | Path, key: str) -> Path:
    """`path` as a Path, once it is (or can be made) a folder this process writes in; else PastaError."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PastaError(f"{key}={path} is a file, not a folder")
    _check_writable_folder(path, key, path)
    return path


def check_output_file(path: str | Path, key: str) -> Path:
    """`path` as a Path, once it is (or can be made) a regular file this process appends to; else PastaError."""
    path = Path(path)
    if path.is_dir():
        raise PastaError(f"{key}={path} is a folder, not a file")
    if path.exists() and not path.is_file():
        raise PastaError(f"{key}={path} is not a regular file")
    if path.exists():
        try:
            open(path, "ab").close()  # opened for appending, nothing written: the file is unchanged
        except OSError as exc:
            raise PastaError(f"{key}={path}: cannot write it ({exc.strerror})") from None
    _check_writable_folder(path.parent, key, path)
    return path


def _check_writable_folder(folder: Path, key: str, path: Path) -> None:
    """The nearest existing folder on the way to `folder` is a folder, and a file can be created in it."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PastaError(f"{key}={path}: {existing} is a file, not a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=".pasta-write-check-", dir=existing)
    except OSError as exc:
        raise PastaError(f"{key}={path}: cannot write in {existing} ({exc.strerror})") from None
    os.close(handle)
    os.unlink(probe)
