"""The tuning study: an Optuna study whose trials are layouts, resumable from its storage.

Everything that could fail on the user's input (model, GPU, space, storage) is checked before
the study is created or changed, so a bad command never touches what is already recorded.

What a study ranks is what its runner runs: layouts its stack cannot run are pruned with the reason
(search_space.runner_space), and each trial's `prediction` is the runner's own (`TrialRunner.predict`:
for the megatron runner, its truncated model run). A layout that failed for a reason that cannot
change (experiments.runner.PERMANENT_FAILURES) is not proposed again with that backend.

One study holds one kind of figures (`check_figures`): Optuna's best trial is the largest objective
value, so a measured study must never hold a predicted value. A backend whose figures differ from
those already in the study (predict vs a measured backend) is refused in one line; pruned and failed
trials keep their predictions in user attributes, without a value. Each trial also carries flat
numeric attributes (peak_memory_gib, mfu, ..., `figures`) for optuna-dashboard.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.model_spec import ModelSpec
from cost_model.profile import HardwareProfile
from cost_model.nouns.workload import STEP_OPTION_DEFAULTS, Workload
from experiments.runner import (PERMANENT_FAILURES, RunnerError, TrialResult, TrialRunner, TrialSpec,
                                allocator_retries_per_step)
from search_space.enumerate import NARROWING_FIELDS, SpaceOptions
from search_space.runner_space import RunnerSpace, narrow
from cost_model.nouns.layout import InvalidLayout, Layout
from search_space.rules import check
from cost_model.nouns.stack import Stack
from tuner.optuna_adapter import set_trial_attrs, storage_of, stored_trial, trial_id_of
from tuner.trial_record import read_trial, read_trials
from tuner.interval import Interval, number
from tuner.intervals import measured_before, posterior_interval, predicted_figure, prediction_interval
from tuner.model_identity import architecture_digest, recorded_before_digests
from tuner.proposer import History, Proposal, Proposer, family
from cost_model.nouns.layout_codec import from_optuna_params, layout_values
from tuner.space_params import distributions
from tuner.interrupts import as_interrupt, storage_calls_held
from tuner.trial_claims import (CLAIM_LOST, ask_trial, create_trial, end_interrupted, fail_reason, fail_stale,
                                  heartbeat, is_lost_claim, lost_to, still_running)
from tuner.space_cache import cost_model_digest
from tuner.sqlite_file import check_sqlite_file, first_line
from tuner.storages import (DEFAULT_STORAGE, StudyError, masked, postgresql_engine, shown, storage_url,  # noqa: F401
                            unreadable_attribute_at)


# The identity's digest of a --profile's content (cost_model.profile.content_digest); studies made before it have none
PROFILE_DIGEST = "profile_digest"



def workload_identity(workload: Workload) -> dict:
    """The workload's fields, its step options only when set: studies made before those options resume."""
    base = {k: v for k, v in asdict(workload).items() if k not in (*STEP_OPTION_DEFAULTS, "image_size")}
    return {**base, **workload.step_options}


# The stack fields every study has recorded; the others (what a runner's software provides) only when not the default
_STACK_IDENTITY = ("output_gate_tp_fix", "deepep", "transformer_engine", "precision_aware_optimizer")


def stack_identity(stack: Stack) -> dict:
    """The stack's fields a study is told apart by: studies made before the stack held a runner's fields resume."""
    default = Stack()
    return {k: v for k, v in asdict(stack).items() if k in _STACK_IDENTITY or v != getattr(default, k)}


@dataclass(frozen=True)
class StudyConfig:
    model: ModelSpec
    gpu: GpuSpec
    world_size: int
    workload: Workload
    stack: Stack = Stack()
    options: SpaceOptions = SpaceOptions()
    profile: HardwareProfile | None = None   # None: the profile shipped for the GPU type
    steps: int = 20                          # steps of a measured trial
    window: tuple[int, int] = (5, 19)        # the steps whose time is measured

    def identity(self) -> dict:
        """What a study is about; resuming with a different identity is refused."""
        defaults = asdict(SpaceOptions())
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.options).items()
                   if k not in NARROWING_FIELDS or v != defaults[k]}  # as studies made before those fields
        out = {
            "model": self.model.name, "gpu": self.gpu.name, "gpus": self.world_size,
            "workload": workload_identity(self.workload),
            "stack": stack_identity(self.stack), "options": options,
            # $/1M tokens and every figure depend on these: a resumed study must not mix them
            "usd_per_gpu_hour": self.gpu.usd_per_gpu_hour, "profile": self.profile_name(),
        }
        digest = architecture_digest(self.model)
        if digest:   # a config.json is named by its folder: two folders of one name are two models
            out["architecture"] = digest
        if self.profile is not None:   # a profile is named by its header: an edited file keeps the name
            out[PROFILE_DIGEST] = self.profile.digest()
        return out

    def profile_name(self) -> str:
        p = self.profile
        return "shipped" if p is None else f"{p.gpu_type} {p.provenance} {p.date}: {p.source}"[:300]

    def case(self, layout: Layout) -> Case:
        return Case(self.model, self.gpu, self.workload, layout, self.stack)

    def describe(self) -> str:
        return f"{self.model.display_name} on {self.world_size} x {self.gpu.display_name}"


