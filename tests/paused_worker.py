"""A `tune` worker that stops itself (SIGSTOP) once, at one step of claiming its first trial, until the test
sends SIGCONT: `ATTUNE_TEST_PAUSE_AT` = created (the trial made: for a sampler's ask, before its layout key is
written), keyed (before the claim is checked), claimed (the claim won, before the trial runs) or measured (the
result in hand, before it is recorded). With `ATTUNE_TEST_ASK_PARAMS` (JSON), Optuna's TPE sampler proposes
those parameters, so two workers' asks race for one layout. A stopped process stops its heartbeat thread too, as a loaded or
suspended machine does. Run as `python tests/paused_worker.py TUNE-ARGS...`."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

import tuner.study as study  # noqa: E402
import tuner.study_commands as study_commands  # noqa: E402
from experiments.predicted_runner import PredictedRunner  # noqa: E402
from tuner.cli import main  # noqa: E402

STEP = os.environ.get("ATTUNE_TEST_PAUSE_AT", "")
_paused = []
# The stop lands between the heartbeat thread's writes, never inside one: a process stopped inside an SQLite write
# transaction holds the file's lock, and every other worker then waits for it (at most its 120 s busy timeout, then
# "database is locked"). That is SQLite's own limit, not the claim protocol under test.
_beat_lock = threading.Lock()
_record_heartbeat = optuna.storages.RDBStorage.record_heartbeat


def _record_heartbeat_whole(self, trial_id):
    with _beat_lock:
        return _record_heartbeat(self, trial_id)


optuna.storages.RDBStorage.record_heartbeat = _record_heartbeat_whole


def pause(step: str) -> None:
    if step == STEP and not _paused:
        _paused.append(step)
        print(f"pausing at {step}", file=sys.stderr, flush=True)
        with _beat_lock:
            os.kill(os.getpid(), signal.SIGSTOP)


def after(step: str, fn):
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        pause(step)
        return out
    return wrapped


def before(step: str, fn):
    def wrapped(*args, **kwargs):
        pause(step)
        return fn(*args, **kwargs)
    return wrapped


class PausingRunner(PredictedRunner):
    def run(self, spec):
        return after("measured", super().run)(spec)


study.create_trial = after("created", study.create_trial)
study.ask_trial = after("created", study.ask_trial)
study.lost_to = before("keyed", study.lost_to)
study._evaluate = before("claimed", study._evaluate)
study_commands.make_runner = lambda args, profile=None: PausingRunner(profile=profile)
if os.environ.get("ATTUNE_TEST_GRACE_S"):   # the tests that wait for a trial to go stale wait less
    import tuner.trial_claims as trial_claims

    trial_claims.GRACE_PERIOD_S = float(os.environ["ATTUNE_TEST_GRACE_S"])
    trial_claims.HEARTBEAT_INTERVAL_S = trial_claims.GRACE_PERIOD_S / 4   # the shipped ratio (5 s of 20 s)
if os.environ.get("ATTUNE_TEST_ASK_PARAMS"):
    import optuna

    _params = json.loads(os.environ["ATTUNE_TEST_ASK_PARAMS"])
    optuna.samplers.TPESampler.sample_relative = lambda self, s, t, space: {}
    optuna.samplers.TPESampler.sample_independent = lambda self, s, t, name, dist: _params.get(
        name, "none" if "none" in getattr(dist, "choices", ()) else dist.choices[0])

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
