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

import json
import os
import socket
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from cost_model.case import Case
from cost_model.hardware import GpuSpec
from cost_model.model_spec import ModelSpec
from cost_model.profile import HardwareProfile
from cost_model.workload import Workload
from experiments.runner import PERMANENT_FAILURES, RunnerError, TrialResult, TrialRunner, TrialSpec
from search_space.enumerate import NARROWING_FIELDS, SpaceOptions
from search_space.runner_space import RunnerSpace, narrow
from cost_model.layout import InvalidLayout, Layout
from search_space.rules import check
from cost_model.stack import Stack
from tuner.intervals import interval_dict
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
        defaults = asdict(SpaceOptions())
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.options).items()
                   if k not in NARROWING_FIELDS or v != defaults[k]}  # as studies made before those fields
        return {
            "model": self.model.name, "gpu": self.gpu.name, "gpus": self.world_size,
            "workload": asdict(self.workload), "stack": asdict(self.stack), "options": options,
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
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        with warnings.catch_warnings():  # experimental since Optuna 3.2; optuna-dashboard names the axis by it
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC])
        study.set_user_attr("config", identity)
        if figures:
            study.set_user_attr(FIGURES, figures)
        return study
    existing = study.user_attrs.get("config")
    if existing != identity:
        was = f"{existing['model']} on {existing['gpus']} x {existing['gpu']}" if existing else "something else"
        raise StudyError(f"study '{name}' was created for {was} with other settings; "
                         f"pass another --study to tune {config.describe()}")
    if figures:
        check_figures(study, figures)
    return study


