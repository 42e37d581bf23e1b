"""Issue 15, part C: the command line's hostile-but-fair inputs. Numbers from flags and batch lines are
checked for type, finiteness and range where they are read; `predict --batch` answers every line; the
work before the first output is bounded; every usage error is one line `tune: error: ...` and exit 2,
with nothing written."""
from __future__ import annotations

import io
import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from search_space import enumerate as space
from tuner import what_if
from tuner.cli import COMMANDS, DELEGATED, main
from tuner.options import MAX_LAYERS, OWN_PARSER_SUBCOMMANDS, SUBCOMMANDS
from tuner.predict_request import MAX_USD_PER_GPU_HOUR
from tests.conftest import never_scored

ROOT = Path(__file__).resolve().parents[1]
TARGET = ["--model", "qwen3-30b-a3b", "--gpu", "h200"]
GOOD = {"model": "qwen3-30b-a3b", "gpu": "h200", "layout": {"ep": 8}}


def one_line_error(capsys, code) -> str:
    """The command failed as a user error: exit 2 and exactly one line `tune: error: ...` on stderr."""
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("tune: error: "), err
    return err[0]


def batch(tmp_path: Path, capsys, lines: list) -> tuple[int, list[dict]]:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    code = main(["predict", "--batch", str(path)])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# ---------------------------------------------------------------- predict --batch answers every line

def test_batch_answers_every_line_in_place(tmp_path, capsys):
    lines = [{**GOOD, "seq_len": "8192"}, {**GOOD, "gpu": ["h200"]}, {"recipe": 123}, [1, 2], "{not json",
             "x" * (what_if.MAX_REQUEST_CHARS + 10), "", GOOD, '"a string"', {**GOOD, "gpus": 16}]
    code, out = batch(tmp_path, capsys, lines)
    asked = [n for n, line in enumerate(lines, 1) if line != ""]        # the blank line is skipped
    assert [o["line"] for o in out] == asked
    assert code == 1, "a batch with an error object exits 1"
    errors = {o["line"]: o["error"] for o in out if "error" in o}
    assert set(errors) == {1, 2, 3, 4, 5, 6, 9}
    assert all(text.startswith(f"line {n}: ") and "\n" not in text for n, text in errors.items())
    assert "seq_len must be an integer" in errors[1] and "gpu must be a string" in errors[2]
    assert "recipe must be a string" in errors[3] and "must be a JSON object" in errors[4]
    assert "malformed JSON" in errors[5] and f"longer than {what_if.MAX_REQUEST_CHARS:,}" in errors[6]
    answered = {o["line"]: o for o in out if "error" not in o}
    assert answered[8]["gpus"] == 8 and answered[8]["tokens_per_s_per_gpu"] > 0
    assert answered[10]["gpus"] == 16, "the answer after the bad lines is its own request's"


def test_batch_of_good_lines_exits_0(tmp_path, capsys):
    code, out = batch(tmp_path, capsys, [GOOD, {**GOOD, "gpus": 16}])
    assert code == 0 and [o["gpus"] for o in out] == [8, 16]


