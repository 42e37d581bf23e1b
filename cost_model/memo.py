"""A bounded memo for the cost model's pure functions of frozen objects, keyed by what each term reads.

Keys name objects by identity (id() is cheap where hashing a model or a rate table is not); an entry holds those
objects beside its value, so no other object can take their id while the entry lives. Full, it starts again: a
scored space reuses its recent entries, not old ones. Reads are the dict's own `get`; only a miss calls `put`.
"""
from __future__ import annotations


class IdentityMemo(dict):
    """key -> (held objects, value)."""

    def __init__(self, max_entries: int):
        super().__init__()
        self.max_entries = max_entries

    def put(self, key, held, value) -> tuple:
        if len(self) >= self.max_entries:
            self.clear()
        entry = self[key] = (held, value)
        return entry
