"""Issue 15, point 6: fuzz every user file `tune` reads, through the real CLI in-process.

config.json (catalog models mutated), recipes (the reference recipes mutated), hardware profiles (the shipped
H200 profile mutated), loss curves (CSV and both JSON forms, for `tune check-convergence`) and `tune predict
--batch` lines. Each example must end in a documented exit code, never a traceback, never a hang (an alarm
per example besides hypothesis's deadline) and never unbounded memory (the address space is capped while
these tests run); a refusal is exactly one stderr line; nothing with a terminal escape or a control
character reaches the terminal; a --json answer is strict JSON; a written recipe's `run` stays one command
per line; a batch answers every non-blank line, in place. Reading /dev/zero-like inputs is left to
benchmarks/hostile_inputs.py (a subprocess under a memory limit).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import resource
import signal
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from fuzz_strategies import BigInt, Nested, apply, documents, hostile_values, paths, to_json, to_yaml
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "cost_model/catalog/models"
RECIPE_DIR = ROOT.parent / "shared/reference/recipes/qwen3.6-35b-a3b/h200"
if not RECIPE_DIR.is_dir():   # a checkout without ../shared: the copies kept beside the tests
    RECIPE_DIR = ROOT / "tests/fixtures/reference_recipes"
PROFILE = ROOT / "cost_model/data/profiles/h200.yaml"

CONFIG_BASES = {n: yaml.safe_load((CATALOG / f"{n}.yaml").read_text())
                for n in ("qwen3-30b-a3b", "qwen3.6-35b-a3b", "deepseek-v3", "llama3-8b", "gpt-oss-20b")}
RECIPE_BASES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(RECIPE_DIR.glob("*.yaml"))}
PROFILE_BASES = {"h200": yaml.safe_load(PROFILE.read_text())}

SECONDS_PER_EXAMPLE = 30      # the alarm: a hang fails the example instead of the whole run
MEMORY_HEADROOM = 4 << 30     # bytes of address space an example may add before MemoryError
TUNE_PREFIXES = ("tune: error:",)
CONVERGENCE_PREFIXES = ("tune: error:", "error:", "tune check-convergence: error:")
QUICK = settings(max_examples=12, deadline=timedelta(seconds=10),
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                        HealthCheck.data_too_large, HealthCheck.large_base_example])
FULL = settings(QUICK, max_examples=100)
# What may reach a terminal: printable text, newlines and tabs (no escapes, no other C0/C1 controls).
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# ---------------------------------------------------------------- running the CLI under a deadline

class Hang(BaseException):
    """The alarm went off: the command ran past SECONDS_PER_EXAMPLE (BaseException: no `except Exception` eats it)."""


@contextmanager
def alarm(seconds: float):
    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module", autouse=True)
def bounded_memory():
    """Cap the address space at what the process has now plus MEMORY_HEADROOM: unbounded growth on an input
    becomes a MemoryError (a failed example) instead of an OOM-killed machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
              if line.startswith("VmSize:"))
    cap = vm + MEMORY_HEADROOM if hard == resource.RLIM_INFINITY else min(hard, vm + MEMORY_HEADROOM)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run(argv: list[str], capsys, ok=(0, 2), prefixes=TUNE_PREFIXES) -> tuple[int, str, str]:
    """Run `tune argv` in-process; fail on a hang, an escaped exception, a disallowed exit code, a refusal that
    is not one line, or anything unprintable on the terminal. Returns (code, stdout, stderr)."""
    capsys.readouterr()
    try:
        with alarm(SECONDS_PER_EXAMPLE):
            code = main(argv)
    except SystemExit as e:   # argparse's own exit (check-convergence parses its own flags)
        code = e.code if isinstance(e.code, int) else 2
    except Hang as e:
        pytest.fail(f"tune {' '.join(argv)[:300]}: hang: {e}")
    except BaseException as e:  # noqa: BLE001 - every escaped exception is the finding
        pytest.fail(f"tune {' '.join(argv)[:300]}: {type(e).__name__} escaped (a traceback):\n"
                    + "".join(traceback.format_exception(e))[-2000:])
    out, err = capsys.readouterr()
    event(f"exit {code}")     # --hypothesis-show-statistics: how many examples got past the checks
    where = f"tune {' '.join(argv)[:300]}"
    assert code in ok, f"{where}: exit {code}; stderr: {err[-600:]!r}"
    assert "Traceback" not in out + err, f"{where}: a traceback was printed: {err[-1500:]}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(prefixes), f"{where}: not one error line: {err[-800:]!r}"
    bad = UNPRINTABLE.search(out + err)
    assert not bad, f"{where}: {bad.group()!r} reached the terminal: {(out + err)[max(0, bad.start() - 80):bad.end() + 20]!r}"
    return code, out, err


