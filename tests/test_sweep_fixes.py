"""Sweep F's fixes: a reader that leaves (`tune ... | head`) ends a run as a signal does; a flat loss curve's
correlation is not checked; the slime backend refuses a Ray address its Jobs API client cannot take, before
connecting; `tune show --format csv` prints whole layout fields as integers."""
from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from experiments.checks.convergence import Curve, check
from experiments.checks.convergence import main as convergence_main
from tuner import interrupts
from blocking_tuner import blocking_tuner
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- 1. a broken pipe
class _Closed:
    """A stream whose reader left; no fileno, so nothing of the test's own is pointed at /dev/null."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_broken_pipe_raises_reader_left_a_keyboard_interrupt():
    guard = interrupts._PipeGuard(_Closed())
    with pytest.raises(interrupts.ReaderLeft) as caught:
        print("a line", file=guard)
    assert isinstance(caught.value, KeyboardInterrupt)


def test_a_broken_pipe_inside_held_waits_for_the_block_to_end():
    guard = interrupts._PipeGuard(_Closed())
    done = []
    with pytest.raises(interrupts.ReaderLeft):
        with interrupts.held():
            guard.write("a line\n")   # noted, not raised: a trial being created is never stopped halfway
            done.append("after the write")
    assert done == ["after the write"] and interrupts._state["pending"] is None


def test_as_interrupt_guards_the_streams_and_gives_them_back():
    out, err = sys.stdout, sys.stderr
    with interrupts.as_interrupt():
        assert isinstance(sys.stdout, interrupts._PipeGuard) and isinstance(sys.stderr, interrupts._PipeGuard)
    assert sys.stdout is out and sys.stderr is err


# A tuner whose runner, on its second trial, waits until the test has closed stderr's pipe, then writes to it (as a
# runner that logs does): the reader left while the trial ran.
WRITING_TUNER = blocking_tuner(2, ['while not os.path.exists("closed"):', '    time.sleep(0.02)',
                                   'print("the runner\'s progress line", file=sys.stderr, flush=True)'])


def test_a_reader_that_leaves_ends_the_run_quietly_with_the_trial_interrupted(tmp_path):
    storage = tmp_path / "s.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITING_TUNER, "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "4",
         "--storage", str(storage), "--study", "s", "--trials", "5", "--top", "0", "--no-progress"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    for line in proc.stdout:
        if "BLOCKING" in line:
            break
    proc.stderr.close()                       # the reader leaves while trial 1 runs
    (tmp_path / "closed").touch()
    rest = proc.stdout.read()
    assert proc.wait(timeout=60) == 141       # as a tool SIGPIPE ended, and as `tune show | head` does
    assert "Traceback" not in rest and "error" not in rest, rest
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.trials[1].user_attrs["fail_reason"].startswith("interrupted")


# ---------------------------------------------------------------------- 2. a flat loss curve
def _curve(losses, source=""):
    return Curve.from_values(losses, None, source=source)


def falling(n=20):
    return [3.0 * math.exp(-i / 10) + 1.0 for i in range(n)]


def test_identical_flat_curves_pass_with_the_correlation_not_checked():
    v = check(_curve([3.0] * 20), _curve([3.0] * 20))
    assert v.passed and v.correlation is None and v.failed_rules == []
    rule = v.rule("correlation")
    assert rule.passed and not rule.checked
    assert "undefined (a flat curve): not checked" in v.format()
    assert v.to_dict()["rules"][1]["checked"] is False


def test_a_flat_candidate_against_a_falling_reference_fails_by_the_other_rules():
    v = check(_curve([3.0] * 20), _curve(falling()))
    assert not v.passed and v.correlation is None
    assert set(v.failed_rules) >= {"pointwise", "final_loss"} and "correlation" not in v.failed_rules


def test_a_falling_candidate_against_a_flat_reference_fails_too():
    v = check(_curve(falling()), _curve([1.5] * 20))
    assert not v.passed and "pointwise" in v.failed_rules and v.rule("correlation").checked is False


def test_a_correlation_undefined_by_a_nan_still_fails():
    losses = falling()
    losses[10] = float("nan")
    v = check(_curve(losses), _curve(falling()))
    assert not v.passed and {"finite", "correlation"} <= set(v.failed_rules)
    assert v.rule("correlation").checked


def test_check_convergence_command_on_flat_curves(tmp_path, capsys):
    flat = tmp_path / "flat.csv"
    flat.write_text("step,loss\n" + "".join(f"{i},3.0\n" for i in range(1, 21)))
    ref = tmp_path / "ref.csv"
    ref.write_text("step,loss\n" + "".join(f"{i},{x!r}\n" for i, x in enumerate(falling(), start=1)))
    assert convergence_main(["--candidate", str(flat), "--reference", str(flat)]) == 0
    out = capsys.readouterr().out
    assert "undefined (a flat curve): not checked" in out and "result: PASS" in out
    assert convergence_main(["--candidate", str(flat), "--reference", str(ref)]) == 1
    out = capsys.readouterr().out
    assert "result: FAIL (pointwise, final_loss)" in out


# ---------------------------------------------------------------------- 3. the slime backend's --ray-address
@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("ray_address: http://127.0.0.1:8265\nslime_dir: /root/slime\nhf_checkpoint: /data/hf\n"
                    "torch_dist: /data/td\nsft_data: /data/rows.jsonl\nprofile_dir: /data/profiles\n")
    return path


def _slime_trial(cluster_file, address, *extra):
    return main(["trial", "--backend", "slime", "--cluster", str(cluster_file), "--model", "qwen3-30b-a3b",
                 "--gpu", "h200", "--layout", "ep=8", "--ray-address", address, *extra])


@pytest.mark.parametrize("address, says", [
    ("ray://1.2.3.4:10001", "not Ray's client address ray://HEAD:10001 (--backend predict's); "
                            "give http://1.2.3.4:8265"),
    ("http://", "names no host"),
    ("local", "for a Ray head on this machine give http://127.0.0.1:8265"),
    ("ftp://head:8265", "expected http://HEAD:8265 or https://HEAD:PORT"),
    ("http://head:99999", "the port must be a number"),
])
def test_slime_refuses_an_address_its_jobs_api_cannot_take_before_connecting(cluster_file, capsys, monkeypatch,
                                                                             address, says):
    import experiments.slime.runner as runner

    monkeypatch.setattr(runner.SlimeRunner, "_connect", lambda self: pytest.fail("connected"))
    assert _slime_trial(cluster_file, address) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tune: error: --ray-address {address}: ") and says in err, err


def test_a_bad_ray_address_in_the_cluster_file_names_the_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("ray_address: ray://head:10001\nslime_dir: /root/slime\n")
    assert main(["trial", "--backend", "slime", "--cluster", str(path), "--model", "qwen3-30b-a3b", "--gpu", "h200",
                 "--layout", "ep=8", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"--cluster {path}: ray_address ray://head:10001: " in err and "give http://head:8265" in err


def test_a_ray_address_password_is_never_shown(cluster_file, capsys):
    from experiments.slime.cluster import ClusterConfig
    from experiments.slime.runner import SlimeRunner

    assert _slime_trial(cluster_file, "https://ann:s3cret@head:99999") == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "ann:***@head" in err
    assert _slime_trial(cluster_file, "https://ann:s3cret@head:8265", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and "https://ann:***@head:8265" in out
    runner = SlimeRunner(ClusterConfig(ray_address="https://ann:s3cret@head:8265", slime_dir="/root/slime"),
                         connect=False)
    assert runner.ray_address == "https://ann:s3cret@head:8265"   # what the client connects to
    line = runner._unreachable(ConnectionError("Failed to connect to Ray at address: https://ann:s3cret@head:8265."))
    assert "s3cret" not in line and line.startswith("cannot reach the Ray cluster at https://ann:***@head:8265: ")


def test_a_bare_host_and_port_still_gets_http():
    from experiments.slime.cluster import jobs_api_address

    assert jobs_api_address("head:8265") == "http://head:8265"
    assert jobs_api_address("https://head") == "https://head"
    assert jobs_api_address("HTTP://head:8265") == "http://head:8265"   # Ray's Jobs client knows http only


def test_an_unclosed_ipv6_ray_address_is_one_line_not_a_traceback():
    from experiments.slime.cluster import ClusterError, jobs_api_address

    with pytest.raises(ClusterError, match=r"--ray-address http://\[::1: not a URL"):
        jobs_api_address("http://[::1")


# ---------------------------------------------------------------------- 4. `tune show --format csv`
def test_show_csv_prints_whole_layout_fields_as_integers(tmp_path, capsys):
    from tests.test_tune_cli import handmade_study
    from tuner.report import LAYOUT_COLUMNS

    storage = tmp_path / "s.db"
    name = handmade_study(storage)    # its failed trial has no layout: a column with a gap
    assert main(["show", "--study", name, "--storage", str(storage), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["tp"] == "1" and rows[1]["ep"] == "4" and rows[0]["max_tokens_per_gpu"].isdigit()
    for row in rows[:3]:
        assert all("." not in row[c] for c in LAYOUT_COLUMNS), row
    assert all(rows[3][c] == "" for c in LAYOUT_COLUMNS)
    assert main(["show", "--study", name, "--storage", str(storage), "--format", "json"]) == 0
    assert '"tp": 1,' in capsys.readouterr().out
    assert os.path.exists(storage)