def check_figures(study: optuna.Study, figures: str) -> None:
    """Refuse to add `figures` ("predicted" or "measured") trials to a study holding the other kind: its
    best trial would mix a prediction with measurements. Studies made before the kind was recorded are
    judged by their completed trials."""
    kinds = {study.user_attrs.get(FIGURES)} - {None}
    kinds |= {(t.user_attrs.get("result") or {}).get("kind", "predicted")
              for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
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
        if key and t.state == TrialState.FAIL and result.get("failure_class"):
            peak = (t.user_attrs.get("prediction") or {}).get("peak_memory_gib")
            h.failed.append((key, result["failure_class"], peak))
            if result["failure_class"] in PERMANENT_FAILURES:
                h.tried.add(key)
        if t.state == TrialState.COMPLETE and result.get("kind") == "measured":
            layout = layout_from_stored(t.user_attrs["layout"])
            predicted = (t.user_attrs.get("prediction") or {}).get("tokens_per_s_per_gpu")
            # A runner that ran a different model (truncated layers) reports the prediction for what it ran.
            facts = TrialResult.from_dict(result).details
            if (facts.get("prediction_for_model_run") or {}).get("tokens_per_s_per_gpu"):
                predicted = facts["prediction_for_model_run"]["tokens_per_s_per_gpu"]
            h.measured.append((family(layout), result["tokens_per_s_per_gpu"], predicted))
            h.measured_layouts.append((layout, result["tokens_per_s_per_gpu"]))
    best = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    h.best_value = max(best) if best else None
    return h


@dataclass
class RunSummary:
    completed: int = 0
    pruned: int = 0
    failed: int = 0
    exhausted: bool = False
    reason: str = ""          # why the loop stopped before its trials (proposer's stop rule, GPU-hour budget)


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


def runner_space(config: StudyConfig, runner: TrialRunner) -> RunnerSpace:
    """The study's space narrowed to what `runner` can run (StudyError when it cannot run the model)."""
    try:
        run = runner.model_run(config.model)
    except ValueError as e:
        raise StudyError(f"the {runner.name} runner cannot run {config.model.display_name}: {e}") from None
    return narrow(config.options, config.model, config.world_size, runner.stack, runner.name, run)


def gpu_hours_used(study: optuna.Study, backend: str) -> float:
    """GPU-hours of the study's trials run by `backend` (measured results carry theirs)."""
    return sum(float((t.user_attrs.get("result") or {}).get("gpu_hours") or 0.0)
               for t in study.get_trials(deepcopy=False) if t.user_attrs.get("backend") == backend)


def run_study(study: optuna.Study, config: StudyConfig, runner: TrialRunner, proposer: Proposer,
              trials: int, progress: bool = True, skip_interrupted: bool = False,
              gpu_hours: float | None = None) -> RunSummary:
    """Run `trials` trials proposed by `proposer` through `runner`. The Optuna distributions are the
    study's whole space (they must not change within a study); layouts the runner cannot run are pruned."""
    dists = distributions(config.model, config.world_size, config.options)
    space = runner_space(config, runner)
    check_figures(study, runner.figures)
    if study.user_attrs.get(FIGURES) is None:
        study.set_user_attr(FIGURES, runner.figures)
    summary = RunSummary()
    bar = _progress(trials, progress)
    if proposer.sampler() is not None:
        study.sampler = proposer.sampler()
    try:
        for _ in range(trials):
            if gpu_hours is not None and gpu_hours_used(study, runner.name) >= gpu_hours:
                summary.exhausted = True
                summary.reason = f"stopped: the trials have used the --gpu-hours budget ({gpu_hours:g})"
                break
            history = history_of(study, skip_interrupted, runner.name)
            proposal = proposer.propose(history)
            if proposal is None:
                summary.exhausted = True
                summary.reason = getattr(proposer, "stop_reason", None) or "every distinct fitting layout has been tried"
                break
            if proposal.params is not None:
                study.enqueue_trial(proposal.params)
            trial = study.ask(dists)
            trial.set_user_attr("owner", _owner())
            trial.set_user_attr("backend", runner.name)
            trial.set_user_attr("proposer", proposer.name)
            trial.set_user_attr("rationale", proposal.rationale)
            for key, value in proposal.attrs.items():
                trial.set_user_attr(key, _jsonable(value))
            _say(bar, f"trial {trial.number}: {proposal.rationale}")
            try:
                state = _evaluate(study, trial, config, runner, history, space,
                                  learn=lambda t, layout, r: _learn(study, t, proposer, layout, r,
                                                                    history_of(study, skip_interrupted, runner.name)))
            except KeyboardInterrupt:
                trial.set_user_attr("fail_reason", "interrupted by the user")
                study.tell(trial, state=TrialState.FAIL)
                raise
            except RunnerError as e:  # the runner cannot run trials at all: record it, then stop
                trial.set_user_attr("fail_reason", f"runner: {e}")
                study.tell(trial, state=TrialState.FAIL)
                raise
            _say(bar, "  -> " + _outcome(study, trial))
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


def _learn(study: optuna.Study, trial: optuna.Trial, proposer: Proposer, layout, result: TrialResult,
           history: History) -> None:
    """What the trial's result taught the proposer, on the trial before it ends (and the weights on the study)."""
    if result.status == "ok" and result.kind == "measured":
        history.measured_layouts.append((layout, result.tokens_per_s_per_gpu))
    elif result.status != "ok":
        peak = (trial.user_attrs.get("prediction") or {}).get("peak_memory_gib")
        history.failed.append((layout.key(), result.failure_class, peak))
    history.tried.add(layout.key())
    taught = proposer.after_trial(history)
    for key, value in taught.items():
        trial.set_user_attr(key, _jsonable(value))
    if "hypothesis_weights_after" in taught:
        study.set_user_attr("hypothesis_weights", _jsonable(taught["hypothesis_weights_after"]))


def _outcome(study: optuna.Study, trial: optuna.Trial) -> str:
    """The ended trial in a few words: its figure, or why it was pruned or failed; what it taught."""
    frozen = study._storage.get_trial(trial._trial_id)
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
              history: History, space: RunnerSpace | None = None, learn=None) -> TrialState:
    """Prune what cannot or need not run; else run it. Only a runner's own result becomes the value."""
    def prune(reason: str) -> TrialState:
        trial.set_user_attr("prune_reason", reason)
        _flat_attrs(trial, trial.user_attrs.get("prediction"), None)
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
    refusal = space.refusal(layout) if space is not None else None
    if refusal:
        return prune(f"the {runner.name} runner cannot run it: {refusal}")
    try:  # what is ranked is what the runner runs (its model run, its stack)
        prediction = runner.predict(config.case(layout), config.profile)
    except InvalidLayout as e:
        return prune(f"the {runner.name} runner cannot run it: {e}")
    predicted = prediction.to_dict()
    predicted["interval"] = interval_dict(config, runner, layout, prediction)
    trial.set_user_attr("prediction", _jsonable(predicted))
    if not prediction.fits:
        return prune("predicted not to fit: " + "; ".join(prediction.reasons))
    result = runner.run(TrialSpec(config.case(layout), steps=config.steps, window=config.window))
    trial.set_user_attr("result", result.to_dict())
    _flat_attrs(trial, trial.user_attrs["prediction"], trial.user_attrs["result"])
    if learn is not None:
        learn(trial, layout, result)
    if result.status == "ok":
        study.tell(trial, result.tokens_per_s_per_gpu)
        return TrialState.COMPLETE
    trial.set_user_attr("fail_reason", f"{result.failure_class}: {result.detail}")
    study.tell(trial, state=TrialState.FAIL)
    return TrialState.FAIL


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


FLAT_FIGURES = ("peak_memory_gib", "mfu", "usd_per_million_tokens")


def _flat_attrs(trial: optuna.Trial, prediction: dict | None, result: dict | None) -> None:
    """Flat attributes optuna-dashboard shows as columns: the figures (from the result when the trial ran,
    else from its prediction), the prediction and its interval, and which kind of figures they are."""
    prediction = prediction or {}
    figures = result or prediction
    if not figures:
        return
    flat = {k: figures.get(k) for k in FLAT_FIGURES}
    flat["predicted_tokens_per_s_per_gpu"] = prediction.get("tokens_per_s_per_gpu")
    interval = prediction.get("interval")
    if isinstance(interval, dict):
        flat.update(predicted_low=interval.get("low"), predicted_high=interval.get("high"))
    for k, v in flat.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            trial.set_user_attr(k, float(v))
    trial.set_user_attr("figures", figures.get("kind", "predicted"))


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
