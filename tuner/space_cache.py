"""A study's scored space, kept beside its SQLite file: a resumed study does not score the space again.

What is kept: the layouts that may fit with their predictions (`score_space`) and the agent's predictions of them
under each hypothesis. The key is everything they are computed from: the study's model, GPU, GPU count,
workload, stack, space options and profile (its figures, and the digest of all its file holds), the runner and its
model run, and the source of the code that scores
(cost_model, search_space, experiments, tuner and the data they read). Any change is another key; a file that
cannot be read, or that another user could have written, is ignored and the space is scored again. Only SQLite
studies keep one (a folder `.attune-cache` beside the file); a server storage scores the space each time.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import stat
import tempfile
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("cost_model", "search_space", "experiments", "tuner")
CACHE_DIR = ".attune-cache"
FORMAT = 1
KEEP = 8   # scored spaces kept per SQLite file (one per study and code version): the oldest go


@lru_cache(maxsize=1)
def code_digest() -> str:
    """The digest of the scoring code and its data files (a new version of either is another key)."""
    return _packages_digest(CODE)


@lru_cache(maxsize=1)
def cost_model_digest() -> str:
    """The cost model's code and data, in 12 hex digits: a trial records the one that priced it, so a study resumed
    after the model changed tells its earlier predictions from today's (tuner.report)."""
    return _packages_digest(("cost_model",))[:12]


def _packages_digest(packages) -> str:
    """sha256 over the packages' code and data files, each named by its path."""
    h = hashlib.sha256()
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".json", ".csv"):
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def space_key(config, runner, space) -> str:
    """The key of a study's scored space (see the module docstring)."""
    parts = (FORMAT, code_digest(), repr(config.model), repr(config.gpu), config.world_size, repr(config.workload),
             repr(config.stack), repr(space.options if space is not None else config.options),
             repr(config.profile), config.profile.digest() if config.profile is not None else None,   # all it holds
             runner.name, repr(getattr(runner, "layers", None)),
             repr(getattr(runner, "stack", None)), repr(getattr(space, "reasons", None)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


OUR_PACKAGES = ("cost_model", "search_space", "tuner")
PLAIN_BUILTINS = frozenset({"set", "frozenset", "slice", "range", "complex", "bytearray"})


class OurClassesOnly(pickle.Unpickler):
    """Unpickles only classes our packages define and plain containers (pickle's documented "restricting globals"):
    a pickle names what it builds, so a file that names a function, a module attribute or anything else is refused
    before anything of it runs, on top of the file's ownership check."""

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in PLAIN_BUILTINS:
            return super().find_class(module, name)
        if module.split(".")[0] in OUR_PACKAGES and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a class of ours")


class SpaceCache:
    """One study's cached scored space: `load` what is stored (None when nothing usable is), `save` it."""

    def __init__(self, path: Path):
        self.path = path
        self.hypothesis_values: dict = {}

    @classmethod
    def for_study(cls, url: str, config, runner, space) -> "SpaceCache | None":
        if not url.startswith("sqlite:///") or url.endswith(":memory:"):
            return None
        db = Path(url[len("sqlite:///"):])
        return cls(db.parent / CACHE_DIR / f"{db.name}-{space_key(config, runner, space)}.pkl")

    def load(self):
        """The stored candidates (and the agent's predictions into `hypothesis_values`), or None."""
        try:
            st = self.path.lstat()
            # only a plain file of ours that no one else could have written, and only our classes built from it
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            with open(self.path, "rb") as f:
                data = OurClassesOnly(f).load()
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        self.hypothesis_values = dict(data.get("hypothesis_values") or {})
        return data.get("candidates")

    def save(self, candidates) -> None:
        """Written whole (a temporary file in the folder, then renamed); a folder it cannot write is skipped."""
        try:
            folder = self.path.parent
            folder.mkdir(mode=0o700, exist_ok=True)
            if folder.is_symlink():
                return
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pkl")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump({"format": FORMAT, "candidates": candidates,
                                 "hypothesis_values": self.hypothesis_values}, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            prefix = self.path.name.rsplit("-", 1)[0] + "-"
            kept = sorted((p for p in folder.glob(f"{prefix}*.pkl") if p.is_file() and not p.is_symlink()),
                          key=lambda p: p.stat().st_mtime, reverse=True)
            for old in kept[KEEP:]:
                old.unlink()
        except OSError:
            pass

    def memo(self, predict_h):
        """`predict_h` answered from the stored predictions, and remembering the new ones for `save`."""
        values = self.hypothesis_values

        def cached(h, layout):
            key = (h.name, layout.key())
            v = values.get(key)
            if v is None:
                v = values[key] = predict_h(h, layout)
            return v
        return cached
