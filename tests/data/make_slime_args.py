"""Extract every command-line option slime and Megatron-LM accept, from their sources, into slime_megatron_args.json.

Usage (from the repository root; the git dirs are bare snapshots, e.g. from a `git clone --mirror`):

    python tests/data/make_slime_args.py --slime-git /path/THUDM+slime/repo --slime-commit 624b824a8 \
        --megatron-git /path/NVIDIA+Megatron-LM/repo [--megatron-commit COMMIT] [--out tests/data/slime_megatron_args.json]

The Megatron-LM commit defaults to the one slime's docker/Dockerfile pins (`ARG MEGATRON_COMMIT=`).

Nothing is imported from slime or Megatron: their Python files are read with `git show` and parsed with `ast`.
What is extracted:

* Megatron: everything `megatron/training/arguments.py:add_megatron_arguments` adds - every `add_argument` call in
  the functions it reaches, and the options `ArgumentGroupFactory(SomeConfig, exclude=[...])` derives from a
  dataclass's fields (mirroring megatron/training/argument_utils.py: `--field-name`, booleans as store_true when the
  default is False and otherwise as store_false named `--no-field-name` / `--disable-field-name`, `Literal[...]`
  and Enum types as choices, `list[...]` as nargs '+', the field's `metadata["argparse_meta"]` taking precedence).
  slime's image applies docker/patch/latest/megatron*.patch to that commit; options the patch adds are included and
  marked `"patched": true`.
* slime: every `add_argument` / `reset_arg` in what `slime/utils/arguments.py:parse_args` reaches
  (`get_slime_extra_args_provider`, `_pre_parse_mode`) and `slime/backends/sglang_utils/arguments.py:sglang_parse_args`.
  The options slime copies from SGLang's `ServerArgs.add_cli_args` (renamed `--sglang-*`) and sglang_router's
  `RouterArgs.add_cli_args` (`--router-*`) live in those packages, not in slime: they are listed under
  "not_extracted".

Deprecated options: an option whose help text (or dataclass field docstring) says it is deprecated, and every
string in the parsed files that names a known option as deprecated / no longer valid (validate_args' messages,
TransformerConfig.__post_init__'s warnings), with the replacement the text names and the evidence line.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
DEPRECATED_WORDS = re.compile(r"deprecat|no longer valid", re.IGNORECASE)
OPTION_RE = re.compile(r"--[A-Za-z0-9][\w-]*")
SLIME_PATCHES = ("docker/patch/latest/megatron.patch", "docker/patch/latest/megatron-sglang-aligned.patch")


# ------------------------------------------------------------------------------------------------ sources
class Source:
    """One repository at one commit, read through `git show`, optionally with patches applied to some files."""

    def __init__(self, git_dir: str, commit: str, patches: tuple[str, ...] = ()):
        self.git_dir = git_dir
        self.commit = self._git("rev-parse", f"{commit}^{{commit}}").strip()
        self.patches = patches          # unified diffs (text), applied to the files they touch
        self._text: dict[str, str | None] = {}
        self._tree: dict[str, ast.Module | None] = {}

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", self.git_dir, *args], check=True, capture_output=True,
                              text=True).stdout

    def text(self, path: str) -> str | None:
        if path not in self._text:
            try:
                text = self._git("show", f"{self.commit}:{path}")
            except subprocess.CalledProcessError:
                text = None
            if text is not None:
                text = self._patched(path, text)
            self._text[path] = text
        return self._text[path]

    def _patched(self, path: str, text: str) -> str:
        for patch in self.patches:
            if f"diff --git a/{path} b/{path}" not in patch:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                target = os.path.join(tmp, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w") as f:
                    f.write(text)
                subprocess.run(["git", "apply", f"--include={path}", "-"], input=patch, text=True, cwd=tmp,
                               check=True, capture_output=True)
                with open(target) as f:
                    text = f.read()
        return text

    def tree(self, path: str) -> ast.Module | None:
        if path not in self._tree:
            text = self.text(path)
            self._tree[path] = ast.parse(text) if text is not None else None
        return self._tree[path]

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if self.text(path) is not None:
                return path
        return None


def absolute_module(path: str, node: ast.ImportFrom) -> str:
    """The absolute module name of `from X import ...` written in file `path` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = path[:-len("/__init__.py")] if path.endswith("/__init__.py") else os.path.dirname(path)
    parts = package.split("/")
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imported_names(src: Source, path: str) -> dict[str, tuple[str, str]]:
    """name -> (module, original name) for every `from M import name [as alias]` anywhere in the file."""
    out = {}
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.ImportFrom):
            module = absolute_module(path, node)
            for alias in node.names:
                out[alias.asname or alias.name] = (module, alias.name)
    return out