def default_study_name(model: ModelSpec, gpu: GpuSpec, world_size: int) -> str:
    return f"{model.name}-{gpu.name}-x{world_size}"


def open_storage(url: str, create_dirs: bool = False, must_exist: bool = False,
                 writable: bool = True) -> optuna.storages.BaseStorage:
    """Open a storage without writing to anything that is not already an Optuna storage. `must_exist`
    (commands that only read): a missing SQLite file is refused, not created. RDB storages get Optuna's
    heartbeat (tuner.trial_claims), so any worker can fail the trials of a dead one."""
    from tuner.trial_claims import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S, mark_stale
    from tuner.trial_record import forget_warnings

    forget_warnings()   # a malformed trial is named once per command (per storage opened), not once per process
    engine_kwargs, engine_url = {}, url
    if url.startswith("sqlite:///"):
        try:
            check_sqlite_file(url, Path(url[len("sqlite:///"):]), create_dirs, must_exist, writable)
        except OSError as e:  # an unreadable file, a folder that cannot be made
            raise StudyError(" ".join(f"study storage {shown(url)}: {e.strerror or e}".split())) from None
        # several tuners on one file wait for each other's write lock instead of failing at once
        engine_kwargs = {"connect_args": {"timeout": 120}}
    elif url.startswith("postgresql"):
        engine_url, engine_kwargs = postgresql_engine(url)
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # the heartbeat arguments are experimental in Optuna 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(engine_url, engine_kwargs=engine_kwargs, skip_compatibility_check=False,
                                                  heartbeat_interval=HEARTBEAT_INTERVAL_S,
                                                  grace_period=GRACE_PERIOD_S,
                                                  heartbeat_stale_trial_callback=mark_stale)
        except Exception as e:  # SQLAlchemy and Optuna raise many types; the user needs one line
            if attempt + 1 < SCHEMA_RACE_ATTEMPTS and _schema_race(e):
                time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
                continue
            raise StudyError(masked(f"cannot open study storage {url}: {first_line(e)}", url)) from None
    raise AssertionError("unreachable")


# Tuners that open a new database at the same moment all create Optuna's tables: on PostgreSQL all but
# one fail on a duplicate type or table; a moment later the tables exist and opening succeeds.
SCHEMA_RACE_ATTEMPTS = 5


def _schema_race(e: Exception) -> bool:
    text = str(e).lower()
    return any(w in text for w in ("already exists", "duplicate key", "unique constraint", "uniqueviolation"))


@contextlib.contextmanager
def storage_errors(url: str):
    """A storage that fails mid-run (read-only file, lost server) ends the command in one line; what is
    already recorded stays (each trial is its own transaction)."""
    import sqlalchemy.exc

    try:
        yield
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ else e
        text = getattr(cause, "orig", None) or cause
        raise StudyError(masked(f"study storage {url}: {first_line(text)}", url)) from None
    except json.JSONDecodeError:   # a stored attribute that is not JSON: Optuna reads the study no further
        culprit = unreadable_attribute_at(url)
        if culprit is None:
            raise
        raise StudyError(masked(f"study storage {url}: {culprit} is not JSON (the storage was corrupted)", url)) \
            from None


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    """The names of the studies the storage holds."""
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        known = study_names(storage)
        raise StudyError(f"no study named '{name}' in this storage; studies there: {', '.join(known) or 'none'}") \
            from None


METRIC = "tokens_per_s_per_gpu"
FIGURES = "figures"   # the study's user attribute: "predicted" or "measured"