@pytest.mark.parametrize("field, value, words", [
    ("seq_len", "8192", "seq_len must be an integer"), ("global_batch", 1e30, "global_batch must be an integer"),
    ("global_batch", 10 ** 30, "global_batch must be between 1 and 1,048,576"),
    ("gpus", 2 ** 63, "gpus must be between 1 and 4,096"), ("gpus", 0, "gpus must be between 1 and 4,096"),
    ("gpus", -1, "gpus must be between 1"), ("gpus", True, "gpus must be an integer"),
    ("gpu", ["h200"], "gpu must be a string"), ("recipe", 123, "recipe must be a string"),
    ("usd_per_gpu_hour", -1, "usd_per_gpu_hour must be a number above 0"),
    ("usd_per_gpu_hour", 1e308, f"at most {MAX_USD_PER_GPU_HOUR:,}"),
    ("usd_per_gpu_hour", "NaN", "got NaN"), ("usd_per_gpu_hour", "Infinity", "got Infinity"),
    ("stack_fix", [1], "stack_fix must be a string or a list"), ("stack_fix", "bogus", "unknown stack_fix"),
    ("layout", {"ep": 8, "rows_per_microbatch": 4}, "rows_per_microbatch 4 is more than the 1 rows"),
])
def test_batch_numbers_are_checked_where_read(tmp_path, capsys, field, value, words):
    base = {**GOOD, "global_batch": 8} if field == "layout" else GOOD
    request = json.dumps({k: v for k, v in base.items() if k != field})[:-1]   # NaN and Infinity as JSON text
    bad = request + f', "{field}": ' + (value if value in ("NaN", "Infinity") else json.dumps(value)) + "}"
    code, out = batch(tmp_path, capsys, [bad, GOOD])
    assert code == 1 and len(out) == 2
    assert out[0]["line"] == 1 and words in out[0]["error"], out[0]
    assert "error" not in out[1]


