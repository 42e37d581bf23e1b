"""Many tuners on one study: each trial is created with its own layout and claims it atomically.

Optuna's enqueue_trial + ask hands a WAITING trial to whichever worker asks first, so with several
workers one could run another's layout under its own rationale. Here a proposal becomes a RUNNING
trial in one storage call, with its parameters, rationale and owner (`create_trial`). The layout is
then claimed by "lowest trial number wins" (`lost_to`): the storage numbers trials atomically, so of
two workers that proposed the same layout at once, exactly one sees no earlier live trial for it; the
other marks its trial PRUNED ("claimed by trial N") and proposes again. A claim is live while its trial
runs or once it completed, was pruned or failed for a reason that cannot change.

Dead workers: RDB storages are opened with Optuna's heartbeat (`HEARTBEAT_INTERVAL_S`, `GRACE_PERIOD_S`);
each running trial records one from its creation on (`create_trial`, `heartbeat`) and every worker fails
the stale ones of any host with `optuna.storages.fail_stale_trials` before it proposes, marking them
interrupted (`mark_stale`), so their layouts may be proposed again. A trial whose tuner died between its
creation and its first beat has no heartbeat record at all, which Optuna never calls stale: `fail_stale`
fails those too once they are older than twice the grace period. Lost claims are PRUNED, not FAIL: a
failed trial reads as a layout that went wrong, and counts_line/history_of leave lost claims out.
"""
from __future__ import annotations

import contextlib
import datetime
import threading
import time
import warnings

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from experiments.runner import PERMANENT_FAILURES
from tuner.interrupts import held
from tuner.optuna_adapter import (beating, discard_thread_session, new_running_trial, storage_of, stored_trial,
                                   study_id, trial_of, trial_id_of)

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 20          # a worker silent this long is dead; its running trial is failed by another
CLAIM_LOST = "claimed by trial"
STALE = "interrupted: its tuner stopped sending heartbeats (killed or lost)"


def create_trial(study: optuna.Study, params: dict, dists: dict[str, BaseDistribution],
                 attrs: dict) -> optuna.Trial:
    """A RUNNING trial with `params` and user `attrs`, made in one storage call (no WAITING queue), with
    its first heartbeat; a signal meanwhile ends it as interrupted (tuner.interrupts.held)."""
    template = optuna.trial.create_trial(state=TrialState.RUNNING, params=params,
                                         distributions={k: dists[k] for k in params}, user_attrs=attrs)
    trial_id = None
    try:
        with held():
            trial_id = new_running_trial(study, template)
            _beat(storage_of(study), trial_id)
        return trial_of(study, trial_id)
    except KeyboardInterrupt:
        if trial_id is not None:
            end_interrupted(storage_of(study), trial_id, "interrupted by the user")
        raise


def ask_trial(study: optuna.Study, dists: dict[str, BaseDistribution], attrs: dict) -> optuna.Trial:
    """A sampler's trial (Optuna's ask) with `attrs` and its first heartbeat, as create_trial does."""
    trial = None
    try:
        with held(), warnings.catch_warnings():  # the heartbeat is ours (`heartbeat`), not Study.optimize's
            warnings.simplefilter("ignore", UserWarning)
            trial = study.ask(dists)
            _beat(storage_of(study), trial_id_of(trial))
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
        return trial
    except KeyboardInterrupt:
        if trial is not None:
            end_interrupted(storage_of(study), trial_id_of(trial), "interrupted by the user")
        raise


def end_interrupted(storage, trial_id: int, reason: str) -> None:
    """Mark the trial failed with `reason`, unless it has already ended. A signal may have stopped a storage call of
    this thread halfway: its transaction is rolled back first (`discard_thread_session`), not committed with this."""
    discard_thread_session(storage)
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
        storage.set_trial_user_attr(trial_id, "fail_reason", reason)
        storage.set_trial_state_values(trial_id, state=TrialState.FAIL)


def _interval(storage) -> int | None:
    """The storage's heartbeat interval: RDB storages have one (Optuna's BaseHeartbeat, not exported), in-memory
    ones None."""
    return getattr(storage, "get_heartbeat_interval", lambda: None)()


def _beat(storage, trial_id: int) -> None:
    if _interval(storage) is not None:
        storage.record_heartbeat(trial_id)


def holds_claim(t: FrozenTrial) -> bool:
    """Whether `t` keeps its layout from other workers: running, done, or failed for good."""
    if t.state in (TrialState.RUNNING, TrialState.COMPLETE):
        return True
    if t.state == TrialState.PRUNED:
        return not str(t.user_attrs.get("prune_reason", "")).startswith(CLAIM_LOST)
    if t.state == TrialState.FAIL:
        return (t.user_attrs.get("result") or {}).get("failure_class") in PERMANENT_FAILURES
    return False


