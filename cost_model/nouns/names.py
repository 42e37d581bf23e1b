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


# A value an error message may show as it is: a short name-like word ('a100', 'bf16', 'qwen3-moe'), the typo a
# user wants to see. Anything longer, or with a space, ':', '/', '=' or a quote, may be a line of some other file
# (a password line, a key, a token) that a parser read as a value: it is described, never shown.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,23}")
_MAX_SHOWN_DIGITS = 20


def shown(value: object) -> str:
    """`value` (read from a user's file or request) for an error message: a short word quoted, a boolean, null or a
    number of a few digits as JSON writes it; anything else as its kind and size ("a string of 2,048 characters",
    "a list of 3 items"), so an error names the field without echoing the file's content."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        digits = len(str(abs(value))) if value.bit_length() < 4000 else None   # str() of a huge int raises
        return str(value) if digits is not None and digits <= _MAX_SHOWN_DIGITS else "an integer too long to show"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        if _TOKEN.fullmatch(value):
            return f"'{value}'"
        return f"a string of {len(value):,} character{'s' if len(value) != 1 else ''}" if value else "an empty string"
    if isinstance(value, dict):
        return f"a mapping of {len(value):,} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value):,} item{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__} value"


def shown_name(value: object) -> str:
    """`value` where a name is expected ("unknown GPU 'a100'"): a short word quoted, anything else described in
    parentheses ("unknown GPU (a string of 80 characters)")."""
    text = shown(value)
    return text if text.startswith("'") else f"({text})"