def test_batch_from_stdin_survives_undecodable_bytes(monkeypatch, capsys):
    raw = b"\xff\xfe{\n" + json.dumps(GOOD).encode() + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    assert main(["predict", "--batch", "-"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0]["line"] == 1 and "malformed JSON" in out[0]["error"]
    assert out[1]["line"] == 2 and out[1]["gpus"] == 8


def test_batch_of_endless_binary_input_ends(monkeypatch, capsys):
    class Zeros(io.StringIO):           # /dev/zero: NULs without end
        def readline(self, limit=-1):
            return "\x00" * (limit if limit > 0 else 4096)

    monkeypatch.setattr(sys, "stdin", Zeros())
    assert main(["predict", "--batch", "-"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 1 and "not text" in out[0]["error"]
    # an endless line of text ends too, after a bounded read
    monkeypatch.setattr(what_if, "MAX_DROPPED_CHARS", 10 ** 6)

    class Endless(io.StringIO):
        def readline(self, limit=-1):
            return "a" * (limit if limit > 0 else 4096)

    monkeypatch.setattr(sys, "stdin", Endless())
    assert main(["predict", "--batch", "-"]) == 1
    assert "no line end" in capsys.readouterr().out


def test_batch_request_count_is_bounded(monkeypatch, capsys):
    monkeypatch.setattr(what_if, "MAX_BATCH_REQUESTS", 3)
    read = []

    class Requests(io.StringIO):       # counts what the batch reads, to show it stops at the bound
        def readline(self, limit=-1):
            line = super().readline(limit)
            read.append(line)
            return line

    monkeypatch.setattr(sys, "stdin", Requests("{}\n" * 10))
    assert main(["predict", "--batch", "-"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["line"] for o in out] == [1, 2, 3, 4]
    assert "more than 3 requests" in out[3]["error"] and len(read) == 4


def test_an_over_long_line_is_never_held(monkeypatch, capsys):
    monkeypatch.setattr(what_if, "MAX_REQUEST_CHARS", 100)
    sizes = []

    class Requests(io.StringIO):
        def readline(self, limit=-1):
            line = super().readline(limit)
            sizes.append(len(line))
            return line

    monkeypatch.setattr(sys, "stdin", Requests("[" * 10_000 + "\n" + json.dumps({"model": 1}) + "\n"))
    assert main(["predict", "--batch", "-"]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "longer than 100 characters" in out[0]["error"] and "model must be a string" in out[1]["error"]
    assert max(sizes) <= 101


# ---------------------------------------------------------------- numbers from flags

@pytest.mark.parametrize("argv, words", [
    ([*TARGET, "--usd-per-gpu-hour", "nan"], "--usd-per-gpu-hour: must be a finite number above 0"),
    ([*TARGET, "--usd-per-gpu-hour", "inf"], "--usd-per-gpu-hour"),
    ([*TARGET, "--usd-per-gpu-hour", "-1"], "--usd-per-gpu-hour"),
    ([*TARGET, "--usd-per-gpu-hour", "0"], "--usd-per-gpu-hour"),
    ([*TARGET, "--usd-per-gpu-hour", "1e308"], f"at most {MAX_USD_PER_GPU_HOUR:,}"),
    (["predict", *TARGET, "--usd-per-gpu-hour", "nan", "--layout", "ep=8", "--json"], "--usd-per-gpu-hour"),
    ([*TARGET, "--global-batch", "1e30"], "--global-batch: expected an integer, got '1e30'"),
    ([*TARGET, "--global-batch", "1" + "0" * 30], "--global-batch: must be between 1 and 1,048,576"),
    ([*TARGET, "--seq-len", "0"], "--seq-len: must be between 1"),
    ([*TARGET, "--gpus", str(2 ** 63)], "--gpus: must be between 1 and 4,096"),
    ([*TARGET, "--gpus", "0x10"], "--gpus: expected an integer"),
    ([*TARGET, "--gpus", "1_0"], "--gpus: expected an integer"),
    ([*TARGET, "--layers", "10000000"], f"--layers: must be between 1 and {MAX_LAYERS:,}"),
    ([*TARGET, "--trials", "0"], "--trials: must be between 1"),
    ([*TARGET, "--gpu-hours", "nan"], "--gpu-hours"),
    ([*TARGET, "--study", ""], "--study"),
    (["predict", *TARGET, "--layout", "ep=8", "ep=4"], "layout key 'ep' is given twice"),
    (["predict", *TARGET, "--layout", "ep=8", "--layout", "ep=4"], "layout key 'ep' is given twice"),
    (["predict", *TARGET, "--layout", "ep=8", "recompute-granularity=full", "recompute_granularity=none"],
     "'recompute_granularity' is given twice"),
    (["predict", *TARGET, "--global-batch", "8", "--layout", "ep=8", "rows_per_microbatch=4"],
     "rows_per_microbatch 4 is more than the 1 rows each DP rank gets per step (global batch 8 / DP 8)"),
    (["show", "--study", "x", "--limit", "-1"], "--limit: must be between 1"),
    (["show", "--study", "x", "--limit", "0"], "--limit: must be between 1"),
    (["export", "--study", "x", "--top", "-1", "--out", "o"], "--top: must be between 1 and 1,000"),
    (["export", "--study", "x", "--top", "0", "--out", "o"], "--top: must be between 1 and 1,000"),
])
def test_bad_numbers_end_in_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    storage = ["--storage", str(tmp_path / "s.db")] if argv[0] in ("show", "export", "--model") else []
    assert words in one_line_error(capsys, main(argv + storage))
    assert not list(tmp_path.iterdir()), "nothing written"


def test_help_documents_the_bounds(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("at most 4,096)", f"at most {MAX_LAYERS:,})", "at most 1,048,576)", "at most 100,000)",
                   f"at most {MAX_USD_PER_GPU_HOUR:,})"):
        assert needle in text
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit 0: every request answered with a result; 1: at least one error object" in text


# ---------------------------------------------------------------- bounded work

def test_a_huge_gpu_count_is_refused_at_once(capsys, no_scoring):
    line = one_line_error(capsys, main([*TARGET, "--gpus", "9223372036854775808"]))
    assert "between 1 and 4,096" in line


@pytest.mark.slow
def test_first_output_for_1024_gpus_within_seconds(tmp_path):
    """The space of 1,024 GPUs takes minutes to score; the command says what it is doing before it scores (how soon,
    about 2 s on an idle machine, is benchmarks/scale.py's to print: this verdict does not depend on the speed)."""
    p = subprocess.Popen([sys.executable, "-m", "tuner", *TARGET, "--gpus", "1024", "--trials", "1", "--storage",
                          str(tmp_path / "s.db")], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:   # progress is on stdout when stderr is no terminal (tuner.progress): stderr is for the one error line
        ready, _, _ = select.select([p.stdout], [], [], 300)    # a guard against a hang only
        assert ready, "no output within 300 s"
        first = p.stdout.readline()
        assert "scoring the search space" in first and "1024 x H200" in first, first
    finally:
        p.kill()
        p.wait()


def test_an_oversized_space_is_refused_before_scoring(tmp_path, monkeypatch, capsys):
    """A config with 4,096 experts and 512 layers on 4,096 GPUs: ~6.2 million layouts, more than one study scores.
    Its scoring prunes (tuner.space_pruning: a space is planned up to MAX_PLANNED_LAYOUTS, at most MAX_SPACE_LAYOUTS
    of it scored; this one proposes in ~80 s on a 2-core machine); a space over the planned bound (lowered here to
    5 million) is refused in one line, before any scoring."""
    from tuner import space_scoring

    monkeypatch.setattr(space_scoring, "MAX_PLANNED_LAYOUTS", 5_000_000)
    config = yaml.safe_load((ROOT / "cost_model/catalog/models/qwen3-30b-a3b.yaml").read_text())
    config.update(num_experts=4096, num_hidden_layers=512, num_attention_heads=64, num_key_value_heads=64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(space_scoring._Scoring, "take_shape", never_scored)
    line = one_line_error(capsys, main(["--model", str(path), "--gpu", "h200", "--gpus", "4096", "--global-batch",
                                        "1048576", "--storage", str(tmp_path / "s.db"), "--no-progress"]))
    assert "more than the 5,000,000 one study plans" in line and "layouts" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"], "no study written"


def test_catalog_spaces_fit_the_bound(qwen36, stack):
    """The bound refuses hostile configs, not the catalog: the largest catalog space at MAX_GPUS fits."""
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload

    for model in (qwen36, load_model("qwen3-30b-a3b")):
        workload = Workload(global_batch=4096)
        shapes = list(space.parallel_shapes(model, space.MAX_GPUS, workload, stack, space.SpaceOptions()))
        options, size = space.bounded_options(shapes, model, space.MAX_GPUS, workload, stack, space.SpaceOptions())
        assert 0 < size <= space.MAX_SPACE_LAYOUTS and size == space.space_size(shapes, model, space.MAX_GPUS,
                                                                                workload, stack, options)


def test_divisors_take_the_square_root_not_the_number():
    start = time.monotonic()
    assert space.divisors(2 ** 40) == [2 ** k for k in range(41)]
    assert space.divisors(12) == [1, 2, 3, 4, 6, 12]
    # ~0.1 s by the square root (2**20 steps), hours by the number (2**40): a bound far from both
    assert time.monotonic() - start < 60


# ---------------------------------------------------------------- usage: one line, every subcommand listed

def test_component_test_help_needs_no_torch():
    code = ("import sys; sys.modules['torch'] = None\n"       # as if torch were not installed
            "from tuner.cli import main\nsys.exit(main(['component-test', '--help']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage: tune component-test adam" in done.stdout, done.stderr
    run = ("import sys; sys.modules['torch'] = None\n"
           "from tuner.cli import main\nsys.exit(main(['component-test', 'adam', '--device', 'cpu']))")
    done = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=120)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "needs the Python package 'torch'" in err[0], err


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    every = set(COMMANDS) - {"run"} | set(DELEGATED)
    assert every == set(SUBCOMMANDS + OWN_PARSER_SUBCOMMANDS)
    assert all(name in out for name in every)


@pytest.mark.parametrize("word, near", [("shwo", "show"), ("predcit", "predict"), ("exprot", "export"),
                                        ("check-convergance", "check-convergence"), ("qwen3-30b-a3b", None)])
def test_an_unknown_command_is_named(capsys, word, near):
    line = one_line_error(capsys, main([word, "--model", "x"]))
    assert f"unknown command '{word}'" in line and "required" not in line
    assert (f"(did you mean {near}?)" in line) if near else "did you mean" not in line


@pytest.mark.parametrize("argv", [
    [], ["--bogus"], ["--model"], ["show", "--bogus"], ["export", "--study", "x"], ["report"],
    ["predict", "--gpus"], ["models", "--bogus"], ["gpus", "--json", "x"], ["profile", "--quick=1"],
    ["trial", *TARGET], ["check-convergence"], ["check-convergence", "--candidate", "a"],
    ["component-test", "--ep", "0"], ["component-test", "adam", "--bogus"],
])
def test_usage_errors_are_one_line(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, main(argv))
    assert "--help" in line and "usage:" not in line
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- an output path that cannot be written

def test_a_bad_out_fails_before_any_scoring_naming_the_users_path(tmp_path, monkeypatch, capsys, no_scoring):
    """The main job's recipe folder is checked first (it used to fail after every trial had run), and the line names
    the user's path in words, not one of our temporary files or an errno."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    code = main([*TARGET, "--trials", "1", "--out", "afile/recipes", "--no-progress"])
    line = one_line_error(capsys, code)
    assert "cannot write 'afile/recipes'" in line and "Errno" not in line and ".tmp" not in line
    code = main([*TARGET, "--trials", "1", "--out", "afile", "--no-progress"])
    assert "cannot write 'afile': it exists and is not a folder" in one_line_error(capsys, code)


def test_unwritable_outputs_read_as_words():
    import errno

    from tuner.options import unwritable
    assert unwritable("imm", PermissionError(errno.EPERM, "Operation not permitted", "imm/.x.tmp")) == \
        "cannot write 'imm': it is not writable (read-only or immutable)"
    assert unwritable("out.yaml", OSError(errno.ENOSPC, "No space left")) == "cannot write 'out.yaml': it is on a full disk"
    assert "Errno" not in unwritable("o", OSError(errno.EIO, "Input/output error"))


def test_no_fit_names_the_partial_offload_the_search_steps_over(tmp_path, monkeypatch, capsys):
    """GPT-OSS-120B on 8 x H200: offload 1 overflows the host and 0.5 the GPUs, so no layout of a search kept to
    those fractions fits; the one line says which fraction between would, as a command that prices it, and that
    command does."""
    monkeypatch.chdir(tmp_path)
    code = main(["--model", "gpt-oss-120b", "--gpu", "h200", "--trials", "1", "--no-progress",
                 "--offload-fractions", "0,0.5,1"])
    line = one_line_error(capsys, code)
    assert "host memory" in line and "of the optimizer is predicted to fit" in line and "--offload-fractions" in line
    command = line.split("does not try (--offload-fractions): tune ", 1)[1].split()
    assert command[0] == "predict" and main([*command, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


def test_a_model_that_fits_only_at_a_partial_offload_is_searched_there(tmp_path, monkeypatch, capsys):
    """The default search widens its offload fractions where only a partial offload fits, says so, and a resumed
    study keeps the widened fractions (its recorded identity) with every trial it had."""
    monkeypatch.chdir(tmp_path)
    args = ["--model", "gpt-oss-120b", "--gpu", "h200", "--trials", "2", "--no-progress", "--top", "0", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "search space widened: no layout fits with optimizer offload 0, 0.5, 1, but 0.95" in out.err
    trials = json.loads(out.out)["trials"]
    offloads = [float(t["label"].split("| offload ")[1].split()[0]) for t in trials]
    assert len(offloads) == 2 and all(0.5 < f < 1 for f in offloads)
    assert main(args) == 0
    out = capsys.readouterr()
    assert "optimizer offload fractions 0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1, as study" in out.err
    assert len(json.loads(out.out)["trials"]) == 4


def test_offload_fractions_are_numbers_from_0_to_1():
    import argparse

    from tuner.options import offload_fractions
    assert offload_fractions("1,0.5,0,0.5") == (0.0, 0.5, 1.0)
    for bad in ("0,x", "1.5", "0,,1", "nan", "-0.1"):
        with pytest.raises(argparse.ArgumentTypeError):
            offload_fractions(bad)


def test_a_flag_is_never_an_abbreviation_of_another(capsys):
    """`--stack` is predict's flag; on the main command it is unknown, not a prefix of --stack-fix (whose choices the
    error would list), and `--trial 3` is not --trials."""
    line = one_line_error(capsys, main([*TARGET, "--stack", "megatron-runner"]))
    assert "unrecognized arguments: --stack megatron-runner" in line and "stack-fix" not in line
    assert "unrecognized arguments: --trial 3" in one_line_error(capsys, main([*TARGET, "--trial", "3"]))


def test_a_space_of_borderline_layouts_alone_is_widened_to_partial_offloads(tmp_path, monkeypatch, capsys):
    """Kimi-K2 on 64 x B200 had only borderline layouts at offload 0, 0.5, 1 (the best 59% likely to fit) while
    offload 0.6 fits plainly, 2.3x faster: a space with no plain fit is scored again with the partial fractions,
    and kept only where they add one."""
    from types import SimpleNamespace

    from tuner import study_commands as sc

    calls = []

    def scored(args, config, runner, space, *where):
        fractions = config.options.offload_fractions
        calls.append(fractions)
        partial = any(0 < f < 1 and f != 0.5 for f in fractions)
        return [("layout", SimpleNamespace(fits=partial and widen_fits))], None
    monkeypatch.setattr(sc, "_scored", scored)
    monkeypatch.setattr(sc, "runner_space", lambda config, runner: None)
    args = SimpleNamespace(offload_fractions=None)
    config = SimpleNamespace(options=SimpleNamespace(offload_fractions=(0.0, 0.5, 1.0)))
    monkeypatch.setattr(sc, "_with_fractions", lambda c, f: SimpleNamespace(
        options=SimpleNamespace(offload_fractions=tuple(sorted(set(f))))))
    for widen_fits in (True, False):
        calls.clear()
        out_config, _, candidates, _ = sc._scored_widened(args, config, None, None, ("u", None, "n"), None)
        assert len(calls) == 2 and set(sc.PARTIAL_OFFLOADS) <= set(calls[1])
        assert (out_config is not config) == widen_fits and candidates[0][1].fits == widen_fits
    assert ("only borderline layouts may fit" in capsys.readouterr().err)
    calls.clear()
    sc._scored_widened(SimpleNamespace(offload_fractions=(0.0, 0.5, 1.0)), config, None, None, ("u", None, "n"), None)
    assert len(calls) == 1   # fractions the user gave are searched as given


def test_models_shows_what_tune_reads_from_a_config_json(capsys):
    from pathlib import Path

    mixtral = str(Path(__file__).resolve().parents[1] / "benchmarks" / "models" / "mixtral-8x7b" / "config.json")
    assert main(["models", mixtral, "qwen3-30b-a3b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["mixtral-8x7b", "qwen3-30b-a3b"]
    assert rows[0]["experts"] == 8 and abs(rows[0]["total_params"] / 46.7e9 - 1) < 0.01   # Mixtral-8x7B: 46.7B
    assert "unknown model" in one_line_error(capsys, main(["models", "extra"]))


def test_a_batch_line_of_another_gpu_than_the_profiles_gets_an_error(tmp_path, capsys):
    """`predict --batch --profile B200.yaml` had priced an H100 line with the B200's rates, under the H100's name."""
    profile = tmp_path / "b200.yaml"
    assert main(["profile", "--derive", "b200", "--out", str(profile)]) == 0
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"model": "qwen3.6-35b-a3b", "gpu": g, "gpus": 8, "layout": {"ep": 8}}) + "\n"
                            for g in ("b200", "h100")))
    capsys.readouterr()
    assert main(["predict", "--batch", str(path), "--profile", str(profile)]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "error" not in out[0] and out[0]["gpu"] == "b200"
    assert "--profile is a profile of b200" in out[1]["error"] and "not of h100" in out[1]["error"]