def find_definition(src: Source, path: str, name: str, kind: type, depth: int = 0):
    """(file, node) of the top-level class/function `name` as seen from `path`, following re-exports."""
    tree = src.tree(path)
    if tree is None or depth > 6:
        return None
    for node in tree.body:
        if isinstance(node, kind) and node.name == name:
            return path, node
    imported = imported_names(src, path).get(name)
    if imported:
        target = src.module_file(imported[0])
        if target:
            return find_definition(src, target, imported[1], kind, depth + 1)
    return None


# ------------------------------------------------------------------------------------------------ options
@dataclass
class Option:
    names: list[str]
    takes_value: bool
    choices: list | None
    nargs: object
    help: str
    where: str                      # path:line
    notes: list[str] = field(default_factory=list)


def literal(node):
    """The value of a literal expression, or None when it is not one."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def help_text(node) -> str:
    if node is None:
        return ""
    value = literal(node)
    if isinstance(value, str):
        return value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return ast.unparse(node)


def option_from_kwargs(names: list[str], kwargs: dict, where: str, module_lists: dict) -> Option:
    """An add_argument call's option: `kwargs` maps keyword -> ast node (or a plain value, from argparse_meta)."""
    def value(key):
        node = kwargs.get(key)
        return literal(node) if isinstance(node, ast.AST) else node

    action_node = kwargs.get("action")
    action = value("action")
    if action is None and isinstance(action_node, ast.AST):
        action = ast.unparse(action_node)
    nargs = value("nargs")
    names = list(names)
    notes = []
    if isinstance(action, str) and action.endswith("BooleanOptionalAction"):
        names += [f"--no-{n[2:]}" for n in names if n.startswith("--")]
        takes_value = False
    elif action in NO_VALUE_ACTIONS:
        takes_value = False
    else:
        takes_value = nargs != 0
        if action not in (None, "store", "append", "extend"):
            notes.append(f"custom action {action}: assumed to take a value")
    choices = value("choices")
    choices_node = kwargs.get("choices")
    if choices is None and isinstance(choices_node, ast.Name) and choices_node.id in module_lists:
        choices = module_lists[choices_node.id]
    if choices is not None:
        choices = [c for c in choices]
    elif choices_node is not None:
        notes.append(f"choices not literal: {ast.unparse(choices_node) if isinstance(choices_node, ast.AST) else choices_node}")
    help_node = kwargs.get("help")
    text = help_text(help_node) if isinstance(help_node, ast.AST) else str(help_node or "")
    return Option(names, takes_value, choices, nargs, text, where, notes)


def module_level_lists(tree: ast.Module) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = literal(node.value)
            if isinstance(value, (list, tuple)):
                out[node.targets[0].id] = list(value)
    return out


