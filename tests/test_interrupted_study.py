"""A tuner killed in the middle of a trial: the study resumes, the trial is marked failed with its reason."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from blocking_tuner import blocking_tuner
from tuner.cli import main
from tuner.trial_claims import fail_reason

pytestmark = pytest.mark.slow  # each test runs a tuner process and two studies

ROOT = Path(__file__).resolve().parents[1]
TARGET = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--gpus", "4"]   # a space scored in about 2 s (8 GPUs: 12 s)

# A tuner whose runner blocks forever on the third trial, started as its own process so it can be killed.
SLOW_TUNER = blocking_tuner(3, ["time.sleep(600)"])


def start_and_kill(tmp_path: Path, storage: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_TUNER, *TARGET, "--storage", str(storage),
         "--study", "s", "--trials", "5", "--top", "0", "--no-progress"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    for line in proc.stdout:  # blocks until the third trial starts, however slow the machine (or EOF)
        if "BLOCKING" in line:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_killed_tuner_resumes_with_the_interrupted_trial_failed(tmp_path, capsys):
    storage = tmp_path / "s.db"
    start_and_kill(tmp_path, storage)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}")
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]
    interrupted_key = study.trials[2].user_attrs["layout_key"]

    assert main([*TARGET, "--storage", str(storage), "--study", "s",
                 "--trials", "2", "--top", "0", "--no-progress", "--on-interrupted", "retry"]) == 0
    assert "trials 2 were interrupted" in capsys.readouterr().err
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}")
    third = study.trials[2]
    # marked by the host/pid check, or by the heartbeat's grace period when the scoring took longer
    assert third.state == TrialState.FAIL and fail_reason(study.user_attrs, third).startswith("interrupted")
    # retry: the agent proposes the interrupted layout again (it was its best untried choice)
    assert study.trials[3].user_attrs["layout_key"] == interrupted_key
    assert study.trials[3].state == TrialState.COMPLETE
    assert [t.state for t in study.trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]


def test_skip_keeps_the_interrupted_layout_out(tmp_path, capsys):
    storage = tmp_path / "s.db"
    start_and_kill(tmp_path, storage)
    interrupted_key = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}").trials[2].user_attrs[
        "layout_key"]
    assert main([*TARGET, "--storage", str(storage), "--study", "s",
                 "--trials", "3", "--top", "0", "--no-progress", "--on-interrupted", "skip"]) == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{storage}")
    assert study.trials[2].state == TrialState.FAIL
    assert interrupted_key not in [t.user_attrs.get("layout_key") for t in study.trials[3:]]


def test_a_storage_call_a_signal_stopped_halfway_is_rolled_back_not_committed_with_the_failure(tmp_path):
    """Optuna rolls a storage call back on an Exception, not on the KeyboardInterrupt a signal raises: the thread's
    session can be left mid-transaction. end_interrupted rolls it back before it writes the failure, so the half-made
    write is not committed with it and its locks are gone."""
    import sqlalchemy

    from tuner.optuna_adapter import storage_of, trial_id_of
    from tuner.trial_claims import end_interrupted

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    tid = trial_id_of(trial)
    session = storage.scoped_session()   # the thread's session, as an interrupted storage call leaves it
    session.execute(sqlalchemy.text("UPDATE trials SET number = 99 WHERE trial_id = :t"), {"t": tid})
    end_interrupted(storage_of(study), tid, "interrupted by the user")
    done = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials[0]
    assert done.state == TrialState.FAIL and done.user_attrs["fail_reason"] == "interrupted by the user"
    assert done.number == 0   # the half-made write was rolled back, not committed with the failure
    other = sqlalchemy.create_engine(f"sqlite:///{tmp_path}/s.db", connect_args={"timeout": 0.1})
    with other.begin() as conn:   # no lock left behind: another connection writes at once
        conn.execute(sqlalchemy.text("UPDATE trials SET number = number WHERE trial_id = :t"), {"t": tid})


def test_a_signal_during_a_storage_call_is_raised_once_the_call_has_returned(tmp_path):
    """While a run is on, a storage call is never stopped halfway: the signal waits for it, then ends the run."""
    from tuner.interrupts import as_interrupt, storage_calls_held

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    tid = study.ask()._trial_id
    real = type(storage).set_trial_user_attr
    finished = []

    def slow_write(self, trial_id, key, value):
        os.kill(os.getpid(), signal.SIGTERM)   # arrives while the call is in flight
        real(self, trial_id, key, value)
        finished.append(key)

    type(storage).set_trial_user_attr, restore = slow_write, real
    try:
        with pytest.raises(KeyboardInterrupt):
            with as_interrupt(), storage_calls_held(storage):
                storage.set_trial_user_attr(tid, "k", 1)
                pytest.fail("the signal was not raised after the call")
    finally:
        type(storage).set_trial_user_attr = restore
    assert finished == ["k"] and storage.get_trial(tid).user_attrs["k"] == 1
    assert "set_trial_user_attr" not in vars(storage)   # the storage is itself again after the block