def load_or_create(storage: optuna.storages.BaseStorage, name: str, config: StudyConfig,
                   figures: str | None = None) -> optuna.Study:
    """The study `name`, created when new; refused when it was made for another configuration or, when
    `figures` is given, holds figures of another kind (see `check_figures`)."""
    identity = config.identity()
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:   # another tuner created it a moment ago
            study = optuna.load_study(study_name=name, storage=storage)
        else:
            with warnings.catch_warnings():  # experimental since Optuna 3.2; optuna-dashboard names the axis
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC])
            study.set_user_attr("config", identity)
            if figures:
                study.set_user_attr(FIGURES, figures)
            return study
    check_existing(study, name, config, figures, write=True)
    return study


def precheck_study(storage: optuna.storages.BaseStorage, name: str, config: StudyConfig,
                   figures: str | None = None) -> None:
    """load_or_create's refusals for a study that exists, writing nothing (run before the slow scoring)."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return
    check_existing(study, name, config, figures, write=False)


def check_existing(study: optuna.Study, name: str, config: StudyConfig, figures: str | None, write: bool) -> None:
    identity = config.identity()
    existing = _recorded_config(study)
    if existing is None and not study.trials:
        # its creator stopped between creating it and recording what it is about: nothing is in it yet
        if write:
            study.set_user_attr("config", identity)
        existing = identity
    asked = as_recorded_before_profile_digests(existing, identity)
    if existing is not None and _added_since(existing, asked, config):
        existing = asked   # a study made before price and profile were recorded
    if existing != asked:
        was = f"{existing['model']} on {existing['gpus']} x {existing['gpu']}" if existing else "something else"
        differ = "; ".join(_differences(existing, identity)[:3]) if existing else ""
        raise StudyError(f"study '{name}' was created for {was} with other settings"
                         + (f" ({differ})" if differ else "")
                         + f"; pass another --study to tune {config.describe()}")
    if write and study.user_attrs.get("config") != identity:
        study.set_user_attr("config", identity)   # what it lacked (price, profile, its digest) recorded now
    if figures:
        check_figures(study, figures)


def as_recorded_before_profile_digests(existing: dict | None, identity: dict) -> dict:
    """`identity` as a study recorded before profile digests has it (without the digest) when that study lacks one:
    such a study resumes with the profile of the name it recorded, and records its digest then."""
    if isinstance(existing, dict) and PROFILE_DIGEST in identity and PROFILE_DIGEST not in existing:
        return {k: v for k, v in identity.items() if k != PROFILE_DIGEST}
    return identity


def _differences(recorded: dict, asked: dict, prefix: str = "") -> list[str]:
    """'key: X recorded, Y asked' for each setting that differs (a key one side lacks is a step option left at
    its default there, see `workload_identity`)."""
    first = ("model", "gpu", "gpus", "workload", "stack")   # what a user asked for before what it implies
    out = []
    for key in sorted(set(recorded) | set(asked), key=lambda k: (first.index(k) if k in first else len(first), str(k))):
        a, b = recorded.get(key, "default"), asked.get(key, "default")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif key == PROFILE_DIGEST and not prefix:
            # said only where the names agree (else the name's line says it); none on one side: no --profile there
            if a != b and "default" not in (a, b) and recorded.get("profile") == asked.get("profile"):
                out.append(f"profile: other figures under the same name, content digest {a} recorded, {b} asked")
        elif a != b and not _at_default(f"{prefix}{key}", a, b):
            out.append(f"{prefix}{key}: {a} recorded, {b} asked")
    return out


def _at_default(key: str, a, b) -> bool:
    """One side left a workload option out (its default) and the other holds that default: no difference (an
    image size of 448 recorded with images asked of a study without them)."""
    defaults = {**STEP_OPTION_DEFAULTS, "image_size": Workload().image_size}
    name = key.removeprefix("workload.")
    return key.startswith("workload.") and name in defaults and "default" in (a, b) and defaults[name] in (a, b)


def recorded_offload_fractions(storage: optuna.storages.BaseStorage, name: str) -> tuple[float, ...] | None:
    """The optimizer offload fractions an existing study searched (None: no such study, or none recorded)."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    fractions = ((_recorded_config(study, wait_s=0.0) or {}).get("options") or {}).get("offload_fractions")
    if not isinstance(fractions, list) or not all(isinstance(f, (int, float)) and 0 <= f <= 1 for f in fractions):
        return None
    return tuple(float(f) for f in fractions)