# ------------------------------------------------------------------------------------------------ dataclass options
ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def _base_name(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def enum_members(src: Source, path: str, name: str) -> list[str] | None:
    """The member names of `name` when it is an Enum class of the repository (argparse's choices for it)."""
    found = find_definition(src, path, name, ast.ClassDef)
    if not found or not any(_base_name(b) in ENUM_BASES for b in found[1].bases):
        return None
    members = []
    for stmt in found[1].body:
        if isinstance(stmt, ast.Assign):
            members += [t.id for t in stmt.targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            members.append(stmt.target.id)
    return members


def field_type(src: Source, path: str, ann) -> dict:
    """What argument_utils.ArgumentGroupFactory._extract_type infers from a field's annotation:
    {"kind": bool|choices|plain|error, "choices": [...], "nargs": ...}."""
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return field_type(src, path, ast.parse(ann.value, mode="eval").body)
    if isinstance(ann, ast.Name):
        if ann.id == "bool":
            return {"kind": "bool"}
        members = enum_members(src, path, ann.id)
        return {"kind": "choices", "choices": members} if members is not None else {"kind": "plain"}
    if isinstance(ann, ast.Attribute):   # e.g. signal.Signals: an Enum outside the repository has choices not listed
        return {"kind": "plain", "note": f"type {ast.unparse(ann)}: any choices it has are not listed"}
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        if isinstance(ann.right, ast.Constant) and ann.right.value is None:
            return field_type(src, path, ann.left)
        return {"kind": "error", "why": f"union {ast.unparse(ann)}"}
    if isinstance(ann, ast.Subscript):
        origin = _base_name(ann.value)
        inner = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if origin == "Optional":
            return field_type(src, path, inner[0])
        if origin == "Union":
            if len(inner) == 2 and isinstance(inner[1], ast.Constant) and inner[1].value is None:
                return field_type(src, path, inner[0])
            return {"kind": "error", "why": f"union {ast.unparse(ann)}"}
        if origin in ("list", "List") and len(inner) == 1:
            return {**field_type(src, path, inner[0]), "nargs": "+"}
        if origin == "Literal":
            return {"kind": "choices", "choices": [literal(e) for e in inner]}
    return {"kind": "error", "why": f"unsupported type {ast.unparse(ann)}"}


def _field_parts(stmt: ast.AnnAssign) -> tuple[object, dict, bool]:
    """(default node or None, argparse_meta as key -> node, init) of a dataclass field."""
    value = stmt.value
    if isinstance(value, ast.Call) and _base_name(value.func) == "field":
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        meta = {}
        metadata = kw.get("metadata")
        if isinstance(metadata, ast.Dict):
            for k, v in zip(metadata.keys, metadata.values):
                if literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                    meta = {literal(mk): mv for mk, mv in zip(v.keys, v.values)}
        init = literal(kw["init"]) if "init" in kw else True
        default = kw.get("default", kw.get("default_factory"))
        return default, meta, init is not False
    return value, {}, True


def dataclass_fields(src: Source, path: str, name: str, depth: int = 0) -> list[tuple[str, ast.AnnAssign, str]]:
    """(file, field statement, docstring) of every field of dataclass `name`, base classes' first."""
    found = find_definition(src, path, name, ast.ClassDef)
    if found is None or depth > 8:
        raise SystemExit(f"cannot find class {name} from {path}")
    cls_path, cls = found
    out: dict[str, tuple[str, ast.AnnAssign, str]] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and find_definition(src, cls_path, base.id, ast.ClassDef):
            for item in dataclass_fields(src, cls_path, base.id, depth + 1):
                out[item[1].target.id] = item
    body = cls.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = nxt.value.value if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                                  and isinstance(nxt.value.value, str)) else ""
        out[stmt.target.id] = (cls_path, stmt, " ".join(doc.split()))
    return list(out.values())


def local_value(node, scope: ast.FunctionDef):
    """A literal, or a name assigned a literal in the enclosing function (e.g. `exclude = [...]`)."""
    if isinstance(node, ast.Name):
        for stmt in ast.walk(scope):
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == node.id):
                return literal(stmt.value)
        raise SystemExit(f"cannot resolve {node.id} in {scope.name}")
    return literal(node)


