"""Reading a file a user named: its text, or one line naming the file and the problem.

Every loader of user input (config.json, recipes, profiles, loss curves) reads through this, so a
missing file, a folder, unreadable or non-UTF-8 bytes all end in the same kind of one-line error,
raised as the loader's own error class."""
from __future__ import annotations

import os
from pathlib import Path


def read_user_text(path: str | os.PathLike, error: type[Exception], what: str = "file") -> str:
    """The UTF-8 text of `path` (a leading byte-order mark dropped); `error` with one line otherwise."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, not a {what}") from None
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(" ".join(f"{name}: cannot read: {e.strerror or e}".split())) from None
    return text.lstrip("\ufeff")
