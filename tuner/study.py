"""The tuning study: an Optuna study whose trials are layouts, resumable from its storage.

Everything that could fail on the user's input (model, GPU, space, storage) is checked before
the study is created or changed, so a bad command never touches what is already recorded.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from cost_model.case import Case
from cost_model.hardware import GpuSpec
from cost_model.model_spec import ModelSpec
from cost_model.predict import predict
from cost_model.profile import HardwareProfile
from cost_model.workload import Workload
from experiments.runner import RunnerError, TrialResult, TrialRunner, TrialSpec
from search_space.enumerate import SpaceOptions
from cost_model.layout import InvalidLayout, Layout
from search_space.rules import check
from cost_model.stack import Stack
from tuner.proposer import History, Proposer, family
from cost_model.layout_codec import from_optuna_params, layout_from_stored, layout_values
from tuner.space_params import distributions
from cost_model.errors import AttuneError

DEFAULT_STORAGE = "sqlite:///studies/attune.sqlite3"
SQLITE_MAGIC = b"SQLite format 3\x00"


class StudyError(AttuneError, RuntimeError):
    """A study that cannot be opened, created or resumed as asked."""


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
        return {
            "model": self.model.name, "gpu": self.gpu.name, "gpus": self.world_size,
            "workload": asdict(self.workload), "stack": asdict(self.stack),
            "options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.options).items()},
        }

    def case(self, layout: Layout) -> Case:
        return Case(self.model, self.gpu, self.workload, layout, self.stack)

    def describe(self) -> str:
        return f"{self.model.display_name} on {self.world_size} x {self.gpu.display_name}"


def default_study_name(model: ModelSpec, gpu: GpuSpec, world_size: int) -> str:
    return f"{model.name}-{gpu.name}-x{world_size}"


def storage_url(value: str | None) -> str:
    if not value:
        return DEFAULT_STORAGE
    return value if "://" in value else f"sqlite:///{value}"


def open_storage(url: str, create_dirs: bool = False) -> optuna.storages.BaseStorage:
    """Open a storage without writing to anything that is not already an Optuna storage."""
    if url.startswith("sqlite:///"):
        try:
            _check_sqlite_file(url, Path(url[len("sqlite:///"):]), create_dirs)
        except OSError as e:  # an unreadable file, a folder that cannot be made
            raise StudyError(str(e)) from None
    try:
        return optuna.storages.RDBStorage(url, skip_compatibility_check=False)
    except Exception as e:  # SQLAlchemy and Optuna raise many types; the user needs one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StudyError(f"cannot open study storage {url}: {first}") from None


def _check_sqlite_file(url: str, path: Path, create_dirs: bool) -> None:
    """An existing file must be an SQLite database; a new one needs its folder (made only when asked)."""
    if path.exists():
        if path.is_dir():
            raise StudyError(f"study storage {url}: {path} is a directory, not an SQLite file")
        with path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
        if head and head != SQLITE_MAGIC:
            raise StudyError(f"study storage {url}: {path} is not an SQLite database (corrupt or another file)")
    elif not path.parent.exists():
        if create_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        else:
            raise StudyError(f"study storage {url}: folder {path.parent} does not exist")


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        known = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        raise StudyError(f"no study named '{name}' in this storage; studies there: {', '.join(known) or 'none'}") \
            from None


def load_or_create(storage: optuna.storages.BaseStorage, name: str, config: StudyConfig) -> optuna.Study:
    identity = config.identity()
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        study.set_user_attr("config", identity)
        return study
    existing = study.user_attrs.get("config")
    if existing != identity:
        was = f"{existing['model']} on {existing['gpus']} x {existing['gpu']}" if existing else "something else"
        raise StudyError(f"study '{name}' was created for {was} with other settings; "
                         f"pass another --study to tune {config.describe()}")
    return study


INTERRUPTED = "interrupted: the tuner stopped while this trial ran"


def history_of(study: optuna.Study, skip_interrupted: bool = False, backend: str | None = None) -> History:
    """What the study has tried with this backend (a layout predicted earlier can still be measured).
    Failed trials may be proposed again, except interrupted ones when `skip_interrupted`."""
    h = History()
    for t in study.get_trials(deepcopy=False):
        key = t.user_attrs.get("layout_key")
        if backend is not None and t.user_attrs.get("backend", "predict") != backend:
            key = None
        if key and t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            h.tried.add(key)
        if key and skip_interrupted and t.state == TrialState.FAIL and \
                str(t.user_attrs.get("fail_reason", "")).startswith("interrupted"):
            h.tried.add(key)
        result = t.user_attrs.get("result") or {}
        if t.state == TrialState.COMPLETE and result.get("kind") == "measured":
            layout = layout_from_stored(t.user_attrs["layout"])
            predicted = (t.user_attrs.get("prediction") or {}).get("tokens_per_s_per_gpu")
            # A runner that ran a different model (truncated layers) reports the prediction for what it ran.
            facts = TrialResult.from_dict(result).details
            if (facts.get("prediction_for_model_run") or {}).get("tokens_per_s_per_gpu"):
                predicted = facts["prediction_for_model_run"]["tokens_per_s_per_gpu"]
            h.measured.append((family(layout), result["tokens_per_s_per_gpu"], predicted))
    best = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    h.best_value = max(best) if best else None
    return h


@dataclass
class RunSummary:
    completed: int = 0
    pruned: int = 0
    failed: int = 0
    exhausted: bool = False


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Mark FAILED the trials left RUNNING by a tuner of this host that no longer runs (killed).

    Trials owned by a live process, or by another host, are left alone: another tuner may be
    running them. Returns the numbers of the trials marked.
    """
    marked = []
    here = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner") or {}
        if owner.get("host") == here and not _alive(int(owner.get("pid", -1))):
            study._storage.set_trial_user_attr(t._trial_id, "fail_reason", INTERRUPTED)
            study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            marked.append(t.number)
    return marked


