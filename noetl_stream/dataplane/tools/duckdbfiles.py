"""Where an execution's DuckDB database file lives, and when it is removed.

A ``duckdb`` task without ``database:`` works in ``<dir>/<execution_id>.duckdb``: the tables one step
creates are there for the next step of the same execution, and two executions never share a file.
``<dir>`` is ``NOETL_DUCKDB_DIR``, else ``noetl-duckdb`` in the system's temp directory.

A file is removed by age: once it has not been used for ``NOETL_DUCKDB_MAX_AGE_S`` seconds (default a
day; 0 keeps files for ever), the next task that opens a file in that directory removes it (a task
looks at most every few minutes). Its age is that of its last use, since a task touches the file it
opens. Not when the execution ends: a worker does not see every end (it may be down then, and another
worker may have run the last step), and a file removed while a later step of its execution (a retry, a
resumed execution) still needs it would lose its tables without a word.

The file is the worker host's: workers on other hosts (or with another ``NOETL_DUCKDB_DIR``) do not see
it. docs/tools.md says what that means for a deployment of several workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
import time
from pathlib import Path

DIR_ENV = "NOETL_DUCKDB_DIR"
MAX_AGE_ENV = "NOETL_DUCKDB_MAX_AGE_S"
DEFAULT_MAX_AGE_S = 24 * 3600.0
SWEEP_EVERY_S = 300.0
SUFFIX = ".duckdb"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

_swept: dict[Path, float] = {}
_lock = threading.Lock()


def directory() -> Path:
    """The directory of the executions' database files (``NOETL_DUCKDB_DIR``)."""
    return Path(os.environ.get(DIR_ENV) or Path(tempfile.gettempdir()) / "noetl-duckdb")


def max_age() -> float:
    """``NOETL_DUCKDB_MAX_AGE_S``: seconds a file may stay unused (0: for ever). Raises ``ValueError``
    naming the variable for a value that is not a number of seconds."""
    raw = os.environ.get(MAX_AGE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_AGE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{MAX_AGE_ENV}={raw!r} is not a number of seconds (0 keeps the files)")
    return value


def execution_file(execution_id: str) -> Path:
    """The database file of an execution (its id, or a digest of an id that is no plain file name)."""
    name = (
        execution_id
        if _SAFE_NAME.fullmatch(execution_id)
        else hashlib.sha256(execution_id.encode()).hexdigest()
    )
    return directory() / f"{name}{SUFFIX}"


def prepare(path: Path, keep_for: float) -> None:
    """Before `path` is opened: create its directory, mark `path` used now (its age counts from its
    last use), and remove the files unused for `keep_for` seconds (at most every `SWEEP_EVERY_S` per
    directory and process)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)
    if keep_for:
        _sweep(path.parent, path, keep_for)


def _sweep(folder: Path, keep: Path, keep_for: float) -> None:
    now = time.time()
    with _lock:
        if now - _swept.get(folder, 0.0) < min(SWEEP_EVERY_S, keep_for):
            return
        _swept[folder] = now
    wal = SUFFIX + ".wal"
    for entry in folder.iterdir():
        base = entry.name[: -len(".wal")] if entry.name.endswith(wal) else entry.name
        if not base.endswith(SUFFIX) or folder / base == keep:
            continue
        if now - _last_used(folder / base) > keep_for:
            with contextlib.suppress(OSError):
                entry.unlink()


def _last_used(db: Path) -> float:
    """When the database `db` (its file or its write-ahead log) was last written or opened."""
    times = []
    for path in (db, db.with_name(db.name + ".wal")):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times, default=0.0)


__all__ = ["DIR_ENV", "MAX_AGE_ENV", "directory", "execution_file", "max_age", "prepare"]
