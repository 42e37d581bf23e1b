"""Hypothesis strategies for issue 15's fuzz test: hostile values, and mutations of the user files `tune` reads.

A document (config.json, recipe, profile, curve) is a valid base file mutated at a few paths: a value set to
something hostile (wrong type, huge/negative/NaN/inf number, a 5,000-digit integer, nesting thousands deep,
control characters, shell text) or a key deleted; a path through a list may take every entry at once ("*"),
which is how "all-zero tflops" is reached. The serialised text may then be damaged (truncated, BOM, bytes
that are not UTF-8). Values JSON and YAML cannot write (huge integers, deep nesting) are placeholders
replaced in the text after dumping.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import strategies as st

EVERY = "*"       # a path element standing for every entry of a list
CONTROL = "".join(map(chr, range(0x20))) + "\x7f\x85\u2028\u2029\u202e\u200b"
# Text that must never reach a shell command, a comment's line or the terminal raw.
NASTY_TEXT = ("", " ", "\n", "\r\n", "a\nINJECTED=1 touch pwned", "$(touch pwned)", "`touch pwned`", "; rm -rf ~",
              "\x1b[2J\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "../../../etc/passwd", "a" * 10_000, "8192", "nan",
              "-1", "1e30", "h200\nexport EVIL=1", "--help", "\x00", "\u202egnp.exe", "'\"\\")


@dataclass(frozen=True)
class BigInt:
    """An integer literal of `digits` digits (Python refuses to print or parse over 4,300 by default)."""
    digits: int

    def text(self) -> str:
        return "9" * self.digits


@dataclass(frozen=True)
class Nested:
    """A list nested `depth` deep: [[[...]]]."""
    depth: int

    def text(self) -> str:
        return "[" * self.depth + "]" * self.depth


SPECIAL_NUMBERS = (0, -1, -8, 1, 3, 7, 2**31, 2**63, 2**64 + 1, 10**7, 10**30, -10**30, 0.5, 8.0, 1e30, -1e30,
                   1e308, 5e-324, float("nan"), float("inf"), float("-inf"))


def hostile_numbers() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(SPECIAL_NUMBERS), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=True, allow_infinity=True),
                     st.builds(BigInt, st.sampled_from([400, 5000])))


def hostile_text() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=40),
                     st.text(alphabet=CONTROL + "ab/$`;'\"|&\\ ", max_size=30))


def hostile_values() -> st.SearchStrategy:
    scalars = st.one_of(hostile_numbers(), hostile_text(), st.none(), st.booleans())
    return st.one_of(scalars, scalars, st.lists(scalars, max_size=3), st.dictionaries(hostile_text(), scalars, max_size=2),
                     st.builds(Nested, st.sampled_from([65, 500, 3000])))


# ---------------------------------------------------------------- mutating a parsed document

def paths(data: Any, limit: int = 600) -> list[tuple]:
    """Every path into `data` (the root is ()), list indices as 0, the last one, or EVERY; plus a new key
    under each mapping. At most `limit`, breadth first, so the top of a large file is always there."""
    found, queue = [()], [((), data)]
    while queue and len(found) < limit:
        path, value = queue.pop(0)
        if isinstance(value, dict):
            found.append(path + ("unknown_key",))
            children = [(path + (k,), v) for k, v in value.items()]
        elif isinstance(value, list) and value:
            children = [(path + (i,), value[i]) for i in sorted({0, len(value) - 1})]
            children.append((path + (EVERY,), value[0]))
        else:
            children = []
        found += [p for p, _ in children]
        queue += children
    return found[:limit]


def apply(data: Any, mutations) -> Any:
    """A deep copy of `data` with each (path, action, value) applied; a path the earlier ones removed is skipped."""
    data = copy.deepcopy(data)
    for path, action, value in mutations:
        if not path:
            data = None if action == "delete" else value
            continue
        _apply_at(data, path, action, value)
    return data


def _apply_at(node: Any, path: tuple, action: str, value: Any) -> None:
    head, rest = path[0], path[1:]
    if head == EVERY:
        keys = range(len(node)) if isinstance(node, list) else []
    else:
        keys = [head] if _has(node, head) or (not rest and isinstance(node, dict)) else []
    for key in reversed(list(keys)):   # reversed: deleting list entries keeps the earlier indices valid
        if rest:
            if _has(node, key):
                _apply_at(node[key], rest, action, value)
        elif action == "delete":
            if _has(node, key):
                del node[key]
        else:
            node[key] = copy.deepcopy(value)


def _has(node: Any, key: Any) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node)


def mutations(all_paths: list[tuple], max_size: int = 3) -> st.SearchStrategy:
    action = st.sampled_from(["set", "set", "set", "delete"])
    return st.lists(st.tuples(st.sampled_from(all_paths), action, hostile_values()), min_size=1, max_size=max_size)


# ---------------------------------------------------------------- writing a document

def _swap(value: Any, table: dict) -> Any:
    """`value` with every BigInt/Nested replaced by a placeholder string, recorded in `table`."""
    if isinstance(value, (BigInt, Nested)):
        key = f"PLACEHOLDER{len(table)}X"
        table[key] = value.text()
        return key
    if isinstance(value, dict):
        return {_swap(k, table) if isinstance(k, (BigInt, Nested)) else k: _swap(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, table) for v in value]
    return value


def to_json(data: Any) -> str:
    table: dict[str, str] = {}
    text = json.dumps(_swap(data, table))     # NaN and Infinity as JavaScript writes them
    for key, raw in table.items():
        text = text.replace(f'"{key}"', raw)
    return text


def to_yaml(data: Any) -> str:
    table: dict[str, str] = {}
    # libyaml's emitter where there is one: the profile documents are large (0.2 s each with the Python one)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(_swap(data, table), Dumper=dumper, sort_keys=False, allow_unicode=True, width=1 << 30)
    for key, raw in table.items():
        text = text.replace(f"'{key}'", raw).replace(f'"{key}"', raw).replace(key, raw)
    return text


DAMAGE = st.one_of(st.none(), st.none(), st.tuples(st.just("truncate"), st.floats(0, 1)),
                   st.tuples(st.just("insert"), st.sampled_from([b"\xff\xfe", b"\x00", b"\xef\xbb\xbf", b"\xc3("]),
                             st.floats(0, 1)),
                   st.just(("bom",)))


def damaged(text: str, damage) -> bytes:
    """The UTF-8 bytes of `text`, truncated at a fraction, with bytes inserted, or behind a byte-order mark."""
    data = text.encode("utf-8")
    if damage is None:
        return data
    if damage[0] == "truncate":
        return data[: int(len(data) * damage[1])]
    if damage[0] == "insert":
        at = int(len(data) * damage[2])
        return data[:at] + damage[1] + data[at:]
    return b"\xef\xbb\xbf" + data


@st.composite
def documents(draw, bases: dict[str, Any], fmt: str, max_mutations: int = 3) -> bytes:
    """One base (by name) mutated, written as JSON or YAML, maybe damaged."""
    base = bases[draw(st.sampled_from(sorted(bases)))]
    doc = apply(base, draw(mutations(paths(base), max_mutations)))
    text = to_json(doc) if fmt == "json" else to_yaml(doc)
    return damaged(text, draw(DAMAGE))