def strict_json(text: str, where: str):
    """JSON as the standard reads it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise AssertionError(f"{where}: {constant} in JSON output (not valid JSON): {text[:300]!r}")
    return json.loads(text, parse_constant=refuse)


_names = itertools.count()


def write(folder: Path, data: bytes, suffix: str, stem: str = "input") -> Path:
    """A fresh file per example (the model loader caches by path and mtime)."""
    path = folder / f"{stem}-{next(_names)}{suffix}"
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ---------------------------------------------------------------- what an answer must look like

def assert_run_is_one_command(run_text: str, where: str) -> None:
    """A recipe's `run`: comments, exports and blank lines, then one command whose every later line continues
    the one before (a trailing backslash). A field that broke a line would leave a bare shell line."""
    assert not UNPRINTABLE.search(run_text.replace("\n", "")), f"{where}: control character in run: {run_text!r}"
    lines = run_text.rstrip("\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("python")), None)
    assert start is not None, f"{where}: no command in run: {run_text[:400]!r}"
    for line in lines[:start]:
        assert not line.strip() or line.startswith(("#", "export ")), f"{where}: bare shell line {line!r} in run"
    for before, line in zip(lines[start:], lines[start + 1:]):
        assert before.endswith("\\"), f"{where}: line {line!r} is not a continuation of the command in run"


def check_answer(argv: list[str], mode: str, capsys, recipe_out: Path | None = None) -> int:
    """Run a predict command in one of three output modes and check its answer."""
    code, out, _ = run(argv, capsys)
    if code == 0 and mode == "json":
        answer = strict_json(out, " ".join(argv))
        assert isinstance(answer, dict) and "tokens_per_s_per_gpu" in answer
    if code == 0 and mode == "recipe-out":
        recipe = yaml.safe_load(recipe_out.read_text())
        assert_run_is_one_command(recipe["run"], str(recipe_out))
        assert not UNPRINTABLE.search(str(recipe.get("model"))), f"unprintable model name {recipe.get('model')!r}"
    if code != 0 and recipe_out is not None:
        assert not recipe_out.exists(), f"a refused command wrote {recipe_out}"
    return code


def mode_args(mode: str, folder: Path) -> tuple[list[str], Path | None]:
    if mode == "json":
        return ["--json"], None
    if mode == "recipe-out":
        out = folder / f"out-{next(_names)}.yaml"
        return ["--recipe-out", str(out)], out
    return [], None


MODES = st.sampled_from(["json", "text", "recipe-out"])


# ---------------------------------------------------------------- config.json

def config_with(name: str = "qwen3-30b-a3b", **changes) -> bytes:
    data = CONFIG_BASES[name]
    return to_json(apply(data, [((k,), "set", v) for k, v in changes.items()])).encode()


def display_name(value) -> bytes:
    return to_json(apply(CONFIG_BASES["qwen3-30b-a3b"], [(("_attune", "display_name"), "set", value)])).encode()


def check_config(doc: bytes, mode: str, layout: list[str], folder: Path, capsys) -> None:
    path = write(folder, doc, ".json", "config")
    extra, out = mode_args(mode, folder)
    check_answer(["predict", "--model", str(path), "--gpu", "h200", "--layout", *layout, *extra], mode, capsys, out)


CONFIG_DOCS = documents(CONFIG_BASES, "json")
LAYOUTS = st.sampled_from([["ep=8"], ["tp=2", "ep=4"], ["pp=2", "ep=4"], []])


@QUICK
@given(doc=CONFIG_DOCS, mode=MODES, layout=LAYOUTS)
@example(doc=display_name("Evil\ntouch pwned #"), mode="recipe-out", layout=["ep=8"])
@example(doc=display_name("\x1b[2J\x1b[31mred"), mode="text", layout=["ep=8"])
@example(doc=config_with(num_hidden_layers=10**7), mode="json", layout=["ep=8"])
@example(doc=config_with(num_hidden_layers=1e30), mode="json", layout=["ep=8"])
@example(doc=config_with(hidden_size=BigInt(5000)), mode="json", layout=["ep=8"])
@example(doc=config_with(num_experts=Nested(3000)), mode="json", layout=["ep=8"])
@example(doc=config_with(num_attention_heads=float("nan")), mode="json", layout=["ep=8"])
@example(doc=Nested(3000).text().encode(), mode="json", layout=["ep=8"])
def test_config_json_quick(doc, mode, layout, folder, capsys):
    check_config(doc, mode, layout, folder, capsys)


@pytest.mark.slow
@FULL
@given(doc=CONFIG_DOCS, mode=MODES, layout=LAYOUTS)
def test_config_json(doc, mode, layout, folder, capsys):
    check_config(doc, mode, layout, folder, capsys)


# ---------------------------------------------------------------- recipes

def recipe_with(*mutations) -> bytes:
    return to_yaml(apply(RECIPE_BASES["attune-tp1-pp1-ep8"], list(mutations))).encode()


def check_recipe(doc: bytes, mode: str, folder: Path, capsys) -> None:
    path = write(folder, doc, ".yaml", "recipe")
    extra, out = mode_args(mode, folder)
    check_answer(["predict", "--recipe", str(path), *extra], mode, capsys, out)


RECIPE_DOCS = documents(RECIPE_BASES, "yaml")


@QUICK
@given(doc=RECIPE_DOCS, mode=MODES)
@example(doc=Nested(3000).text().encode(), mode="json")
@example(doc=recipe_with((("layout", "tp"), "set", BigInt(5000))), mode="json")
@example(doc=recipe_with((("workload", "global_batch"), "set", 1e30)), mode="json")
@example(doc=recipe_with((("layout", "rows_per_microbatch"), "set", 10**6)), mode="json")
@example(doc=recipe_with((("layout", "ep"), "set", "8")), mode="json")
@example(doc=recipe_with((("model",), "set", "Qwen3.6-35B-A3B\nexport EVIL=1")), mode="recipe-out")
def test_recipe_quick(doc, mode, folder, capsys):
    check_recipe(doc, mode, folder, capsys)


@pytest.mark.slow
@FULL
@given(doc=RECIPE_DOCS, mode=MODES)
def test_recipe(doc, mode, folder, capsys):
    check_recipe(doc, mode, folder, capsys)


# ---------------------------------------------------------------- hardware profiles

def profile_with(*mutations) -> bytes:
    return to_yaml(apply(PROFILE_BASES["h200"], list(mutations))).encode()


def check_profile(doc: bytes, mode: str, folder: Path, capsys) -> None:
    path = write(folder, doc, ".yaml", "profile")
    extra, out = mode_args(mode, folder)
    check_answer(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--layout", "ep=8",
                  "--profile", str(path), *extra], mode, capsys, out)


# Paths into the profile are many (every section's entries); mutate up to 2 per example.
PROFILE_DOCS = documents(PROFILE_BASES, "yaml", max_mutations=2)


@pytest.mark.slow
@QUICK
@given(doc=PROFILE_DOCS, mode=MODES)
@example(doc=profile_with((("gemm_bf16",), "set", [])), mode="json")
@example(doc=profile_with((("gemm_bf16", "*", "tflops"), "set", 0)), mode="json")
@example(doc=profile_with((("gemm_bf16", "*", "tflops"), "set", float("nan"))), mode="json")
@example(doc=profile_with((("gemm_bf16", "*", "tflops"), "set", -1.0)), mode="json")
@example(doc=profile_with((("memory", "hbm_copy_tb_s"), "set", float("inf"))), mode="json")
@example(doc=profile_with((("collectives",), "set", Nested(3000))), mode="json")
def test_profile_quick(doc, mode, folder, capsys):
    check_profile(doc, mode, folder, capsys)


# A profile example loads and checks the whole profile (~1 s): 15 here (test_profile_quick has its own);
# ATTUNE_FUZZ_PROFILE_EXAMPLES=N for more.
@pytest.mark.slow
@settings(FULL, max_examples=int(os.environ.get("ATTUNE_FUZZ_PROFILE_EXAMPLES", "15")))
@given(doc=PROFILE_DOCS, mode=MODES)
def test_profile(doc, mode, folder, capsys):
    check_profile(doc, mode, folder, capsys)


# ---------------------------------------------------------------- loss curves (tune check-convergence)

def base_curve(n: int, form: str):
    losses = [round(10.0 / (1 + 0.1 * i), 4) for i in range(n)]
    if form == "csv":
        return [["step", "loss", "grad_norm"]] + [[i, loss, 1.0] for i, loss in enumerate(losses)]
    if form == "records":
        return [{"step": i, "loss": loss, "grad_norm": 1.0} for i, loss in enumerate(losses)]
    return {"steps": list(range(n)), "losses": losses}


def curve_text(data, form: str) -> str:
    if form != "csv":
        return to_json(data)
    if not isinstance(data, list):       # the whole table replaced by one value
        return _cell(data) + "\n"
    rows = [row if isinstance(row, list) else [row] for row in data]
    return "".join(",".join(_csv_quote(_cell(c)) for c in row) + "\n" for row in rows)


def _cell(value) -> str:
    if isinstance(value, (BigInt, Nested)):
        return value.text()
    return value if isinstance(value, str) else to_json(value) if isinstance(value, (list, dict)) else str(value)


def _csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


@st.composite
def curves(draw) -> tuple[bytes, str, int]:
    """(file bytes, suffix, steps): a curve in one of the three forms, mutated at up to 3 paths."""
    n = draw(st.integers(1, 30))
    form = draw(st.sampled_from(["csv", "records", "columns"]))
    data = base_curve(n, form)
    if draw(st.booleans()):
        data = apply(data, draw(st.lists(st.tuples(st.sampled_from(paths(data)), st.sampled_from(["set", "delete"]),
                                                   hostile_values()), min_size=1, max_size=3)))
    suffix = draw(st.sampled_from([".csv" if form == "csv" else ".json", ".txt", ""]))
    return curve_text(data, form).encode("utf-8", "surrogatepass"), suffix, n


def check_curve(candidate: tuple[bytes, str, int], as_json: bool, folder: Path, capsys) -> None:
    data, suffix, n = candidate
    cand = write(folder, data, suffix, "candidate")
    ref = write(folder, to_json(base_curve(n, "columns")).encode(), ".json", "reference")
    argv = ["check-convergence", "--candidate", str(cand), "--reference", str(ref)] + (["--json"] if as_json else [])
    code, out, _ = run(argv, capsys, ok=(0, 1, 2), prefixes=CONVERGENCE_PREFIXES)
    if code in (0, 1) and as_json:
        verdict = strict_json(out, " ".join(argv))
        assert isinstance(verdict, dict) and verdict, f"{argv}: empty verdict"


def csv_curve(*rows) -> tuple[bytes, str, int]:
    return "".join(line + "\n" for line in ("step,loss", *rows)).encode(), ".csv", len(rows)


@QUICK
@given(candidate=curves(), as_json=st.booleans())
@example(candidate=(Nested(3000).text().encode(), ".json", 3), as_json=True)
@example(candidate=(b'{"steps": [0, 1, ' + BigInt(5000).text().encode() + b'], "losses": [1, 2, 3]}', ".json", 3),
         as_json=True)
@example(candidate=csv_curve("0,nan", "1,inf", "2,-inf"), as_json=True)
@example(candidate=csv_curve("0,1e309", "1," + BigInt(5000).text(), "2,1"), as_json=True)
@example(candidate=(b"", ".csv", 1), as_json=False)
# finite losses near the float limit: their squares once overflowed math.fsum (OverflowError, not a verdict)
@example(candidate=csv_curve("0,1.7e308", "1,-1.7e308", "2,1.7e308", "3,-1.7e308"), as_json=True)
def test_loss_curve_quick(candidate, as_json, folder, capsys):
    check_curve(candidate, as_json, folder, capsys)


@pytest.mark.slow
@settings(FULL, max_examples=200)
@given(candidate=curves(), as_json=st.booleans())
def test_loss_curve(candidate, as_json, folder, capsys):
    check_curve(candidate, as_json, folder, capsys)


# ---------------------------------------------------------------- predict --batch lines

# Requests the cost model answers; each is told apart in the answer by its GPU count (recipe: 8 GPUs).
GOOD_REQUESTS = ({"model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 8, "layout": {"ep": 8}},
                 {"model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 16, "layout": {"ep": 16}},
                 {"recipe": str(RECIPE_DIR / "attune-tp1-pp1-ep8.yaml"), "usd_per_gpu_hour": 3.5})
GOOD_GPUS = (8, 16, 8)
# One line of text: nothing any reader could take for a line break.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
RAW_LINES = st.text(alphabet=st.characters(blacklist_characters=LINE_BREAKS, blacklist_categories=("Cs",)),
                    min_size=1, max_size=80).filter(str.strip)


@st.composite
def batch_lines(draw) -> list[tuple[str, int | None]]:
    """(line, index into GOOD_REQUESTS or None): good requests, mutated ones, JSON that is no request, raw text."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["good", "good", "mutated", "mutated", "mutated", "json", "raw", "blank"]))
        if kind == "good":
            i = draw(st.integers(0, len(GOOD_REQUESTS) - 1))
            lines.append((json.dumps(GOOD_REQUESTS[i]), i))
        elif kind == "mutated":
            base = draw(st.sampled_from(GOOD_REQUESTS))
            keys = [(k,) for k in ("model", "gpu", "gpus", "seq_len", "global_batch", "precision", "routing",
                                   "framework", "usd_per_gpu_hour", "stack_fix", "layout", "recipe", "unknown")]
            muts = draw(st.lists(st.tuples(st.sampled_from(paths(base) + keys), st.sampled_from(["set", "delete"]),
                                           hostile_values()), min_size=1, max_size=2))
            lines.append((to_json(apply(base, muts)), None))
        elif kind == "json":
            lines.append((to_json(draw(hostile_values())), None))
        elif kind == "raw":
            lines.append((draw(RAW_LINES), None))
        else:
            lines.append((draw(st.sampled_from(["", "  ", "\t"])), None))
    return lines