def _recorded_config(study: optuna.Study, wait_s: float = 10.0) -> dict | None:
    """The study's recorded configuration; a study just created by another tuner gets it within moments."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        existing = study.user_attrs.get("config")
        if existing is not None or study.trials or time.monotonic() > deadline:
            return existing
        time.sleep(0.2)


def _added_since(existing: dict, identity: dict, config: StudyConfig) -> bool:
    """A study recorded before the price and the profile were part of its identity matches when all else
    does and this run uses the catalog price and the shipped profile (what that study was made with)."""
    if "architecture" in identity and "architecture" not in existing:   # recorded before config digests
        return recorded_before_digests(existing, identity)
    later = ("usd_per_gpu_hour", "profile")
    if any(k in existing for k in later):
        return False
    from cost_model.nouns.hardware import load_gpu
    catalog_price = load_gpu(config.gpu.name).usd_per_gpu_hour
    same_rest = {k: v for k, v in identity.items() if k not in later} == existing
    return same_rest and identity["usd_per_gpu_hour"] == catalog_price and identity["profile"] == "shipped"


def check_figures(study: optuna.Study, figures: str) -> None:
    """Refuse to add `figures` ("predicted" or "measured") trials to a study holding the other kind: its
    best trial would mix a prediction with measurements. Studies made before the kind was recorded are
    judged by their completed trials."""
    kinds = {study.user_attrs.get(FIGURES)} - {None}
    kinds |= {r.result_kind for r in read_trials(study, states=(TrialState.COMPLETE,))}
    other = sorted(kinds - {figures})
    if other:
        raise StudyError(f"study '{study.study_name}' holds {' and '.join(other)} figures; {figures} trials "
                         f"go in a study of their own: pass another --study")


INTERRUPTED = "interrupted: the tuner stopped while this trial ran"


def history_of(study: optuna.Study, skip_interrupted: bool = False, backend: str | None = None) -> History:
    """What the study has tried with this backend (a layout predicted earlier can still be measured).
    A layout that failed permanently (PERMANENT_FAILURES: invalid_config, crash, cuda_oom) is tried;
    other failures (timeout, hang) may be proposed again, and interrupted ones unless `skip_interrupted`.
    Every failure with a class is in `failed` as (layout key, failure class, predicted peak GiB)."""
    h, best = History(), []
    study_attrs = study.user_attrs
    for t in study.get_trials(deepcopy=False):
        if is_lost_claim(t):
            continue    # a proposal that lost its layout to another tuner's trial: not a trial run
        r = read_trial(t)   # a malformed attribute (a peer's edit) is read as missing, warned about once
        key = r.layout_key
        if backend is not None and (r.backend if r.backend is not None else "predict") != backend:
            key = None
        # a layout another tuner is running is taken too (it will hold the claim: tuner.trial_claims)
        if key and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING):
            h.tried.add(key)
        if key and skip_interrupted and t.state == TrialState.FAIL and \
                str(fail_reason(study_attrs, t) or "").startswith("interrupted"):
            h.tried.add(key)
        result = r.result
        if key and t.state == TrialState.FAIL and result.failure_class:
            h.failed.append((key, result.failure_class, r.prediction.peak_memory_gib))
            if result.failure_class in PERMANENT_FAILURES:
                h.tried.add(key)
        if t.state == TrialState.COMPLETE and number(r.value) is not None:
            best.append(r.value)
            if key:
                h.ran.add(key)
        if t.state == TrialState.COMPLETE and result.kind == "measured" and r.rankable:
            layout = r.parsed_layout()
            predicted = r.prediction.tokens_per_s_per_gpu
            # A runner that ran a different model (truncated layers) reports the prediction for what it ran.
            facts = result.trial_result().details
            if (facts.get("prediction_for_model_run") or {}).get("tokens_per_s_per_gpu"):
                predicted = facts["prediction_for_model_run"]["tokens_per_s_per_gpu"]
            h.measured.append((family(layout), result.tokens_per_s_per_gpu, predicted))
            h.measured_layouts.append((layout, result.tokens_per_s_per_gpu))
            if allocator_retries_per_step(facts):
                h.strained.add(layout.key())
    h.best_value = max(best) if best else None
    h.peers = _peers(study)
    return h


PEER_WINDOW_S = 60


def _peers(study: optuna.Study) -> int:
    """Tuners seen on the study in the last minute (owners of its recent trials), this one included."""
    import datetime

    since = datetime.datetime.now() - datetime.timedelta(seconds=PEER_WINDOW_S)
    here = socket.gethostname()

    def live(owner: dict) -> bool:   # a tuner of this host that has ended is no peer
        return owner.get("host") != here or _alive(int(owner.get("pid", -1)))

    owners = {json.dumps(t.user_attrs.get("owner"), sort_keys=True)
              for t in study.get_trials(deepcopy=False)[-64:]
              if t.datetime_start is not None and t.datetime_start >= since
              and isinstance(t.user_attrs.get("owner"), dict) and live(t.user_attrs["owner"])}
    owners.add(json.dumps(_owner(), sort_keys=True))
    return len(owners)


@dataclass
class RunSummary:
    completed: int = 0
    pruned: int = 0
    failed: int = 0
    exhausted: bool = False
    reason: str = ""          # why the loop stopped before its trials (proposer's stop rule, GPU-hour budget)


def _owner() -> dict:
    # heartbeat: this tune records one from the trial's creation (tuner.trial_claims.fail_stale)
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": True}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Mark FAILED the trials left RUNNING by tuners that no longer run; returns their numbers.

    A trial with a heartbeat is failed once its heartbeat is older than the grace period, whichever
    host ran it (Optuna's fail_stale_trials). One without (made by an older tune, or killed before its
    first beat) is failed when its owner ran on this host and that process is gone; another host's is
    left alone. Trials queued WAITING by older versions of tune are ended too: an ask would hand them to
    the wrong proposal."""
    running = {trial_id_of(t): t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    fail_stale(study)
    storage = storage_of(study)
    marked = [n for tid, n in running.items() if storage.get_trial(tid).state == TrialState.FAIL]
    here = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        owner = t.user_attrs.get("owner") or {}
        if t.state == TrialState.WAITING and user_enqueued(t):
            continue        # a user's seed (study.enqueue_trial): run_study runs it before proposing
        orphan = t.state == TrialState.WAITING
        if orphan or (owner.get("host") == here and not _alive(int(owner.get("pid", -1)))):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_user_attr(trial_id_of(t), "fail_reason",
                                                   "queued by an older tune, never run" if orphan else INTERRUPTED)
                if storage.set_trial_state_values(trial_id_of(t), state=TrialState.FAIL):
                    marked.append(t.number)
    return sorted(marked)


def _complete_seed(study: optuna.Study, t: optuna.trial.FrozenTrial, dists: dict) -> None:
    """A user's seed names the layout's sizes; a choice it leaves out that has a 'none' (no pipeline layout
    string) is 'none', not whatever the sampler would draw."""
    fixed = dict(t.system_attrs.get("fixed_params") or {})
    missing = {n: "none" for n, d in dists.items() if n not in fixed and "none" in getattr(d, "choices", ())}
    if missing:
        storage_of(study).set_trial_system_attr(trial_id_of(t), "fixed_params", {**fixed, **missing})


def user_enqueued(t: optuna.trial.FrozenTrial) -> bool:
    """A WAITING trial a user queued with study.enqueue_trial (tune's own trials carry its attributes)."""
    return not any(k in t.user_attrs for k in ("owner", "backend", "proposer"))


def runner_space(config: StudyConfig, runner: TrialRunner) -> RunnerSpace:
    """The study's space narrowed to what `runner` can run (StudyError when it cannot run the model)."""
    try:
        run = runner.model_run(config.model)
    except ValueError as e:
        raise StudyError(f"the {runner.name} runner cannot run {config.model.display_name}: {e}") from None
    return narrow(config.options, config.model, config.world_size, runner.stack, runner.name, run)


def gpu_hours_used(study: optuna.Study, backend: str) -> float:
    """GPU-hours of the study's trials run by `backend` (measured results carry theirs); a peer's malformed figure
    reads as missing, with its one warning line (trial_record), instead of stopping the study."""
    return sum(r.result.gpu_hours or 0.0 for r in read_trials(study) if r.backend == backend)


def run_study(study: optuna.Study, config: StudyConfig, runner: TrialRunner, proposer: Proposer,
              trials: int, progress: bool = True, skip_interrupted: bool = False,
              gpu_hours: float | None = None) -> RunSummary:
    """Run `trials` trials proposed by `proposer` through `runner`. The Optuna distributions are the
    study's whole space (they must not change within a study); layouts the runner cannot run are pruned."""
    dists = distributions(config.model, config.world_size, config.options, config.workload)
    space = runner_space(config, runner)
    check_figures(study, runner.figures)
    if study.user_attrs.get(FIGURES) is None:
        study.set_user_attr(FIGURES, runner.figures)
    summary = RunSummary()
    bar = _progress(trials, progress)
    loop = _Loop(study, dists, config, runner, space, proposer, bar, skip_interrupted)
    if proposer.sampler() is not None:
        study.sampler = proposer.sampler()
    lost_in_a_row = 0
    try:
        with as_interrupt(), storage_calls_held(storage_of(study)):
            while summary.completed + summary.pruned + summary.failed < trials:
                if gpu_hours is not None and gpu_hours_used(study, runner.name) >= gpu_hours:
                    summary.exhausted = True
                    summary.reason = f"stopped: the trials have used the --gpu-hours budget ({gpu_hours:g})"
                    break
                fail_stale(study)   # trials of tuners that died (any host) are failed before proposing
                history = history_of(study, skip_interrupted, runner.name)
                seeded = [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) if user_enqueued(t)]
                if seeded:
                    _complete_seed(study, seeded[0], dists)
                proposal = (Proposal(None, "enqueued by the user (study.enqueue_trial): run before the proposer's "
                                           "own choices") if seeded else proposer.propose(history))
                if proposal is None:
                    summary.exhausted = True
                    summary.reason = getattr(proposer, "stop_reason", None) or \
                        "every distinct fitting layout has been tried"
                    break
                state, trial = _claim_and_evaluate(loop, history, proposal)
                if state is None:     # another tuner holds this layout: propose again (not a trial of ours)
                    lost_in_a_row += 1
                    if lost_in_a_row >= MAX_LOST_CLAIMS:
                        summary.exhausted = True
                        summary.reason = (f"stopped: {MAX_LOST_CLAIMS} proposals in a row were layouts other "
                                          f"tuners of this study hold")
                        break
                    continue
                lost_in_a_row = 0
                _count(summary, state, bar, history, study, trial)
    finally:
        bar.close()
    return summary


