"""An SQLite file tune may keep a study in: checked before anything is written, so another program's file, a
corrupt one or a read-only one is refused in one line and left as it was."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tuner.storages import StudyError, shown

SQLITE_MAGIC = b"SQLite format 3\x00"


def first_line(e: Exception) -> str:
    text = str(e).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(e).__name__


def check_storage(url: str, allow_new_folder: bool = False, must_exist: bool = False, writable: bool = True) -> None:
    """open_storage's file checks, writing nothing (an SQLite file is created only when opened)."""
    if not url.startswith("sqlite:///"):
        return
    path = Path(url[len("sqlite:///"):])
    if allow_new_folder and not path.exists() and not path.parent.exists():
        _check_can_make(url, path.parent)   # open_storage makes the folder (the default storage)
        return
    try:
        check_sqlite_file(url, path, False, must_exist, writable)
    except OSError as e:  # an unreadable file
        raise StudyError(" ".join(f"study storage {shown(url)}: {e.strerror or e}".split())) from None


def _check_can_make(url: str, folder: Path) -> None:
    """The folder can be made: no dangling link in its place, its nearest existing parent a writable folder."""
    ancestor = folder
    while not ancestor.exists():
        if os.path.lexists(ancestor):
            raise StudyError(f"study storage {shown(url)}: folder {ancestor} cannot be made (a link to nowhere)")
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise StudyError(f"study storage {shown(url)}: folder {folder} cannot be made in {ancestor}")


def check_sqlite_file(url: str, path: Path, create_dirs: bool, must_exist: bool = False,
                       writable: bool = True) -> None:
    """An existing file must be an SQLite database (writable when the command writes); a new one needs
    its folder (made only when asked), and commands that only read never create one."""
    if path.exists():
        if path.is_dir():
            raise StudyError(f"study storage {shown(url)}: {path} is a directory, not an SQLite file")
        if not path.is_file():
            raise StudyError(f"study storage {shown(url)}: {path} is not a regular file")
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
        if head and head != SQLITE_MAGIC:
            raise StudyError(f"study storage {shown(url)}: {path} is not an SQLite database (corrupt or another file)")
        tables = _sqlite_tables(url, path) if head else set()
        # only Optuna's tables, all or some: a few of them are another tuner creating the schema at this moment
        # (SQLite creates them one by one, each visible at once); opening the storage creates the rest
        if tables and not tables <= _optuna_tables():
            names = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise StudyError(f"study storage {shown(url)}: {path} is an SQLite database but not an Optuna study storage "
                             f"(tables: {names}); tune writes nothing into it: pass another --storage")
        if must_exist and not tables:
            raise StudyError(f"study storage {shown(url)}: {path} is empty (no study was ever stored in it)")
        if writable and not os.access(path, os.W_OK):
            raise StudyError(f"study storage {shown(url)}: {path} is read-only; tune writes trials to it "
                             f"(make it writable or pass another --storage)")
        if not os.access(path.parent, os.W_OK | os.X_OK) and writable:
            raise StudyError(f"study storage {shown(url)}: folder {path.parent} is read-only (SQLite writes a journal "
                             f"beside the file)")
    elif must_exist:
        raise StudyError(f"study storage {shown(url)}: no such file {path}")
    elif path.parent.exists() and not path.parent.is_dir():
        raise StudyError(f"cannot open study storage {shown(url)}: {path.parent} is a file, not a folder")
    elif path.parent.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        raise StudyError(f"cannot open study storage {shown(url)}: folder {path.parent} is read-only")
    elif not path.parent.exists():
        if create_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        else:
            raise StudyError(f"study storage {shown(url)}: folder {path.parent} does not exist")


def _optuna_tables() -> set[str]:
    from tuner.optuna_adapter import optuna_tables   # optuna imported only for a file that exists

    return optuna_tables()


def _sqlite_tables(url: str, path: Path) -> set[str]:
    """The table names of an existing SQLite file, read without writing to it."""
    import sqlite3
    import urllib.parse

    def tables(mode: str) -> set[str]:
        with contextlib.closing(sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode={mode}",
                                                uri=True, timeout=60)) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    try:
        try:
            return tables("ro")
        except sqlite3.Error as e:
            # A hot journal (a writer killed mid-transaction) must be rolled back before the file can be read, and a
            # read-only connection cannot: every SQLite client that opens the file read-write does it first.
            if getattr(e, "sqlite_errorcode", None) != SQLITE_READONLY_ROLLBACK:
                raise
            return tables("rw")
    except sqlite3.Error as e:
        raise StudyError(f"study storage {shown(url)}: {path}: {first_line(e)}") from None


SQLITE_READONLY_ROLLBACK = 776   # SQLITE_READONLY | (3 << 8): a hot journal that a read-only connection cannot roll back