def lost_to(study: optuna.Study, trial: optuna.Trial, key: str, backend: str, settle_s: float = 0.0) -> int | None:
    """The number of an earlier trial holding layout `key` for `backend`, or None when `trial` has it.

    An earlier RUNNING trial without a key yet (a sampler's ask writes it just after) may be of the same layout:
    its tuner either writes the key, or ends the trial, or stops sending heartbeats and is failed as stale by
    `fail_stale` here (a paused tuner stops its heartbeat thread too). So with heartbeats (RDB storages) this
    waits for one of those three, however long the other tuner is paused: the storage decides, not a timer.
    A tuner paused past the grace period finds its trial failed when it wakes, and can no longer complete it.
    Without heartbeats, `settle_s` bounds the wait (one process per study there)."""
    storage = storage_of(study)
    beats = _interval(storage) is not None
    deadline = time.monotonic() + settle_s
    next_sweep = time.monotonic() + 1.0
    while True:
        earlier = [t for t in storage.get_all_trials(study_id(study), deepcopy=False) if t.number < trial.number]
        unkeyed = [t for t in earlier if t.state == TrialState.RUNNING and "layout_key" not in t.user_attrs]
        if not unkeyed or not settle_s or (not beats and time.monotonic() > deadline):
            break
        if beats and time.monotonic() > next_sweep:
            fail_stale(study)
            next_sweep = time.monotonic() + 1.0
        time.sleep(0.05)
    for t in earlier:
        if t.user_attrs.get("layout_key") != key:
            continue
        if t.user_attrs.get("backend", "predict") == backend and holds_claim(t):
            return t.number
    return None


def still_running(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether the storage still has `trial` running (another tuner fails it when its heartbeat stopped)."""
    return stored_trial(study, trial).state == TrialState.RUNNING


def is_lost_claim(t: FrozenTrial) -> bool:
    return t.state == TrialState.PRUNED and str(t.user_attrs.get("prune_reason", "")).startswith(CLAIM_LOST)


def mark_stale(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's heartbeat callback: say why the trial failed (its layout may be proposed again). The
    trial has ended, so its own attributes are frozen: the reason goes on the study, one key per trial."""
    with contextlib.suppress(Exception):
        storage_of(study).set_study_user_attr(study_id(study), stale_key(trial.number), STALE)


def stale_key(number: int) -> str:
    return f"stale_trial_{number}"


def fail_reason(study_attrs: dict, t: FrozenTrial) -> str | None:
    """Why a failed trial failed: its own record, or the heartbeat's note on the study."""
    return t.user_attrs.get("fail_reason") or study_attrs.get(stale_key(t.number))


def fail_stale(study: optuna.Study) -> None:
    """Fail the running trials whose tuner stopped sending heartbeats, on any host; and those that never
    sent one although their tuner records one at once (it died within that moment: kill -9)."""
    with warnings.catch_warnings():  # experimental in Optuna since 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    storage = storage_of(study)
    if _interval(storage) is None:
        return
    # an older tune, which sent none, wrote its owner at once: a trial without owner nor beat is dead too
    since = datetime.datetime.now() - datetime.timedelta(seconds=2 * GRACE_PERIOD_S)
    quiet = {trial_id_of(t): t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
             if t.datetime_start is not None and t.datetime_start < since
             and (t.user_attrs.get("owner") or {}).get("heartbeat", "owner" not in t.user_attrs)}
    for trial_id in set(quiet) - beating(storage, list(quiet)):
        end_interrupted(storage, trial_id, STALE)


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial):
    """Record the trial's heartbeat every HEARTBEAT_INTERVAL_S while the block runs. Its first beat came with the
    trial (`create_trial`, `ask_trial`), so a trial that ends within the interval (a predicted one) writes no
    other: one SQLite commit less per trial."""
    storage = storage_of(study)
    interval = _interval(storage)
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat():
        while not stop.wait(interval):
            with contextlib.suppress(Exception):  # a missed beat is not fatal; many are (grace period)
                storage.record_heartbeat(trial_id_of(trial))

    thread = threading.Thread(target=beat, name=f"heartbeat-trial-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        # bounded: a beat stuck in the storage (a lock an interrupted main thread left) must not hold up the
        # interrupt; the thread is a daemon
        thread.join(timeout=interval + 10)
