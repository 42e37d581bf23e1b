"""Reading a file a user named: its text, or one line naming the file and the problem.

Every loader of user input (config.json, recipes, profiles, loss curves, cluster files, batch
requests) reads through this, so a missing file, a folder, a device or FIFO (/dev/zero, a named
pipe), a file over the size limit, unreadable or non-UTF-8 bytes all end in the same kind of
one-line error, raised as the loader's own error class. `parse_json` / `parse_yaml` bound the
nesting and turn the parsers' own failures (deep nesting, integers of thousands of digits) into
that error too.
"""
from __future__ import annotations

import functools
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from cost_model.nouns.names import shown_name

MAX_USER_FILE_BYTES = 16 * 1024 * 1024     # far above any config, recipe, profile or curve
MAX_NESTING = 64                           # config.json nests 3 deep, recipes 4, profiles 5


def read_user_text(path: str | os.PathLike, error: type[Exception], what: str = "file",
                   limit: int = MAX_USER_FILE_BYTES) -> str:
    """The UTF-8 text of `path` (a leading byte-order mark dropped); `error` with one line otherwise."""
    name = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, not a {what}") from None
    except OSError as e:
        raise error(" ".join(f"{name}: cannot read: {e.strerror or e}".split())) from None
    except ValueError:   # a NUL byte in the path (from a batch line or a recipe, never from argv)
        raise error(f"{name!r}: not a valid path (NUL byte)") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise error(f"{name}: is a directory, not a {what}")
        raise error(f"{name}: not a regular file (a device, pipe or socket), not a {what}")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise error(" ".join(f"{name}: cannot read: {e.strerror or e}".split())) from None
    if len(data) > limit:
        raise error(f"{name}: larger than {limit // (1024 * 1024)} MiB, too large for a {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return text.lstrip("\ufeff")


def check_regular_file(path: str | os.PathLike, error: type[Exception], what: str = "file") -> Path:
    """`path` when it names a regular file; `error` saying what it is otherwise."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as e:
        raise error(" ".join(f"{path}: cannot read: {e.strerror or e}".split())) from None
    except ValueError:
        raise error(f"{str(path)!r}: not a valid path (NUL byte)") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        raise error(f"{path}: not a regular file (a device, pipe or socket), not a {what}")
    return p


def nesting_depth(data: Any, limit: int = MAX_NESTING) -> int:
    """The nesting depth of parsed JSON/YAML data, counted without recursion, stopping past `limit`.

    YAML aliases share one object between many places (a "billion laughs" bomb is 10 references to 10
    references...): a container is walked again only when reached deeper than before, so the walk stays
    linear in the distinct containers instead of exponential in the references."""
    deepest, stack, seen = 0, [(data, 1)], {}
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if seen.get(id(value), 0) >= depth:
                continue
            seen[id(value)] = depth
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)
    return deepest


def unique_containers(data: Any):
    """(container, path) once per distinct dict/list in `data` (aliases visited once), without recursion."""
    stack, seen = [(data, "")], set()
    while stack:
        value, where = stack.pop()
        if not isinstance(value, (dict, list)) or id(value) in seen:
            continue
        seen.add(id(value))
        yield value, where
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        else:
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))


def _bounded(data: Any, name: str, error: type[Exception]) -> Any:
    if nesting_depth(data) > MAX_NESTING:
        raise error(f"{name}: nested deeper than {MAX_NESTING} levels")
    if expanded_size(data) > MAX_EXPANDED_VALUES:
        raise error(f"{name}: its aliases stand for more than {MAX_EXPANDED_VALUES:,} values (a YAML alias bomb?)")
    return data


# The values a file may stand for once its aliases are written out: a reader that walks the data (a digest, a
# copy) visits each place an alias stands, so a few lines of nested aliases would take all the memory there is.
MAX_EXPANDED_VALUES = 10_000_000


def expanded_size(data: Any) -> int:
    """How many values `data` holds with every alias written out, counted once per distinct container (linear in
    the containers however often each is referenced); a container that holds itself counts once."""
    sizes: dict[int, int] = {}
    stack = [(data, False)]
    while stack:   # depth first: a container is summed once everything it holds has been
        value, held_done = stack.pop()
        if not isinstance(value, (dict, list, tuple)):
            continue
        items = value.values() if isinstance(value, dict) else value
        if held_done:
            sizes[id(value)] = min(1 + sum(sizes.get(id(v), 1) for v in items), MAX_EXPANDED_VALUES + 1)
        elif id(value) not in sizes:
            sizes[id(value)] = 1   # until summed; a cycle back to it counts it once
            stack.append((value, True))
            stack.extend((v, False) for v in items)
    return sizes.get(id(data), 1)


def _value_error(e: ValueError, name: str, error: type[Exception]) -> Exception:
    """The parsers' ValueErrors as one line: Python's limit on integer digits named as such."""
    if "integer string conversion" in str(e):
        return error(f"{name}: an integer longer than {sys.get_int_max_str_digits():,} digits")
    return error(f"{name}: {' '.join(str(e).split())[:160]}")


def parse_json(text: str, name: str, error: type[Exception]) -> Any:
    """JSON with bounded nesting; malformed JSON, deep nesting or huge integers as one-line `error`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{name}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise error(f"{name}: nested deeper than {MAX_NESTING} levels") from None
    except ValueError as e:   # Python's limit on integer digits
        raise _value_error(e, name, error) from None
    return _bounded(data, name, error)


def _check_text_nesting(text: str, name: str, error: type[Exception]) -> None:
    """Refuse deep nesting before the YAML parser recurses into it (its recursion is slow to unwind under a deep
    stack): flow brackets opened more than MAX_NESTING deep, or a line indented more than 8 columns a level."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    indent = max((len(line) - len(line.lstrip(" ")) for line in text.splitlines()), default=0)
    if deepest > MAX_NESTING or indent > 8 * MAX_NESTING:
        raise error(f"{name}: nested deeper than {MAX_NESTING} levels")


MERGE_KEY_REFUSED = "YAML merge keys (<<) are not accepted: write the merged keys out"


@functools.lru_cache(maxsize=2)
def _unique_keys_loader(libyaml: bool = False):
    """yaml.SafeLoader that refuses a key given twice in one mapping (safe_load keeps the last silently: a
    recipe with two `tp:` lines would be read with one of them). `libyaml`: on yaml.CSafeLoader where PyYAML has
    it (the same nodes and constructors; its scanner and parser in C, ~6x faster on a shipped profile; its error
    messages are libyaml's own, so a user's file is read by the Python one)."""
    import yaml

    base = yaml.CSafeLoader if libyaml and getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

    class UniqueKeysLoader(base):
        def flatten_mapping(self, node):
            # `<<: *base` is YAML 1.1 only: a YAML 1.2 reader (the leaderboard's) reads a key named `<<` instead,
            # so one file would say two things; every mapping (sets and ordered maps too) passes here
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise yaml.constructor.ConstructorError(None, None, MERGE_KEY_REFUSED, key_node.start_mark)
            super().flatten_mapping(node)

    def mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # refused by flatten_mapping, with its line
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:   # an unhashable key: SafeLoader's own error says so
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {shown_name(key)}",
                                                        key_node.start_mark)
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    UniqueKeysLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return UniqueKeysLoader


def parse_yaml(text: str, name: str, error: type[Exception], shipped: bool = False) -> Any:
    """YAML (safe_load) with bounded nesting; failures as one-line `error`. `shipped`: a file of the package
    (read with libyaml's parser where PyYAML has it: the same data, faster)."""
    import yaml

    _check_text_nesting(text, name, error)
    try:
        SafeLoaderOfUniqueKeys = _unique_keys_loader(shipped)   # a yaml.SafeLoader subclass: no Python objects
        data = yaml.load(text, Loader=SafeLoaderOfUniqueKeys)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem == MERGE_KEY_REFUSED:   # not malformed: a feature refused
            raise error(f"{name}:{where.replace(' at line', ' line')}: {problem}") from None
        raise error(f"{name}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise error(f"{name}: nested deeper than {MAX_NESTING} levels") from None
    except (ValueError, OverflowError) as e:
        raise _value_error(e, name, error) from None
    return _bounded(data, name, error)   # outside the try: the loaders' errors are ValueErrors too