MAX_LOST_CLAIMS = 50


def _new_trial(study: optuna.Study, dists: dict, proposal, runner: TrialRunner, proposer: Proposer,
               config: StudyConfig) -> optuna.Trial:
    """The proposal as a RUNNING trial carrying its own rationale and layout key. A sampler's proposal
    comes from Optuna's ask, its key written just after (`lost_to` waits for such keys)."""
    attrs = {"owner": _owner(), "backend": runner.name, "proposer": proposer.name,
             "rationale": proposal.rationale, **{k: _jsonable(v) for k, v in proposal.attrs.items()}}
    if proposal.params is not None:
        try:  # the layout key is written with the trial, so no later claim can miss it
            attrs["layout_key"] = from_optuna_params(proposal.params, config.world_size, config.workload.seq_len).key()
        except InvalidLayout:
            pass
        return create_trial(study, proposal.params, dists, attrs)
    return ask_trial(study, dists, attrs)


@dataclass(frozen=True)
class _Loop:
    """What every trial of one `run_study` shares."""
    study: optuna.Study
    dists: dict
    config: StudyConfig
    runner: TrialRunner
    space: RunnerSpace
    proposer: Proposer
    bar: object
    skip_interrupted: bool


def _claim_and_evaluate(loop: _Loop, history: History, proposal: Proposal) -> tuple[TrialState | None, optuna.Trial]:
    """Make the proposal's trial, claim its layout and run it; state None when an earlier trial of another
    tuner holds the layout (or another tuner ended this one)."""
    study, dists, config, runner, space, proposer, bar, skip_interrupted = (
        loop.study, loop.dists, loop.config, loop.runner, loop.space, loop.proposer, loop.bar, loop.skip_interrupted)
    trial = _new_trial(study, dists, proposal, runner, proposer, config)
    try:
        with heartbeat(study, trial):
            key = _layout_key(trial, config)
            if key and trial.user_attrs.get("layout_key") != key:
                trial.set_user_attr("layout_key", key)
            holder = lost_to(study, trial, key, runner.name,
                             settle_s=0.0 if proposal.params is not None else 5.0) if key else None
            if holder is not None:
                trial.set_user_attr("prune_reason", f"{CLAIM_LOST} {holder} (another tuner proposed it first)")
                study.tell(trial, state=TrialState.PRUNED)
                return None, trial
            if not still_running(study, trial):  # paused past the grace period: failed as stale meanwhile
                raise optuna.exceptions.UpdateFinishedTrialError(f"trial {trial.number} ended by another tuner")
            _say(bar, f"trial {trial.number}: {proposal.rationale}")
            state = _evaluate(study, trial, config, runner, history, space,
                              learn=lambda t, layout, r: _learn(study, t, proposer, layout, r,
                                                                history_of(study, skip_interrupted, runner.name)),
                              take_borderline=proposer.weighs_fit_risk)
    except KeyboardInterrupt:
        end_interrupted(storage_of(study), trial_id_of(trial), "interrupted by the user")
        raise
    except RunnerError as e:  # the runner cannot run trials at all: record it, then stop
        end_interrupted(storage_of(study), trial_id_of(trial), f"runner: {e}")
        raise
    except optuna.exceptions.UpdateFinishedTrialError:
        _say(bar, f"trial {trial.number}: ended by another tuner (its heartbeat was late); not counted")
        return None, trial
    _say(bar, "  -> " + _outcome(study, trial))
    return state, trial