def dataclass_options(src: Source, path: str, call: ast.Call, scope: ast.FunctionDef,
                      files: set[str]) -> list[Option]:
    """The options `ArgumentGroupFactory(Config, exclude=[...]).build_group(parser)` adds."""
    cls = call.args[0].id
    kw = {k.arg: k.value for k in call.keywords}
    exclude_node = kw.get("exclude", call.args[1] if len(call.args) > 1 else None)
    exclude = set(local_value(exclude_node, scope) or []) if exclude_node is not None else set()
    options = []
    for cls_path, stmt, doc in dataclass_fields(src, path, cls):
        files.add(cls_path)
        attr = stmt.target.id
        default, meta, init = _field_parts(stmt)
        if attr in exclude or not init:
            continue
        inferred = field_type(src, cls_path, stmt.annotation)
        dashed = attr.replace("_", "-")
        kwargs: dict = {"help": doc}
        names = [f"--{dashed}"]
        notes = []
        if inferred["kind"] == "bool":
            if literal(default) is False and isinstance(default, ast.Constant):
                kwargs["action"] = "store_true"
            else:
                kwargs["action"] = "store_false"
                names = [f"--no-{dashed}", f"--disable-{dashed}"]
        elif inferred["kind"] == "choices":
            kwargs["choices"] = inferred["choices"]
        elif inferred["kind"] == "error" and not meta:
            notes.append(f"Megatron cannot infer an argparse type ({inferred['why']})")
        if "nargs" in inferred:
            kwargs["nargs"] = inferred["nargs"]
        if "note" in inferred:
            notes.append(inferred["note"])
        arg_names = literal(meta.pop("arg_names")) if "arg_names" in meta else None
        kwargs.update({k: v for k, v in meta.items() if k})
        option = option_from_kwargs(arg_names or names, kwargs, f"{cls_path}:{stmt.lineno}", {})
        option.notes += notes + [f"from dataclass {cls}.{attr}"]
        options.append(option)
    return options


# ------------------------------------------------------------------------------------------------ walking
@dataclass
class Walk:
    src: Source
    options: list[Option] = field(default_factory=list)
    visited: list[str] = field(default_factory=list)       # path:function walked
    files: set[str] = field(default_factory=set)
    unresolved: list[str] = field(default_factory=list)    # add_argument calls whose option strings are not literal
    external: list[str] = field(default_factory=list)      # parser-filling calls into other packages

    def function(self, path: str, name: str) -> None:
        found = find_definition(self.src, path, name, ast.FunctionDef)
        if found is None:
            raise SystemExit(f"{self.src.git_dir}: no function {name} reachable from {path}")
        fpath, node = found
        key = f"{fpath}:{node.name}"
        if key in self.visited:
            return
        self.visited.append(key)
        self.files.add(fpath)
        lists = module_level_lists(self.src.tree(fpath))
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            self.call(fpath, node, call, lists)

    def call(self, path: str, scope: ast.FunctionDef, call: ast.Call, lists: dict) -> None:
        func = call.func
        where = f"{path}:{call.lineno}"
        kwargs = {k.arg: k.value for k in call.keywords if k.arg}
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            self.add_argument(call.args, kwargs, where, lists)
        elif isinstance(func, ast.Name) and func.id == "reset_arg":
            # slime's reset_arg(parser, name, **kw): changes the default of an existing option, else adds it
            self.add_argument(call.args[1:], kwargs, where, lists, reset=True)
        elif isinstance(func, ast.Name) and func.id == "ArgumentGroupFactory":
            self.options += dataclass_options(self.src, path, call, scope, self.files)
        elif _passes_parser(call):
            self.follow(path, scope, call)

    def add_argument(self, args, kwargs, where, lists, reset=False) -> None:
        names = [literal(a) for a in args]
        if not names or not all(isinstance(n, str) for n in names):
            self.unresolved.append(f"{where}: add_argument({', '.join(ast.unparse(a) for a in args)})")
            return
        names = [n for n in names if n.startswith("-")]
        if names:
            option = option_from_kwargs(names, kwargs, where, lists)
            if reset:
                option.notes.append("slime reset_arg: adds it when the parser lacks it, else changes its default")
            self.options.append(option)

    def follow(self, path: str, scope: ast.FunctionDef, call: ast.Call) -> None:
        func = call.func
        if isinstance(func, ast.Name):
            nested = any(isinstance(n, ast.FunctionDef) and n.name == func.id for n in ast.walk(scope))
            if nested:
                return                                    # walked with its enclosing function
            if find_definition(self.src, path, func.id, ast.FunctionDef):
                self.function(path, func.id)
            return
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            imported = imported_names(self.src, path).get(func.value.id)
            if imported and self.src.module_file(imported[0]) is None:
                self.external.append(f"{path}:{call.lineno}: {imported[0]}.{imported[1]}.{func.attr}"
                                     f"({', '.join(ast.unparse(a) for a in [*call.args, *call.keywords])})")


def _passes_parser(call: ast.Call) -> bool:
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(v, ast.Name) and ("parser" in v.id or "group" in v.id) for v in values)