def run_study(study: optuna.Study, config: StudyConfig, runner: TrialRunner, proposer: Proposer,
              trials: int, progress: bool = True, skip_interrupted: bool = False) -> RunSummary:
    dists = distributions(config.model, config.world_size, config.options)
    summary = RunSummary()
    bar = _progress(trials, progress)
    if proposer.sampler() is not None:
        study.sampler = proposer.sampler()
    try:
        for _ in range(trials):
            history = history_of(study, skip_interrupted, runner.name)
            proposal = proposer.propose(history)
            if proposal is None:
                summary.exhausted = True
                break
            if proposal.params is not None:
                study.enqueue_trial(proposal.params)
            trial = study.ask(dists)
            trial.set_user_attr("owner", _owner())
            trial.set_user_attr("backend", runner.name)
            trial.set_user_attr("proposer", proposer.name)
            trial.set_user_attr("rationale", proposal.rationale)
            try:
                state = _evaluate(study, trial, config, runner, history)
            except KeyboardInterrupt:
                trial.set_user_attr("fail_reason", "interrupted by the user")
                study.tell(trial, state=TrialState.FAIL)
                raise
            except RunnerError as e:  # the runner cannot run trials at all: record it, then stop
                trial.set_user_attr("fail_reason", f"runner: {e}")
                study.tell(trial, state=TrialState.FAIL)
                raise
            if state == TrialState.COMPLETE:
                summary.completed += 1
            elif state == TrialState.PRUNED:
                summary.pruned += 1
            else:
                summary.failed += 1
            bar.update(1)
            best = history.best_value
            latest = study.trials[-1].value if state == TrialState.COMPLETE else None
            if latest is not None and (best is None or latest > best):
                best = latest
            if best is not None:
                bar.set_postfix_str(f"best {best:,.0f} tokens/s/GPU")
    finally:
        bar.close()
    return summary


def _evaluate(study: optuna.Study, trial: optuna.Trial, config: StudyConfig, runner: TrialRunner,
              history: History) -> TrialState:
    def prune(reason: str) -> TrialState:
        trial.set_user_attr("prune_reason", reason)
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED

    try:
        layout = from_optuna_params(trial.params, config.world_size, config.workload.seq_len)
        check(layout, config.model, config.workload, config.stack)
    except InvalidLayout as e:
        return prune(str(e))
    trial.set_user_attr("layout", {"world_size": layout.world_size, **layout_values(layout)})
    trial.set_user_attr("layout_key", layout.key())
    trial.set_user_attr("label", layout.long_label)
    if layout.key() in history.tried:
        return prune("already evaluated in this study")
    prediction = predict(config.model, config.gpu, config.workload, layout, profile=config.profile)
    trial.set_user_attr("prediction", _jsonable(prediction.to_dict()))
    if not prediction.fits:
        return prune("predicted not to fit: " + "; ".join(prediction.reasons))
    result = runner.run(TrialSpec(config.case(layout), steps=config.steps, window=config.window))
    trial.set_user_attr("result", result.to_dict())
    if result.status == "ok":
        study.tell(trial, result.tokens_per_s_per_gpu)
        return TrialState.COMPLETE
    trial.set_user_attr("fail_reason", f"{result.failure_class}: {result.detail}")
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


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