def _layout_key(trial: optuna.Trial, config: StudyConfig) -> str | None:
    try:
        return from_optuna_params(trial.params, config.world_size, config.workload.seq_len).key()
    except InvalidLayout:
        return None     # pruned by _evaluate with the reason


def _count(summary: RunSummary, state: TrialState, bar, history: History, study: optuna.Study,
           trial: optuna.Trial) -> None:
    if state == TrialState.COMPLETE:
        summary.completed += 1
    elif state == TrialState.PRUNED:
        summary.pruned += 1
    else:
        summary.failed += 1
    bar.update(1)
    best = history.best_value
    latest = stored_trial(study, trial).value if state == TrialState.COMPLETE else None
    if latest is not None and (best is None or latest > best):
        best = latest
    if best is not None:
        bar.set_postfix_str(f"best {best:,.0f} tokens/s/GPU")


def _learn(study: optuna.Study, trial: optuna.Trial, proposer: Proposer, layout, result: TrialResult,
           history: History) -> dict:
    """What the trial's result taught the proposer: the trial's attributes to record before it ends (the weights
    go on the study now)."""
    if result.status == "ok":
        history.ran.add(layout.key())
    if result.status == "ok" and result.kind == "measured":
        history.measured_layouts.append((layout, result.tokens_per_s_per_gpu))
        if allocator_retries_per_step(result.details):
            history.strained.add(layout.key())
    elif result.status != "ok":
        peak = (trial.user_attrs.get("prediction") or {}).get("peak_memory_gib")
        history.failed.append((layout.key(), result.failure_class, peak))
    history.tried.add(layout.key())
    taught = proposer.after_trial(history)
    taught = {key: _jsonable(value) for key, value in taught.items()}
    weights = taught.get("hypothesis_weights_after")
    if weights is not None and study.user_attrs.get("hypothesis_weights") != weights:   # a commit only for news
        study.set_user_attr("hypothesis_weights", weights)
    return taught