def walk(src: Source, roots: list[tuple[str, str]]) -> Walk:
    w = Walk(src)
    for path, name in roots:
        w.function(path, name)
    return w


# ------------------------------------------------------------------------------------------------ deprecated
def replacement_of(text: str, start: int) -> str:
    """What a deprecation message says to use instead, from position `start` on ('' when it names nothing)."""
    m = re.search(r"\b(?:use|see|replaced by)\b[:\s]+(.*?)(?:\s+instead\b|$)", text[start:], re.IGNORECASE | re.DOTALL)
    return " ".join(m.group(1).split()).rstrip(" .,;") if m else ""


def strings_of(src: Source, path: str):
    """(line, text) of every string literal (f-strings with {...} for their fields) in a file."""
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, help_text(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def message_deprecations(src: Source, paths, known: set[str], helps: set[str]) -> list[tuple[str, str, str]]:
    """(old option, replacement, evidence) for each string (other than an option's help, read apart) that calls
    a known option deprecated / no longer valid: the last option named in the sentence before the word."""
    out = []
    for path in sorted(paths):
        for line, text in strings_of(src, path):
            m = DEPRECATED_WORDS.search(text)
            if not m or text in helps:
                continue
            sentence = re.split(r"[.!?]\s+", text[:m.start()])[-1]
            candidates = OPTION_RE.findall(sentence)
            candidates += ["--" + s.replace("_", "-") for s in re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", sentence)]
            known_here = [c for c in candidates if c in known]
            if known_here:
                text_one_line = " ".join(text.split())
                out.append((known_here[-1], replacement_of(text, m.end()), f"{path}:{line}: {text_one_line[:300]}"))
    return out


# Options whose help says "deprecated" about something else than the option (read by hand, at the commits above).
NOT_DEPRECATED = {
    "--cuda-graph-scope": "only its value \"full\" is deprecated (an empty list means the same)",
    "--ckpt-convert-update-legacy-dist-opt-format": "the legacy checkpoint format it converts is deprecated, "
                                                    "not the option",
    "--moe-use-legacy-grouped-gemm": "announced only: \"The legacy one will be deprecated soon\"",
}


def deprecations(options: list[Option], sources: list[tuple[Source, set[str]]], known: set[str]):
    """{old: replacement} and {old: [evidence, ...]} from help texts and messages."""
    found = []
    for option in options:
        m = DEPRECATED_WORDS.search(option.help)
        if m:
            found += [(name, replacement_of(option.help, m.end()),
                       f"{option.where}: help of {name}: {' '.join(option.help.split())[:300]}")
                      for name in option.names[:1]]
    helps = {o.help for o in options}
    for src, paths in sources:
        found += message_deprecations(src, paths, known, helps)
    replacement: dict[str, str] = {}
    evidence: dict[str, list[str]] = {}
    for old, new, line in found:
        if old in NOT_DEPRECATED:
            continue
        dashed = "--" + new.replace("_", "-")
        new = dashed if re.fullmatch(r"[a-z0-9_]+", new) and dashed in known else new
        if old not in replacement or _rank(new) > _rank(replacement[old]):
            replacement[old] = new
        evidence.setdefault(old, [])
        if line not in evidence[old]:
            evidence[old].append(line)
    replacement = {k: (v or "(none named: the option is ignored or refused)") for k, v in replacement.items()}
    return dict(sorted(replacement.items())), dict(sorted(evidence.items()))


def _rank(replacement: str) -> int:
    """Prefer a replacement that names an option, then any text, to none."""
    return 2 if replacement.startswith("--") else int(bool(replacement))


def conflicts(w: Walk) -> list[str]:
    """Option strings added twice by one walk (argparse refuses that within one parser; slime's pre-parse and
    SGLang parsers are separate ones, so slime may repeat a name)."""
    seen, out = {}, []
    for option in w.options:
        for name in option.names:
            if name in seen and "reset_arg" not in " ".join(option.notes):
                out.append(f"{name}: {seen[name]} and {option.where}")
            seen.setdefault(name, option.where)
    return out


# ------------------------------------------------------------------------------------------------ assembling
MEGATRON_ROOTS = [("megatron/training/arguments.py", "add_megatron_arguments")]
SLIME_ROOTS = [("slime/utils/arguments.py", "get_slime_extra_args_provider"),
               ("slime/utils/arguments.py", "_pre_parse_mode"),
               ("slime/backends/sglang_utils/arguments.py", "sglang_parse_args")]


def pinned_megatron_commit(slime: Source) -> str:
    m = re.search(r"ARG MEGATRON_COMMIT=([0-9a-f]{7,40})", slime.text("docker/Dockerfile") or "")
    if not m:
        raise SystemExit("slime's docker/Dockerfile pins no MEGATRON_COMMIT; pass --megatron-commit")
    return m.group(1)


def entry(option: Option, source: str, patched: bool = False) -> dict:
    out = {"takes_value": option.takes_value, "choices": option.choices, "nargs": option.nargs,
           "source": source, "defined_at": option.where}
    if patched:
        out["patched"] = True
    if option.notes:
        out["notes"] = option.notes
    return out


def build(slime_git: str, slime_commit: str, megatron_git: str, megatron_commit: str | None) -> dict:
    slime = Source(slime_git, slime_commit)
    megatron_commit = megatron_commit or pinned_megatron_commit(slime)
    patches = tuple(t for t in (slime.text(p) for p in SLIME_PATCHES) if t)
    pristine = walk(Source(megatron_git, megatron_commit), MEGATRON_ROOTS)
    meg = walk(Source(megatron_git, megatron_commit, patches), MEGATRON_ROOTS)
    sl = walk(slime, SLIME_ROOTS)
    unpatched = {n for o in pristine.options for n in o.names}
    options: dict[str, dict] = {}
    for source, w in (("megatron", meg), ("slime", sl)):
        for option in w.options:
            for name in option.names:
                if name not in options:                 # Megatron's parser is built before slime's additions
                    options[name] = entry(option, source, source == "megatron" and name not in unpatched)
    known = set(options)
    deprecated, evidence = deprecations(meg.options + sl.options, [(meg.src, meg.files), (sl.src, sl.files)], known)
    counts = {s: sum(1 for o in options.values() if o["source"] == s) for s in ("slime", "megatron")}
    return {
        "generated_by": "tests/data/make_slime_args.py (ast over the sources; nothing imported)",
        "slime": {"repo": "THUDM/slime", "commit": slime.commit, "roots": [f"{p}:{f}" for p, f in SLIME_ROOTS],
                  "functions_walked": sl.visited},
        "megatron": {"repo": "NVIDIA/Megatron-LM", "commit": meg.src.commit,
                     "pinned_by": "THUDM/slime docker/Dockerfile ARG MEGATRON_COMMIT",
                     "patches_applied": [p for p in SLIME_PATCHES if slime.text(p)],
                     "note": "defined_at lines of patched files are lines of the patched file",
                     "roots": [f"{p}:{f}" for p, f in MEGATRON_ROOTS], "functions_walked": meg.visited},
        "counts": counts,
        "not_extracted": sorted(set(sl.external + meg.external)),
        "unresolved_add_argument": sl.unresolved + meg.unresolved,
        "repeated_options": {"slime": conflicts(sl), "megatron": conflicts(meg)},
        "not_deprecated": NOT_DEPRECATED,
        "deprecated": deprecated,
        "deprecated_evidence": evidence,
        "options": dict(sorted(options.items())),
    }


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slime-git", required=True, help="THUDM/slime git dir (bare is fine)")
    p.add_argument("--slime-commit", default="624b824a898ab0ec1fcb4d373004c7f3852bf515")
    p.add_argument("--megatron-git", required=True, help="NVIDIA/Megatron-LM git dir (bare is fine)")
    p.add_argument("--megatron-commit", default=None, help="default: the commit slime's docker/Dockerfile pins")
    p.add_argument("--out", default=os.path.join(here, "slime_megatron_args.json"))
    args = p.parse_args(argv)
    data = build(args.slime_git, args.slime_commit, args.megatron_git, args.megatron_commit)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"{args.out}: {data['counts']['slime']} slime + {data['counts']['megatron']} Megatron options, "
          f"{len(data['deprecated'])} deprecated, {len(data['unresolved_add_argument'])} unresolved", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
