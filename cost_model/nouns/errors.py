"""The one base class of every error a user can cause.

It lives at the bottom of the import graph (cost_model imports nothing from the other packages), so
every package derives its user-facing errors from it and the CLI catches it once, printing one line.
"""
from __future__ import annotations


class AttuneError(Exception):
    """A problem the user can fix (bad input, an unreachable cluster, a study that cannot be opened).

    The message names the problem and the failing values in one line."""

    def one_line(self) -> str:
        from cost_model.nouns.names import printable

        text = str(self).strip() or type(self).__name__
        # user text inside a message (a name, a path) must not add a line or send terminal escapes
        return printable(" ".join(text.split()))
