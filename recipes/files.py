"""Writing an output file so that a reader never sees half of it and a planted link is never followed."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class LinkedTarget(OSError):
    """The output path is a symbolic link: writing would land wherever it points."""


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then a rename (which replaces a
    name, never follows it). A path that is a symbolic link is refused (LinkedTarget); the file gets the mode
    open() would give it (0666 - umask)."""
    path = Path(path)
    if path.is_symlink():
        raise LinkedTarget(f"{path} is a symbolic link: not written (remove it or write elsewhere)")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