def check_batch(lines: list[tuple[str, int | None]], folder: Path, capsys) -> None:
    path = write(folder, ("\n".join(text for text, _ in lines) + "\n").encode("utf-8", "surrogatepass"), ".jsonl",
                 "batch")
    code, out, _ = run(["predict", "--batch", str(path)], capsys, ok=(0, 1))
    asked = [(text, good) for text, good in lines if text.strip()]   # blank lines are skipped, not answered
    answers = out.splitlines()
    assert len(answers) == len(asked), f"{len(asked)} requests, {len(answers)} answers: {out[-800:]!r}"
    for number, ((text, good), line) in enumerate(zip(asked, answers), 1):
        answer = strict_json(line, f"answer {number}")
        assert isinstance(answer, dict), f"answer {number} is not an object: {line[:200]!r}"
        if good is not None:
            assert "error" not in answer, f"good request {number} ({text[:120]}) got {answer['error']!r}"
            assert answer["gpus"] == GOOD_GPUS[good], f"answer {number} is another request's answer"
        elif "error" in answer:
            assert isinstance(answer["error"], str) and "\n" not in answer["error"]
        else:
            assert "tokens_per_s_per_gpu" in answer, f"answer {number}: neither a result nor an error: {line[:200]}"
    errors = sum("error" in json.loads(line) for line in answers)
    assert code == (1 if errors else 0), f"exit {code} with {errors} error objects (documented: 1 iff any)"


def batch_case(**changes) -> list[tuple[str, int | None]]:
    """A bad request between two good ones: the good ones must still be answered, in place."""
    bad = to_json({**GOOD_REQUESTS[0], **changes})
    return [(json.dumps(GOOD_REQUESTS[0]), 0), (bad, None), (json.dumps(GOOD_REQUESTS[1]), 1)]


@QUICK
@given(lines=batch_lines())
@example(lines=batch_case(seq_len="8192"))
@example(lines=batch_case(gpu=["h200"]))
@example(lines=batch_case(recipe=123))
@example(lines=batch_case(global_batch=1e30))
@example(lines=batch_case(gpus=BigInt(5000)))
@example(lines=batch_case(layout=Nested(3000)))
@example(lines=batch_case(usd_per_gpu_hour=float("nan")))
@example(lines=batch_case(layout={"ep": 8, "rows_per_microbatch": 10**6}))
def test_predict_batch_quick(lines, folder, capsys):
    check_batch(lines, folder, capsys)


@pytest.mark.slow
@settings(FULL, max_examples=60)
@given(lines=batch_lines())
def test_predict_batch(lines, folder, capsys):
    check_batch(lines, folder, capsys)
