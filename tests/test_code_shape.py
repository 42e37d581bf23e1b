"""The library stays readable: no module over 800 lines, no function over 80 (issue 11's house rules),
cost_model imports nothing from the packages built on it, and its nouns nothing of ours outside themselves."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "search_space", "cost_model", "recipes", "experiments")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 800, 80


def _modules():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_module_over_800_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"modules over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_80_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


OURS = set(PACKAGES) | {"benchmarks"}
NOUNS = "cost_model.nouns"


def _imported(path: Path) -> list[str]:
    """Every module a file imports, at any depth (lazy imports too): `from a.b import c` gives a.b and a.b.c;
    a relative import is made absolute against the file's package."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [module] + [f"{module}.{a.name}" for a in node.names]
    return found


def _is_noun(name: str) -> bool:
    return name == NOUNS or name.startswith(NOUNS + ".")


def test_nouns_import_nothing_of_ours_outside_themselves():
    """The vocabulary (cost_model/nouns: layouts, workloads, models, hardware, cases, stacks, codecs, units, errors)
    sits below everything else of ours (issue 30); its __init__ imports nothing, so importing a noun runs no verb."""
    nouns = ROOT / "cost_model" / "nouns"
    assert not [n for n in _imported(nouns / "__init__.py")], "cost_model/nouns/__init__.py imports something"
    outside = [f"{path.name}: {n}" for path in sorted(nouns.rglob("*.py")) for n in _imported(path)
               if n.split(".")[0] in OURS and not _is_noun(n)]
    assert not outside, f"cost_model.nouns imports from outside itself: {outside}"


def test_cost_model_imports_nothing_above_it():
    """The cost model's verbs price the nouns; nothing in cost_model imports the packages built on it."""
    upward = [f"{path.relative_to(ROOT)}: {n}" for path in sorted((ROOT / "cost_model").rglob("*.py"))
              for n in _imported(path) if n.split(".")[0] in OURS - {"cost_model"}]
    assert not upward, f"cost_model imports from the packages above it: {upward}"


def _is_module_here(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_import_of_ours_names_a_module_of_this_checkout():
    """A module of ours that moved is imported by its new name everywhere: the venv's editable install of another
    checkout would otherwise import the old file from there without a word."""
    missing = []
    for path in [*_modules(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            missing += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in OURS
                        and not _is_module_here(n)]
    assert not missing, f"imports of modules this checkout does not have: {missing}"


def _imports_torch_at_top(tree: ast.Module) -> bool:
    tops = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in tops if isinstance(n, ast.Import) for a in n.names] + \
        [n.module or "" for n in tops if isinstance(n, ast.ImportFrom)]
    return any(x.split(".")[0] in ("torch", "megatron", "megatron_cpu") for x in names)


def _marked_torch(tree: ast.Module) -> bool:
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets):
            return "torch" in ast.unparse(n.value)
    return False


def test_test_files_importing_torch_are_the_listed_ones_and_marked_torch():
    """`make test-fast` collects without torch only if conftest leaves out exactly the files that import it at
    module level, and leaving them out loses nothing only if every test in them is marked torch."""
    from conftest import NEEDS_TORCH_TO_IMPORT

    importing = {p.name for p in (ROOT / "tests").glob("test_*.py") if _imports_torch_at_top(ast.parse(p.read_text()))}
    assert importing == set(NEEDS_TORCH_TO_IMPORT)
    unmarked = [n for n in importing if not _marked_torch(ast.parse((ROOT / "tests" / n).read_text()))]
    assert not unmarked, f"import torch at module level but not marked torch as a whole: {unmarked}"


MAX_PARAMETERS = 8


def _parameter_counts():
    """(path function, parameters) of every function: self/cls of a method not counted, *args and **kwargs one each."""
    def visit(node, path, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                positional = a.posonlyargs + a.args
                n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                if in_class and positional and positional[0].arg in ("self", "cls"):
                    n -= 1
                yield f"{path} {child.name}", n
                yield from visit(child, path, False)
            else:   # a method is a function in a class's body
                yield from visit(child, path, in_class or isinstance(child, ast.ClassDef))
    for path in _modules():
        yield from visit(ast.parse(path.read_text()), str(path.relative_to(ROOT)), False)


def test_no_function_takes_more_than_8_parameters():
    """A function that needs many inputs takes one context object (issue 30)."""
    many = {name: n for name, n in _parameter_counts() if n > MAX_PARAMETERS}
    assert not many, f"functions over {MAX_PARAMETERS} parameters (take a context object): {many}"


def _private_names_defined_in(package: Path) -> set[str]:
    """The _names the package itself defines (functions, classes, attributes it assigns): reading those is not
    reading another library's internals."""
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def test_optuna_internals_only_in_the_adapter():
    """Every use of Optuna's internals is in tuner/optuna_adapter.py (one place to check on a new Optuna): elsewhere
    in tuner no import of a private module of it, and no private attribute that tuner does not define itself."""
    own = _private_names_defined_in(ROOT / "tuner")
    found = []
    for path in sorted((ROOT / "tuner").glob("*.py")):
        if path.name == "optuna_adapter.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                name = next((m for m in modules if any(p.startswith("_") for p in m.split("."))), None)
            elif isinstance(node, ast.Import):
                name = next((a.name for a in node.names if a.name.startswith("optuna.")
                             and any(p.startswith("_") for p in a.name.split("."))), None)
            elif isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr", "setattr") \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                name = str(node.args[1].value)
            private = [p for p in (name or "").split(".") if p.startswith("_") and not p.startswith("__")]
            if private and not set(private) <= own:
                found.append(f"{path.name}:{node.lineno} {name}")
    assert not found, f"Optuna internals outside tuner/optuna_adapter.py: {found}"


# The readers of stored trials (issue 30): each reads TrialRecords (tuner.trial_record), none a trial's attributes.
TRIAL_READERS = {"report.py": ("read_trials",), "report_html.py": ("read_trials",), "export.py": ("read_trial",),
                 "study.py": ("read_trial", "read_trials"), "study_commands.py": (), "agent.py": (),
                 "report_figures.py": ()}
# study.py's own bookkeeping of the trials it runs and claims reads their attributes raw: only these functions read
# records there
STUDY_READERS = ("history_of", "check_figures")


def _trial_attribute_reads(tree) -> list[int]:
    """Lines reading `.user_attrs` of anything but a study."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "user_attrs"
            and not (isinstance(n.value, ast.Name) and n.value.id == "study")]


def test_show_export_report_study_and_agent_read_trial_records():
    for name, readers in TRIAL_READERS.items():
        tree = ast.parse((ROOT / "tuner" / name).read_text())
        if name == "study.py":
            tree = ast.Module([n for n in tree.body if getattr(n, "name", "") in STUDY_READERS], [])
            assert len(tree.body) == len(STUDY_READERS)
        assert not _trial_attribute_reads(tree), f"{name} reads a trial's attributes, not a TrialRecord"
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert set(readers) <= called, f"{name} does not read trials through {readers}"
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not imported & {"stored_attrs", "rankable"}