def _outcome(study: optuna.Study, trial: optuna.Trial) -> str:
    """The ended trial in a few words: its figure, or why it was pruned or failed; what it taught."""
    frozen = stored_trial(study, trial)
    result = frozen.user_attrs.get("result") or {}
    if frozen.state == TrialState.COMPLETE and result.get("tokens_per_s_per_gpu"):
        outcome = f"{result['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU {result.get('kind', '')}"
    else:
        outcome = str(frozen.user_attrs.get("prune_reason") or frozen.user_attrs.get("fail_reason")
                      or frozen.state.name)[:160]
    learnt = frozen.user_attrs.get("learnt")
    return outcome + (f"; learnt: {learnt}" if learnt else "")


def _say(bar, line: str) -> None:
    """One line on stderr that does not break the progress bar."""
    if hasattr(bar, "write"):
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def _evaluate(study: optuna.Study, trial: optuna.Trial, config: StudyConfig, runner: TrialRunner,
              history: History, space: RunnerSpace | None = None, learn=None,
              take_borderline: bool = False) -> TrialState:
    """Prune what cannot or need not run; else run it. Only a runner's own result becomes the value.
    A borderline layout (it may or may not fit) runs only for a proposer that weighed its risk. The trial's
    attributes are written together (tuner.optuna_adapter.set_trial_attrs): before the run (its layout and
    prediction stay if the run never returns) and with its end."""
    attrs: dict = {}

    def prune(reason: str) -> TrialState:
        attrs["prune_reason"] = reason
        attrs.update(flat_attrs(attrs.get("prediction"), None))
        set_trial_attrs(trial, attrs)
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED

    try:
        layout = from_optuna_params(trial.params, config.world_size, config.workload.seq_len)
        check(layout, config.model, config.workload, config.stack)
    except InvalidLayout as e:
        return prune(str(e))
    attrs.update(layout={"world_size": layout.world_size, **layout_values(layout)}, layout_key=layout.key(),
                 label=layout.long_label, cost_model=cost_model_digest())
    if layout.key() in history.tried:
        return prune("already evaluated in this study")
    refusal = space.refusal(layout) if space is not None else None
    if refusal:
        return prune(f"the {runner.name} runner cannot run it: {refusal}")
    try:  # what is ranked is what the runner runs (its model run, its stack)
        prediction = runner.predict(config.case(layout), config.profile)
    except InvalidLayout as e:
        return prune(f"the {runner.name} runner cannot run it: {e}")
    predicted = prediction.to_dict()
    interval = posterior_interval(trial.user_attrs.get("expected"), measured_before(history)) \
        or prediction_interval(config, runner, layout, prediction)
    predicted["interval"] = interval.to_dict()
    attrs["prediction"] = _jsonable(predicted)
    if not prediction.may_fit:
        return prune("predicted not to fit: " + "; ".join(prediction.reasons))
    if prediction.borderline and not take_borderline:
        return prune("predicted " + "; ".join(prediction.reasons) + " (the proposer does not weigh the risk)")
    # a real run may never return: its layout and prediction are kept first; a prediction answers at once and
    # writes them with its end
    kept_first = runner.figures != "predicted"
    if kept_first:
        set_trial_attrs(trial, attrs)
    result = runner.run(TrialSpec(config.case(layout), steps=config.steps, window=config.window))
    ended = ({} if kept_first else dict(attrs)) | {"result": result.to_dict()}
    ended.update(flat_attrs(attrs["prediction"], ended["result"]))
    if learn is not None:
        ended.update(learn(trial, layout, result))
    if result.status != "ok":
        ended["fail_reason"] = fail_reason_of(result)
    set_trial_attrs(trial, ended)
    if result.status == "ok":
        study.tell(trial, result.tokens_per_s_per_gpu)
        return TrialState.COMPLETE
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


