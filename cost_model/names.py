"""Names from user files (a config.json's display name, a file stem) made safe to print and to embed.

A name reaches a shell command's comment, a recipe, a file name and the terminal: control characters
(newlines, ANSI escape sequences) would add a shell line or repaint the terminal, so they go, and the
length is bounded.
"""
from __future__ import annotations

import re

MAX_NAME_CHARS = 120
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)?")


def clean_name(text: object, limit: int = MAX_NAME_CHARS) -> str:
    """`text` with ANSI escape sequences and every other non-printable character removed, whitespace
    runs made one space, cut to `limit` characters."""
    s = _ANSI.sub("", str(text))
    s = "".join(ch if ch.isprintable() else " " for ch in s)
    s = " ".join(s.split())
    return s[:limit].rstrip()


def printable(text: str) -> str:
    """`text` for the terminal: non-printable characters shown escaped (\\x1b, \\n), nothing removed."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9._+-]+")


def file_name(text: object, fallback: str = "unnamed") -> str:
    """`text` as one path component: letters, digits and . _ + - only (anything else one '-'), never
    starting with '.' (no '..', no hidden file), bounded in length; `fallback` when nothing is left."""
    s = _UNSAFE_IN_FILE_NAME.sub("-", clean_name(text)).lstrip(".-").rstrip("-")
    return s[:MAX_NAME_CHARS] or fallback
