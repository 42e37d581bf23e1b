"""A resumed study reads its scored space back instead of scoring it again, and gets what scoring gives."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.space_cache import CACHE_DIR, SpaceCache

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "2", "--seq-len", "4096", "--global-batch", "16",
        "--no-progress", "--top", "0"]


def run(capsys, storage: Path, trials: int) -> tuple[str, str]:
    assert main([*ARGS, "--storage", str(storage), "--trials", str(trials)]) == 0
    out, err = capsys.readouterr()
    return out, err


def table(out: str) -> list[str]:
    return [line for line in out.splitlines() if "|" in line]


@pytest.mark.slow
def test_a_resume_reads_the_scored_space_and_proposes_as_a_fresh_scoring_does(tmp_path, capsys):
    cached, fresh = tmp_path / "a" / "s.db", tmp_path / "b" / "s.db"
    cached.parent.mkdir()
    fresh.parent.mkdir()
    run(capsys, cached, 2)
    files = list((cached.parent / CACHE_DIR).glob("*.pkl"))
    assert len(files) == 1 and (files[0].stat().st_mode & 0o777) == 0o600
    out, err = run(capsys, cached, 2)
    assert "read from the study's cache" in err
    # the same study resumed without its cache: scored again, the same trials and figures
    run(capsys, fresh, 2)
    for f in (fresh.parent / CACHE_DIR).glob("*.pkl"):
        f.unlink()
    out2, err2 = run(capsys, fresh, 2)
    assert "read from the study's cache" not in err2
    assert table(out) == table(out2) and len(table(out)) >= 4


def test_a_cache_file_someone_else_could_have_written_is_not_read(tmp_path, capsys):
    storage = tmp_path / "s.db"
    run(capsys, storage, 1)
    (f,) = (storage.parent / CACHE_DIR).glob("*.pkl")
    os.chmod(f, 0o666)
    _, err = run(capsys, storage, 1)
    assert "read from the study's cache" not in err     # scored again, and the file written anew
    assert (f.stat().st_mode & 0o777) == 0o600
    f.write_bytes(b"not a pickle")
    _, err = run(capsys, storage, 1)
    assert "read from the study's cache" not in err


def test_the_key_does_not_depend_on_the_interpreters_hash_seed():
    code = ("from tuner.space_cache import space_key; from tuner.study_commands import *; "
            "import tuner.study_commands as sc; from tuner.options import run_parser; "
            "a = run_parser().parse_args(['--model', 'qwen3.6-35b-a3b', '--gpu', 'h200']); "
            "from tuner.study import StudyConfig; from cost_model.nouns.stack import Stack; "
            "from search_space.enumerate import SpaceOptions; from tuner.backends import make_runner, measured_window; "
            "m, g, n = sc.target(a); w = sc.workload(a); "
            "c = StudyConfig(m, g, n, w, Stack(), sc.workload_options(SpaceOptions(), w), sc.profile(a)); "
            "r = make_runner(a, c.profile); print(space_key(c, r, sc.runner_space(c, r)))")
    keys = {subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(keys) == 1 and len(keys.pop().strip()) == 32


def test_no_cache_for_a_server_or_memory_storage():
    assert SpaceCache.for_study("postgresql://u@h/db", None, None, None) is None
    assert SpaceCache.for_study("sqlite:///:memory:", None, None, None) is None


def test_a_cache_file_builds_only_our_classes(tmp_path):
    """A cache file of ours that names anything but a class of our packages (a function, a module's attribute by a
    dotted name) or a plain container is refused before anything of it runs: it reads as no cache."""
    import io
    import pickle

    from cost_model.nouns.layout import Layout
    from tuner.space_cache import OurClassesOnly

    ours = {"format": 1, "candidates": [Layout(2)], "hypothesis_values": {"a": {1, 2}}}
    assert OurClassesOnly(io.BytesIO(pickle.dumps(ours))).load() == ours
    calls_system = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."
    dotted = b"\x80\x04\x8c\x11tuner.space_cache\x8c\x09os.system\x93."
    function = pickle.dumps(test_a_cache_file_builds_only_our_classes)
    for blob in (calls_system, dotted, function):
        with pytest.raises(pickle.UnpicklingError, match="not a class of ours"):
            OurClassesOnly(io.BytesIO(blob)).load()
    path = tmp_path / "x.pkl"
    path.write_bytes(calls_system)
    path.chmod(0o600)
    assert SpaceCache(path).load() is None