# A failure the cost model predicted, in words: nothing ran, so no measured class (cuda_oom...) heads its reason
PREDICTED_FAILURES = {"cuda_oom": "out of GPU memory", "host_oom": "out of host memory"}


def fail_reason_of(result: TrialResult) -> str:
    """A failed trial's reason: the measured failure's class and detail, or for a predicted one what was predicted."""
    if result.kind == "predicted":
        what = PREDICTED_FAILURES.get(result.failure_class, f"to fail ({result.failure_class})")
        return f"predicted {what} (nothing ran): {result.detail}"
    return f"{result.failure_class}: {result.detail}"


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


FLAT_FIGURES = ("peak_memory_gib", "mfu", "usd_per_million_tokens")


def flat_attrs(prediction: dict | None, result: dict | None) -> dict:
    """Flat attributes optuna-dashboard shows as columns: the figures (from the result when the trial ran,
    else from its prediction), the prediction and its interval, and which kind of figures they are."""
    prediction = prediction or {}
    figures = result or prediction
    if not figures:
        return {}
    flat = {k: figures.get(k) for k in FLAT_FIGURES}
    interval = Interval.from_dict(prediction.get("interval"))
    flat["predicted_tokens_per_s_per_gpu"] = predicted_figure(prediction.get("tokens_per_s_per_gpu"), interval)
    if interval is not None:
        flat.update(predicted_low=interval.low, predicted_high=interval.high)
    out = {k: float(v) for k, v in flat.items() if number(v) is not None}
    out["figures"] = figures.get("kind", "predicted")
    return out


class _NoBar:
    def update(self, n): pass
    def set_postfix_str(self, s): pass
    def close(self): pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # optuna depends on tqdm
    # disable=None: a bar on a terminal, nothing when stderr is a pipe or a file.
    return tqdm(total=total, desc="trials", unit="trial", file=sys.stderr, dynamic_ncols=True, disable=None)
