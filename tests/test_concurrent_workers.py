"""Many tuners on one study (issue 15): workers on one SQLite file and on a real PostgreSQL server never
run a layout twice, never crash on each other, keep every rationale on its own trial; a worker killed
with -9 is recovered by another (heartbeat, any host); SIGTERM at any moment leaves no RUNNING trial."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from benchmarks.concurrent_workers import judge, run_workers
import postgres_server
from tuner.cli import main
from tuner import trial_claims
from tuner.trial_claims import GRACE_PERIOD_S, STALE, fail_reason

ROOT = Path(__file__).resolve().parents[1]
SLOW = [sys.executable, str(ROOT / "tests" / "slow_worker.py")]
# Trials per worker: the four contend for claims from the first trial on; the full 4 x 200 scenario (Qwen3.6-35B-A3B
# on 8 x H200) is `python benchmarks/concurrent_workers.py` (about 13 minutes per storage on 2 cores).
TRIALS = 10
SMALL = ("--gpus", "4")   # 5,639 layouts that may fit, scored in about 2 s (8 GPUs: 35,133)
# Qwen3-30B-A3B on 2 x H200: a space scored in under a second (on 8 GPUs each run took about 8 s)
ARGS = ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2", "--study", "conc", "--no-progress", "--top", "0"]
# The tests that wait for a trial to go stale run their workers (tests/slow_worker.py, tests/paused_worker.py) and
# their in-process tune with this heartbeat grace period (the shipped one is GRACE_PERIOD_S, 20 s; the heartbeat
# interval keeps its ratio to it): what goes stale and who fails it are the same, only the wait is shorter.
TEST_GRACE_S = 6.0


@pytest.fixture
def short_grace(monkeypatch) -> dict:
    """The in-process tune with TEST_GRACE_S; the environment that gives the worker scripts the same."""
    monkeypatch.setattr(trial_claims, "GRACE_PERIOD_S", TEST_GRACE_S)
    monkeypatch.setattr(trial_claims, "HEARTBEAT_INTERVAL_S", TEST_GRACE_S / 4)
    return {"ATTUNE_TEST_GRACE_S": str(TEST_GRACE_S)}


def load(url: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="conc", storage=url)


def assert_clean(figures: dict, expected: int) -> None:
    assert figures["crashed_workers"] == [], figures.get("crash_lines")
    assert figures["duplicates"] == 0 and figures["complete"] == figures["distinct"] == expected, figures
    assert figures["misattributed_rationales"] == [] and figures["running_left"] == 0, figures


@pytest.mark.slow
def test_four_workers_on_one_sqlite_file(tmp_path):
    """4 x TRIALS agent trials at once on one file (full size: benchmarks/concurrent_workers.py)."""
    url = f"sqlite:///{tmp_path}/study.db"
    runs = run_workers(url, 4, TRIALS, tmp_path, model="qwen3.6-35b-a3b", extra=SMALL)
    assert_clean(judge(url, runs), 4 * TRIALS)


@pytest.fixture(scope="module")
def postgres():
    reason = postgres_server.why_not()
    if reason:
        pytest.skip(reason)
    server = postgres_server.Server()
    yield server.start()
    server.stop()


@pytest.mark.slow
def test_four_workers_on_postgresql(postgres, tmp_path):
    """4 x TRIALS agent trials at once on one server (full size: benchmarks/concurrent_workers.py)."""
    runs = run_workers(postgres, 4, TRIALS, tmp_path, model="qwen3.6-35b-a3b", extra=SMALL)
    assert_clean(judge(postgres, runs), 4 * TRIALS)


def _wait_for(proc, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"worker ended before '{text}'")
    raise AssertionError(f"no '{text}' within {timeout} s")


@pytest.mark.slow
def test_a_worker_killed_on_another_host_is_recovered_by_the_next(tmp_path, short_grace):
    url = f"sqlite:///{tmp_path}/study.db"
    env = {**os.environ, "ATTUNE_TEST_TRIAL_S": "300", "ATTUNE_TEST_HOST": "another-host", **short_grace}
    victim = subprocess.Popen(SLOW + ARGS + ["--trials", "5", "--storage", url], env=env, cwd=tmp_path,
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    _wait_for(victim, "running ")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    running = [t for t in load(url).trials if t.state == TrialState.RUNNING]
    assert len(running) == 1 and running[0].user_attrs["owner"]["host"] == "another-host"
    time.sleep(TEST_GRACE_S + 2)   # its heartbeat goes stale; the host/pid check cannot see another host
    assert main(ARGS + ["--trials", "2", "--storage", url]) == 0
    study = load(url)
    t = study.trials[running[0].number]
    assert t.state == TrialState.FAIL and fail_reason(study.user_attrs, t) == STALE
    assert not [t for t in load(url).trials if t.state == TrialState.RUNNING]


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0, 2.5, "trial"])
def test_sigterm_at_any_moment_leaves_no_running_trial(tmp_path, delay):
    url = f"sqlite:///{tmp_path}/study.db"
    env = {**os.environ, "ATTUNE_TEST_TRIAL_S": "300", "PYTHONFAULTHANDLER": "1"}
    p = subprocess.Popen(SLOW + ARGS + ["--trials", "3", "--storage", url], env=env, cwd=tmp_path,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    if delay == "trial":
        _wait_for(p, "running ")
    else:
        time.sleep(delay)
    p.send_signal(signal.SIGTERM)
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)     # faulthandler prints where every thread was
        pytest.fail("still running 60 s after SIGTERM:\n" + p.communicate()[1][-8000:])
    if not Path(f"{tmp_path}/study.db").exists():
        return   # stopped before the storage was made: nothing to leave behind
    # the next run (a quick predicted one) finds nothing RUNNING afterwards
    assert main(ARGS + ["--trials", "1", "--storage", url]) == 0
    assert not [t for t in load(url).trials if t.state == TrialState.RUNNING]


def test_a_read_only_sqlite_file_is_one_line(tmp_path, capsys, monkeypatch):
    url = str(tmp_path / "ro.db")
    assert main(ARGS + ["--trials", "1", "--storage", url]) == 0
    before = Path(url).read_bytes()
    os.chmod(url, 0o444)
    capsys.readouterr()
    if os.access(url, os.W_OK):   # root: a 0444 file stays writable; what tune sees of it is what is tested
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == url and m & os.W_OK else real(p, m))
    assert main(ARGS + ["--trials", "1", "--storage", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "read-only" in err[0]
    assert Path(url).read_bytes() == before


def test_show_and_export_never_create_a_storage(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["show", "--study", "x", "--storage", "typo.db"],
                 ["export", "--study", "x", "--storage", "typo.db", "--out", "o"]):
        assert main(argv) == 2
        assert "no such file" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_price_is_part_of_the_study(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    assert main(ARGS + ["--trials", "1", "--storage", url]) == 0
    before = Path(url).read_bytes()
    assert main(ARGS + ["--trials", "1", "--storage", url, "--usd-per-gpu-hour", "9.5"]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "9.5 asked" in err   # the refusal names the setting that differs
    assert Path(url).read_bytes() == before


# -- the claim and the heartbeat, in one process (fast)

def _study(tmp_path) -> optuna.Study:
    from tuner.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="c", storage=open_storage(f"sqlite:///{tmp_path}/c.db"),
                               direction="maximize")


def _trial(study, key: str, **attrs) -> optuna.Trial:
    from tuner.trial_claims import create_trial

    dist = optuna.distributions.CategoricalDistribution(["a", "b"])
    return create_trial(study, {"x": "a"}, {"x": dist}, {"layout_key": key, "backend": "predict", **attrs})


def test_the_lowest_trial_number_holds_a_layout(tmp_path):
    from tuner.trial_claims import holds_claim, lost_to

    study = _study(tmp_path)
    first, second, other = _trial(study, "k"), _trial(study, "k"), _trial(study, "j")
    assert lost_to(study, first, "k", "predict") is None
    assert lost_to(study, second, "k", "predict") == first.number
    assert lost_to(study, other, "j", "predict") is None
    # an interrupted holder releases the layout: the next proposal of it may run
    study.tell(first, state=TrialState.FAIL)
    assert not holds_claim(study.trials[first.number])
    assert lost_to(study, second, "k", "predict") is None


def test_a_lost_claim_is_not_a_trial_of_the_history(tmp_path):
    from tuner.study import history_of
    from tuner.trial_claims import CLAIM_LOST

    study = _study(tmp_path)
    holder, loser = _trial(study, "k"), _trial(study, "k")
    loser.set_user_attr("prune_reason", f"{CLAIM_LOST} {holder.number}")
    study.tell(loser, state=TrialState.PRUNED)
    study.tell(holder, state=TrialState.FAIL)   # interrupted: its layout may be proposed again
    assert "k" not in history_of(study).tried


def test_a_trial_created_with_its_first_heartbeat(tmp_path):
    from tuner.optuna_adapter import beating

    study = _study(tmp_path)
    t = _trial(study, "k")
    assert beating(study._storage, [t._trial_id]) == {t._trial_id}


def test_a_trial_whose_tuner_died_before_its_first_beat_is_failed_on_any_host(tmp_path):
    import datetime

    from tuner.trial_claims import fail_stale

    study = _study(tmp_path)
    dist = optuna.distributions.CategoricalDistribution(["a", "b"])
    old = datetime.datetime.now() - datetime.timedelta(seconds=3 * GRACE_PERIOD_S)

    def running(owner):   # made as a killed tuner leaves it: RUNNING, no heartbeat
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params={"x": "a"}, distributions={"x": dist},
                                             user_attrs={"owner": owner} if owner else {})
        template.datetime_start = old
        return study._storage.create_new_trial(study._study_id, template_trial=template)

    ours = running({"host": "elsewhere", "pid": 1, "heartbeat": True})
    ownerless = running(None)
    older_tune = running({"host": "elsewhere", "pid": 1})   # may still run: an older tune sends no heartbeat
    fresh = _trial(study, "k")
    fail_stale(study)
    states = {tid: study._storage.get_trial(tid).state for tid in (ours, ownerless, older_tune, fresh._trial_id)}
    assert states == {ours: TrialState.FAIL, ownerless: TrialState.FAIL, older_tune: TrialState.RUNNING,
                      fresh._trial_id: TrialState.RUNNING}
    assert study._storage.get_trial(ours).user_attrs["fail_reason"] == STALE


def test_a_signal_while_a_trial_is_made_ends_it_as_interrupted(tmp_path, monkeypatch):
    from tuner import interrupts, trial_claims

    study = _study(tmp_path)
    real = trial_claims._beat

    def beat_then_signal(storage, trial_id):   # SIGTERM lands between the trial's creation and its return
        real(storage, trial_id)
        interrupts._handler(signal.SIGTERM, None)

    monkeypatch.setattr(trial_claims, "_beat", beat_then_signal)
    with interrupts.as_interrupt(), pytest.raises(KeyboardInterrupt):
        _trial(study, "k")
    (t,) = study.trials
    assert t.state == TrialState.FAIL and t.user_attrs["fail_reason"].startswith("interrupted")


def test_an_empty_study_name_is_refused(tmp_path, capsys):
    assert main(ARGS[:4] + ["--study", "", "--trials", "1", "--storage", str(tmp_path / "s.db")]) == 2
    assert "--study" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_export_uses_the_price_the_study_was_tuned_at(tmp_path, capsys):
    import yaml

    url = str(tmp_path / "s.db")
    assert main(ARGS + ["--trials", "1", "--storage", url, "--usd-per-gpu-hour", "9.5"]) == 0
    assert main(["export", "--study", "conc", "--storage", url, "--top", "1", "--out", str(tmp_path / "r")]) == 0
    (recipe,) = (tmp_path / "r").rglob("*.yaml")
    assert "9.5" in recipe.read_text() and yaml.safe_load(recipe.read_text())


@pytest.mark.slow
def test_sampler_workers_never_run_a_layout_twice(tmp_path):
    """Three random-sampler workers on a small space (Qwen3-30B-A3B on 2 x H200), where their proposals collide
    often; full size: `python benchmarks/concurrent_workers.py --workers 3 --proposer random --storage sqlite`."""
    url = f"sqlite:///{tmp_path}/study.db"
    runs = run_workers(url, 3, 30, tmp_path, model="qwen3-30b-a3b", extra=["--gpus", "2", "--proposer", "random"])
    figures = judge(url, runs)
    assert figures["crashed_workers"] == [], figures["crash_lines"]
    assert figures["running_left"] == 0 and figures["duplicates"] == 0 and figures["complete"] > 0, figures


PAUSED = [sys.executable, str(ROOT / "tests" / "paused_worker.py")]
PAUSE_STEPS = ("created", "keyed", "claimed", "measured")
SMALL_SPACE = ["--model", "llama3-8b", "--gpu", "h200", "--gpus", "2", "--study", "conc", "--no-progress", "--top", "0"]


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T")


def _paused_scenario(tmp: Path, proposer: str, step: str, grace_env: dict) -> dict:
    """A worker stopped at `step` of its first claim for longer than the heartbeat grace period; another runs
    meanwhile (for a sampler's ask stopped before its key, at once: it must wait for the storage's verdict on
    the stopped trial, not a timer); then the first is continued. Returns what the study holds."""
    tmp.mkdir()
    url = f"sqlite:///{tmp}/study.db"
    args = SMALL_SPACE + ["--storage", url, "--proposer", proposer]
    run = dict(cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    env = {**os.environ, **grace_env}
    if proposer == "tpe":   # past the sampler's random start, so the next proposals come from Optuna's ask
        subprocess.run(PAUSED + args + ["--trials", "10"], check=True, timeout=120, **run)
        tried = {t.user_attrs.get("layout_key") for t in load(url).trials}
        top = f"sqlite:///{tmp}/top.db"   # an untried valid layout both asks will propose
        subprocess.run(PAUSED + SMALL_SPACE + ["--storage", top, "--trials", "12"], check=True, timeout=120, **run)
        env["ATTUNE_TEST_ASK_PARAMS"] = json.dumps(next(
            t.params for t in optuna.load_study(study_name="conc", storage=top).trials
            if t.state == TrialState.COMPLETE and t.user_attrs.get("layout_key") not in tried))
    a = subprocess.Popen(PAUSED + args + ["--trials", "1"], env={**env, "ATTUNE_TEST_PAUSE_AT": step}, **run)
    try:
        _wait_for(a, f"pausing at {step}")
        deadline = time.monotonic() + 30
        while not _stopped(a.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stopped(a.pid)
        if (proposer, step) != ("tpe", "created"):
            time.sleep(TEST_GRACE_S + 8)   # its trial goes stale: the next worker may take the layout again
        b = subprocess.run(PAUSED + args + ["--trials", "1"], timeout=180, env=env, **run)
        assert b.returncode == 0, b.stderr[-2000:]
        a.send_signal(signal.SIGCONT)
        a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
    trials = load(url).trials
    first_of_a = trials[10 if proposer == "tpe" else 0]
    complete: dict = {}
    for t in trials:
        if t.state == TrialState.COMPLETE:
            complete.setdefault((t.user_attrs.get("backend"), t.user_attrs.get("layout_key")), []).append(t.number)
    return {"twice": {k: v for k, v in complete.items() if len(v) > 1},
            "running": [t.number for t in trials if t.state == TrialState.RUNNING],
            "collided": any(t.params == first_of_a.params for t in trials if t.number > first_of_a.number),
            "a_exit": a.returncode}


@pytest.mark.slow
def test_a_worker_paused_at_any_step_of_its_claim_never_completes_a_layout_twice(tmp_path, short_grace):
    from concurrent.futures import ThreadPoolExecutor
    # each step once, under one proposer or the other (tpe at "created": a sampler's ask stopped before its key);
    # ATTUNE_TEST_ALL_PAUSES=1: every step under both (the full size, as benchmarks/concurrent_workers.py says)
    cases = [(p, s) for p in ("agent", "tpe") for s in PAUSE_STEPS] if os.environ.get("ATTUNE_TEST_ALL_PAUSES") \
        else [("agent", "keyed"), ("agent", "measured"), ("tpe", "created"), ("tpe", "claimed")]
    with ThreadPoolExecutor(len(cases)) as pool:
        found = dict(zip(cases, pool.map(lambda c: _paused_scenario(tmp_path / f"{c[0]}-{c[1]}", *c, short_grace), cases)))
    for case, f in found.items():
        assert f["twice"] == {} and f["running"] == [] and f["a_exit"] == 0, (case, f)
    # the scenarios do race: the other worker ran the layout the stopped one had proposed
    assert all(f["collided"] for f in found.values()), [c for c, f in found.items() if not f["collided"]]


def _foreground() -> None:
    """A tune started as a user starts it in a terminal: no signal ignored (under nohup or `&` in a script, the
    test's own process would pass SIGHUP or SIGINT down ignored, and tune keeps them ignored)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_each_signal_at_random_moments_ends_tune_without_waiting_for_its_trial(tmp_path, sig):
    """Each signal ends tune at once (about a second on an idle machine), not after the running trial (300 s
    here): the bound is generous so that a loaded machine's slow start-up is not taken for a wait."""
    import random
    rng = random.Random(int(sig))
    url = f"sqlite:///{tmp_path}/study.db"
    env = {**os.environ, "ATTUNE_TEST_TRIAL_S": "300"}
    for moment in [rng.uniform(0.0, 3.0) for _ in range(3)] + ["trial"]:
        p = subprocess.Popen(SLOW + SMALL_SPACE + ["--trials", "3", "--storage", url], env=env, cwd=tmp_path,
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=_foreground)
        if moment == "trial":
            _wait_for(p, "running ")
        else:
            time.sleep(moment)
        sent = time.monotonic()
        p.send_signal(sig)
        p.communicate(timeout=60)
        assert time.monotonic() - sent < 60, (sig, moment)
    if Path(f"{tmp_path}/study.db").exists():
        assert not [t for t in load(url).trials if t.state == TrialState.RUNNING]


@pytest.mark.slow
def test_a_signal_the_tuner_was_started_ignoring_stays_ignored(tmp_path):
    """`nohup tune ...`: SIGHUP was ignored when tune started, and stays so during a trial."""
    url = f"sqlite:///{tmp_path}/study.db"
    p = subprocess.Popen(["nohup"] + SLOW + SMALL_SPACE + ["--trials", "1", "--storage", url],
                         env={**os.environ, "ATTUNE_TEST_TRIAL_S": "300"}, cwd=tmp_path, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    try:
        _wait_for(p, "running ")
        p.send_signal(signal.SIGHUP)
        time.sleep(2.0)
        assert p.poll() is None   # still running its trial
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert not [t for t in load(url).trials if t.state == TrialState.RUNNING]


def test_export_of_a_study_with_no_completed_trial_exits_1_as_the_run_does(tmp_path, capsys):
    url = str(tmp_path / "s.db")
    assert main(ARGS + ["--trials", "1", "--storage", url]) == 0
    tuned = optuna.load_study(study_name="conc", storage=f"sqlite:///{url}")
    empty = optuna.create_study(study_name="empty", storage=f"sqlite:///{url}", direction="maximize")
    for key, value in tuned.user_attrs.items():   # the same configuration, no trial yet (a run interrupted early)
        empty.set_user_attr(key, value)
    capsys.readouterr()
    assert main(["export", "--study", "empty", "--storage", url, "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.strip() == "tune: study 'empty' has no completed trial to export"
    assert not (tmp_path / "r").exists()
