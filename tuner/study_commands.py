"""The study commands: `tune` (run the study loop), `tune show` and `tune export`."""
from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from cost_model.memory_fit import percent
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import layout_from_values, parse_pairs, to_optuna_params
from cost_model.nouns.model_spec import ModelError, catalog_names, load_model
from cost_model.nouns.names import printable
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from experiments.runner import TrialRunner
from search_space.enumerate import SpaceOptions, enumerate_layouts, workload_options
from search_space.runner_space import RunnerSpace
from tuner.backends import make_runner, measured_window
from tuner.space_cache import SpaceCache
from tuner.space_scoring import PARTIAL_OFFLOADS, NoFitError, ScoredSpace, distinct_runs, score_space
from tuner.export import distinct_top, export_rows
from tuner.gc_pause import kept_work
from tuner.options import CliError, check_output_folder, check_profile_gpu, flags_set, profile, target, workload
from tuner.progress import Counter, Progress
from tuner.proposer import Candidate, SamplerProposer
from tuner.report import (counts_line, format_table, offload_note, per_step_note, ranked_rows, recorded_precision,
                          trials_csv, trials_json)
from tuner.model_identity import as_recorded_name, check_model_identity
from tuner.sqlite_file import check_storage
from tuner.study import (StudyConfig, shown, precheck_study, default_study_name, history_of, load_or_create, load_study,
                         open_storage, recorded_offload_fractions, recover_interrupted, run_study, runner_space,
                         storage_errors, storage_url, study_names)

def cmd_run(args) -> int:
    if args.trials < 1:
        raise CliError(f"--trials must be at least 1, got {args.trials}")
    if args.study is not None and not args.study.strip():
        raise CliError("--study must name a study, got an empty name")
    storage_url(args.storage)   # a storage that could not keep the study is refused before any work
    model, gpu, gpus = target(args)
    trained = workload(args)
    searched = {"offload_fractions": args.offload_fractions} if args.offload_fractions else {}
    config = StudyConfig(model, gpu, gpus, trained, Stack.with_fixes(args.stack_fix),
                         workload_options(SpaceOptions(**searched), trained), profile(args), steps=args.steps,
                         window=measured_window(args.steps))
    check_profile_gpu(config.profile, gpu)
    runner = make_runner(args, config.profile)  # an unreachable cluster fails here, before the study is touched
    space = runner_space(config, runner)         # what this runner's stack can run
    if runner.truncates_layers and runner.layers is None:
        # one layer count for the whole study (layouts are only comparable on one model run)
        runner.layers, how = study_layers(config, runner, space)
        args.layers = runner.layers
        print(f"--layers auto: {how}", file=sys.stderr)
    # measured and predicted figures never share a study: a measuring backend gets a study of its own
    # (and one per --layers: a truncated model run is another model)
    layers = getattr(args, "layers", None)
    name = args.study or default_study_name(model, gpu, gpus) + (
        "" if runner.figures == "predicted" else f"-{args.backend}" + (f"-L{layers}" if layers else ""))
    url = storage_url(args.storage)
    # a storage it cannot use fails before the scoring; a new SQLite file is made only after it
    check_storage(url, allow_new_folder=args.storage is None)
    if args.top > 0:   # the recipes' folder: a bad --out fails now, not after the trials ran
        check_output_folder(args.out)
    new_file = url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists()
    storage = None if new_file else open_storage(url)
    if storage is not None and not args.offload_fractions:
        with storage_errors(url):   # a study whose search was widened resumes with its fractions
            recorded = recorded_offload_fractions(storage, name)
        if recorded and recorded != config.options.offload_fractions and config.options.offload_fractions != (0.0,):
            config = _with_fractions(config, recorded)
            space = runner_space(config, runner)
            print(f"  search space: optimizer offload fractions {_listed(recorded)}, as study '{name}' recorded",
                  file=sys.stderr)
    progress = Progress(json_out=getattr(args, "json", False), quiet=getattr(args, "no_progress", False))
    config, space, candidates, cache = _scored_widened(args, config, runner, space, (url, storage, name), progress)
    candidates, settled = runnable_by_prediction(candidates, config, runner)
    candidates, same_runs = distinct_runs(candidates, config.workload)
    reference = parse_reference(args.reference, config, space) if args.reference else None
    storage = storage or open_storage(url, create_dirs=args.storage is None)
    with storage_errors(url):
        study = load_or_create(storage, name, config, runner.figures)
        _record_model_path(study, args.model)
        return _run(args, _Tune(config, runner, space, candidates, reference, name, url, study, cache, settled,
                                same_runs), progress)


def _scored_widened(args, config: StudyConfig, runner: TrialRunner, space: RunnerSpace, where: tuple,
                    progress: Progress) -> tuple:
    """(config, space, candidates, cache): the scored space, its offload fractions widened by PARTIAL_OFFLOADS
    where the default ones leave no plain fit (none may fit, or only borderline layouts do) and a fraction between
    fits; --offload-fractions given is searched as given."""
    try:
        candidates, cache = _scored(args, config, runner, space, *where, progress)
    except NoFitError as e:
        if e.partial is None or args.offload_fractions or e.partial in config.options.offload_fractions:
            raise
        config = _with_fractions(config, config.options.offload_fractions + PARTIAL_OFFLOADS)
        space = runner_space(config, runner)
        print(f"  search space widened: no layout fits with optimizer offload "
              f"{_listed(SpaceOptions().offload_fractions)}, but {e.partial:g} is predicted to fit: the search also "
              f"tries {_listed(sorted(PARTIAL_OFFLOADS))}", file=sys.stderr)
        return (config, space, *_scored(args, config, runner, space, *where, progress))
    fractions = config.options.offload_fractions
    storage, name = where[1], where[2]
    with storage_errors(where[0]):   # a study that exists keeps the fractions it was tuned with
        exists = storage is not None and recorded_offload_fractions(storage, name) is not None
    if args.offload_fractions or set(PARTIAL_OFFLOADS) <= set(fractions) or fractions == (0.0,) or exists \
            or any(p.fits for _, p in candidates):
        return config, space, candidates, cache
    wider = _with_fractions(config, fractions + PARTIAL_OFFLOADS)
    wider_space = runner_space(wider, runner)
    more, more_cache = _scored(args, wider, runner, wider_space, *where, progress)
    if not any(p.fits for _, p in more):
        return config, space, candidates, cache
    print(f"  search space widened: with optimizer offload {_listed(fractions)} only borderline layouts may fit; "
          f"the search also tries {_listed(sorted(PARTIAL_OFFLOADS))}, where some fit", file=sys.stderr)
    return wider, wider_space, more, more_cache


def _listed(fractions) -> str:
    return ", ".join(f"{f:g}" for f in fractions)


def _with_fractions(config: StudyConfig, fractions: tuple[float, ...] | None) -> StudyConfig:
    if not fractions:
        return config
    return replace(config, options=replace(config.options, offload_fractions=tuple(sorted(set(fractions)))))


def _scored(args, config: StudyConfig, runner: TrialRunner, space: RunnerSpace, url: str, storage, name: str,
            progress: Progress) -> tuple[list, SpaceCache | None]:
    """The study's scored space (from its cache where the same inputs scored it before) and that cache."""
    if storage is not None:
        with storage_errors(url):
            precheck_study(storage, name, config, runner.figures)
    cache = SpaceCache.for_study(url, config, runner, space)
    candidates = cache.load() if cache is not None and storage is not None else None
    if candidates is None:
        with progress.step(f"scoring the search space of {config.describe()} ..."):
            # with the predict backend, --ray-address names a Ray cluster to score on (slime's is its Jobs API)
            candidates = score_space(config, runner, space, progress=progress,
                                     ray_address=args.ray_address if args.backend == "predict" else None)
    else:
        print(f"the scored search space of {config.describe()}: read from the study's cache ({shown(str(cache.path))}; "
              f"the same inputs and code)", file=sys.stderr)
    return candidates, cache


@dataclass(frozen=True)
class _Tune:
    """What `tune` has ready when its study loop starts: the scored space of the runner and the study (named `name`,
    kept at `url`; the space's cache beside it)."""
    config: StudyConfig
    runner: TrialRunner
    space: RunnerSpace
    candidates: list
    reference: Layout | None
    name: str
    url: str
    study: object
    cache: SpaceCache | None = None
    settled: int = 0   # borderline layouts left out as the predict backend's certain failures (runnable_by_prediction)
    same_runs: int = 0   # layouts left out that slime runs as an earlier one (space_scoring.distinct_runs)


def runnable_by_prediction(candidates, config, runner: TrialRunner) -> tuple[list, int]:
    """(the candidates a trial can complete, how many were left out). A runner whose trial is the cost model's own
    verdict (the predict backend) fails every borderline layout over the usable memory by its point prediction, for
    certain: such a trial teaches nothing and costs one of --trials, so none is proposed. A measuring backend tries
    them where the agent weighs the risk worth it. CliError, before any study is touched, when that leaves none."""
    if runner.figures != "predicted":
        return candidates, 0
    kept = [(layout, p) for layout, p in candidates if p.under_limit]
    if len(kept) == len(candidates):
        return candidates, 0
    if not kept:
        layout, p = max(candidates, key=lambda c: (c[1].fit_probability, -c[1].peak_memory_gib))
        raise CliError(f"no layout of {config.model.display_name} is predicted to fit on {config.world_size} x "
                       f"{config.gpu.display_name}: the {len(candidates):,} that may (borderline) are all predicted "
                       f"over the limit, the nearest {layout.long_label} at {p.peak_memory_gib:.1f} of "
                       f"{p.gpu_memory_gib:.1f} GiB (P(fits) {percent(p.fit_probability)}); the predict backend's trial of "
                       f"one fails for certain, a measured run settles it (--backend megatron|slime), or give more "
                       f"GPUs (--gpus)")
    return ScoredSpace(kept, getattr(candidates, "pruned", None)), len(candidates) - len(kept)


def _run(args, tune: _Tune, progress: Progress | None = None) -> int:
    """The study loop and its report. Exit 0 when the study holds a completed trial, 1 when none of its trials
    completed (nothing to rank or export: said in one line)."""
    config, runner, candidates, study = tune.config, tune.runner, tune.candidates, tune.study
    known = None if tune.cache is None else len(tune.cache.hypothesis_values)
    proposer = make_proposer(args.proposer, candidates, config, runner, getattr(args, "stop_margin", 0.03), tune.cache,
                             progress)
    if tune.cache is not None and (known == 0 or len(tune.cache.hypothesis_values) != known):
        # scored now, or the agent predicted more: a resume reads it back
        with progress.step(f"saving the {len(candidates):,} scored layouts to the study's cache ...") \
                if progress is not None else nullcontext():
            tune.cache.save(candidates)
    _say_plan(args, tune, proposer)
    interrupted = recover_interrupted(study)
    if interrupted:
        what = "skipped" if args.on_interrupted == "skip" else "retried when proposed again"
        print(f"trials {', '.join(map(str, interrupted))} were interrupted (the tuner stopped while they ran): "
              f"marked failed, their layouts {what}", file=sys.stderr)
    summary = run_study(study, config, runner, proposer, args.trials, progress=not args.no_progress,
                        skip_interrupted=args.on_interrupted == "skip", gpu_hours=args.gpu_hours)
    if summary.exhausted:
        print(summary.reason, file=sys.stderr)
    return _report(args, tune)


def _say_plan(args, tune: _Tune, proposer) -> None:
    """What the study loop is about to search, on stderr: the space, the study, the backend, the notes."""
    config, space, candidates = tune.config, tune.space, tune.candidates
    kind = "predicted by the cost model" if args.backend == "predict" else f"measured by the {args.backend} runner"
    borderline = sum(p.borderline for _, p in candidates)
    how = ("the agent weighs them by their chance to fit" if proposer.weighs_fit_risk
           else "left out: the sampler does not weigh the risk")
    also = f" and {borderline:,} borderline ones (they may not fit; {how})" if borderline else ""
    if tune.settled:
        also += (f"; {tune.settled:,} more borderline ones predicted over the limit are left out (the predict "
                 f"backend's trial of one fails for certain; a measured run settles them)")
    if tune.same_runs:
        also += (f"; {tune.same_runs:,} more left out: slime's schedule runs them as a layout with a smaller "
                 f"max_tokens_per_gpu (the same micro-batches)")
    print(f"tuning {config.describe()}: {len(candidates) - borderline:,} fitting layouts of the search space{also}; "
          f"study '{tune.name}' in {shown(tune.url)}; backend {args.backend} (figures are {kind})", file=sys.stderr)
    pruned = getattr(candidates, "pruned", None)
    if pruned is not None:
        print(f"  search space pruned: {pruned.line()}", file=sys.stderr)
    for line in space.reasons:
        print(f"  search space narrowed: {line}", file=sys.stderr)
    for line in space.notes + small_batch_notes(config):
        print(f"  note: {line}", file=sys.stderr)
    unused = measured_only_flags(args)
    if unused:
        print(f"  note: {', '.join(unused)} only apply to measured runs; the {args.backend} backend ignores them",
              file=sys.stderr)
    unused = [f for f in agent_only_flags(args) if f not in unused]
    if unused:
        print(f"  note: {', '.join(unused)} only stops the agent proposer; --proposer {args.proposer} ignores it",
              file=sys.stderr)


def _report(args, tune: _Tune) -> int:
    """The ranked table, its notes, the convergence arm and the recipes; 1 when no trial of the study completed."""
    config, runner, study = tune.config, tune.runner, tune.study
    rows = ranked_rows(study)
    as_json = getattr(args, "json", False)
    out = sys.stderr if as_json else sys.stdout   # with --json, stdout holds the JSON object alone
    print(counts_line(study), file=out)
    print(format_table(rows, limit=10, precision=config.workload.precision), file=out)
    note = rows and per_step_note(rows[0].breakdown, config.workload.global_batch, config.workload.seq_len,
                                  config.world_size)
    if note:
        print(f"note: {note}", file=out)
    note = rows and offload_note(rows[0], own_profile=config.profile is not None)
    if note:
        print(f"note: {note}", file=out)
    verify_top = args.verify_top if args.verify_top is not None else (0 if args.backend == "predict" else 3)
    if verify_top > 0 and args.backend != "predict":
        failed = history_of(study, backend=runner.name).failed
        _verify(study, config, runner, verify_top, tune.reference or default_reference_of(tune.candidates,
                                                                                         config.world_size, failed))
        rows = ranked_rows(study)
    paths = export_rows(distinct_top(rows, args.top), config, Path(args.out), study) if rows and args.top > 0 else []
    if paths:
        print("recipes (status in brackets):", file=out)
        for path in paths:
            print(f"  {path} ({recipe_status(path)})", file=out)
    if as_json:
        best = json.loads(trials_json(study, limit=10, best_first=True))   # the table's ten best, in its order
        print(json.dumps({"study": tune.name, "storage": shown(tune.url), "backend": args.backend,
                          "figures": runner.figures, "trials": best, "recipes": [str(p) for p in paths]}, indent=1))
    nothing = none_completed(study)
    if nothing:   # last, so a script sees why it exits 1
        print(f"tune: {nothing}", file=sys.stderr)
        return 1
    return 0


def recipe_status(path: Path) -> str:
    """The status a written recipe records (its line `status: ...`)."""
    for line in path.read_text().splitlines():
        if line.startswith("status:"):
            return line.split(":", 1)[1].strip()
    return "status not recorded"


def none_completed(study) -> str | None:
    """One line when no trial of the study has completed (nothing to rank or export), naming the last ended trial's
    reason; None when one has."""
    from optuna.trial import TrialState

    from tuner.trial_record import read_trials

    records = read_trials(study)
    if any(r.state == TrialState.COMPLETE for r in records):
        return None
    ended = [r for r in records if r.state in (TrialState.FAIL, TrialState.PRUNED)]
    last = (f"; the last, trial {ended[-1].number}: {printable(ended[-1].reason[:200])}"
            if ended and ended[-1].reason else "")
    return (f"no trial of study '{printable(study.study_name)}' has completed ({len(records)} trials, "
            f"{len(ended)} failed or pruned{last}): nothing to rank or export")


MEASURED_ONLY = ("steps", "layers", "rows", "hang_timeout", "verify_top", "reference", "gpu_hours", "stop_margin")

def small_batch_notes(config) -> tuple[str, ...]:
    """A line when the global batch has fewer rows than there are GPUs: every layout then runs a step of a few
    hundred tokens per GPU, mostly pipeline fill and communication, and the figures say little about a real run."""
    work, gpus = config.workload, config.world_size
    if work.global_batch >= gpus:
        return ()
    return (f"the global batch ({work.global_batch:,} rows of {work.seq_len:,} tokens) has fewer rows than the "
            f"{gpus:,} GPUs: each GPU gets {work.global_batch * work.seq_len / gpus:,.0f} tokens a step; a run at this "
            f"scale takes a larger --global-batch",)


def measured_only_flags(args) -> list[str]:
    """The flags given that only a measuring backend uses, when the backend predicts."""
    return flags_set(args, MEASURED_ONLY, "run") if args.backend == "predict" else []


def agent_only_flags(args) -> list[str]:
    """The flags given that only the agent proposer reads (its stopping rule), when another proposes."""
    return flags_set(args, ("stop_margin",), "run") if getattr(args, "proposer", "agent") != "agent" else []

def make_proposer(kind: str, candidates, config, runner, stop_margin: float | None = 0.03, cache=None,
                  progress: Progress | None = None):
    """The --proposer: the agent over the cost model's hypotheses, or one of Optuna's samplers; `progress`: where
    the agent's weighing of a large space (minutes for hundreds of GPUs) reports."""
    if kind != "agent":
        try:
            # a sampler does not weigh the risk of a borderline layout: it draws from the plain fits
            return SamplerProposer(kind, candidates=proposer_candidates([(l, p) for l, p in candidates if p.fits]),
                                   to_params=to_optuna_params)
        except ImportError as e:
            raise CliError(str(e)) from None
    from tuner.agent import AgentPrior, AgentProposer
    from tuner.intervals import agent_prior, candidate_extra_sd, hypothesis_predictor

    hypotheses, predict_h = hypothesis_predictor(config, runner)
    if cache is not None:
        predict_h = cache.memo(predict_h)
    level_sd, family_sd, sigma = agent_prior(config, runner)
    prior = AgentPrior(sigma=sigma, level_sd=level_sd, family_sd=family_sd)
    if progress is None:
        with kept_work():
            return AgentProposer(proposer_candidates(candidates), to_optuna_params, hypotheses, predict_h, prior,
                                 stop_margin=stop_margin, extra_sd=candidate_extra_sd(config, runner))
    counter, weighing = Counter(progress, "predictions under the hypotheses"), [True]

    def counted(h, layout):   # counts only while the agent builds its table: a trial's lookups say nothing
        if weighing:
            counter.add()
        return predict_h(h, layout)

    with progress.step(f"weighing {len(candidates):,} layouts under {len(hypotheses)} hypotheses ..."), kept_work():
        agent = AgentProposer(proposer_candidates(candidates), to_optuna_params, hypotheses, counted, prior,
                              stop_margin=stop_margin, extra_sd=candidate_extra_sd(config, runner))
    weighing.clear()
    return agent

def _verify(study, config, runner, top: int, reference: Layout) -> None:
    """The convergence arm for the `top` fastest measured layouts, one line per verdict."""
    from tuner.verify import verify_top

    print(f"convergence arm: reference {reference.long_label}", file=sys.stderr)
    for v in verify_top(study, config, runner, top, reference):
        print(f"  trial {v['trial']} {v['layout']}: convergence {v['result']} "
              f"(correlation {v['correlation']}, final loss difference {v['final_loss_difference']}, "
              f"pointwise failures {v['pointwise_failures']})")

def default_reference_of(scored, gpus: int, failed=()) -> Layout:
    """The convergence arm's default reference among `scored` (score_space's candidates: layouts the
    runner can run), leaving out layouts that failed permanently in the study (History.failed)."""
    from experiments.runner import PERMANENT_FAILURES
    from tuner.verify import default_reference

    exclude = {key for key, failure, _ in failed if failure in PERMANENT_FAILURES}
    try:
        return default_reference(proposer_candidates(scored), gpus, exclude)
    except ValueError as e:
        raise CliError(f"{e}; pass --reference") from None

def proposer_candidates(scored) -> list[Candidate]:
    return [Candidate(l, p) for l, p in scored]

def parse_reference(pairs: list[str], config, space: RunnerSpace | None = None) -> Layout:
    from search_space.rules import check

    layout = layout_from_values(parse_pairs(pairs), config.world_size, config.workload.seq_len)
    check(layout, config.model, config.workload, config.stack)
    refusal = space.refusal(layout) if space is not None else None
    if refusal:
        raise CliError(f"--reference {layout.label}: the runner cannot run it: {refusal}")
    return layout

def study_layers(config, runner, space: RunnerSpace | None = None) -> tuple[int, str]:
    """The most layers of the model for which some layout of the space is predicted to fit the local GPUs
    (the runner's model run for a study with --layers auto; a layout without recompute or offload where one fits),
    found by bisection over the layer count (memory grows with layers); CliError
    when not even one layer fits."""
    every = list(enumerate_layouts(config.model, config.world_size, config.workload, config.stack,
                                   space.options if space is not None else config.options))
    # plain layouts (no recompute, no offload): at that size their recompute and offload variants fit too,
    # so the study has alternatives to compare, not one layout at the edge
    plain = [l for l in every if not l.recompute_granularity and not l.optimizer_offload_fraction]
    total = config.model.num_hidden_layers
    layouts = plain

    def fitting(n: int):
        probe = _with_layers(runner, n)
        for layout in layouts:
            try:
                p = probe.predict(config.case(layout), config.profile)
            except (InvalidLayout, ValueError):
                continue
            if p.fits:
                return layout, p
        return None

    best = None
    for layouts in (plain, every):
        lo, hi = 1, total
        while lo <= hi:
            mid = (lo + hi) // 2
            hit = fitting(mid)
            if hit is None:
                hi = mid - 1
            else:
                lo, best = mid + 1, (mid, hit)
        if best is not None:
            break
    if best is None:
        raise CliError(f"not even 1 layer of {config.model.display_name} is predicted to fit {config.world_size} x "
                       f"{config.gpu.display_name} on the {runner.name} runner")
    n, (layout, p) = best
    kind = "a layout without recompute or offload" if layouts is plain else "a layout"
    return n, (f"{n} of {total} layers, the most for which {kind} is predicted to fit (e.g. {layout.long_label}: "
               f"{p.peak_memory_gib:.1f} of {p.gpu_memory_gib:.1f} GiB); figures are for this {n}-layer model run")

def _with_layers(runner, n: int):
    """A copy of the runner whose model run has `n` layers (for prediction only)."""
    import copy

    twin = copy.copy(runner)
    twin.layers = n
    return twin

# ---------------------------------------------------------------- show / export

def open_existing(args):
    """The study --study names; without --study, the storage's only study (a storage of several names them)."""
    storage = open_storage(storage_url(args.storage), must_exist=True, writable=False)
    if not args.study:
        names = study_names(storage)
        if len(names) != 1:
            raise CliError(f"--study NAME is required: this storage holds {len(names)} studies"
                           + (f" ({', '.join(names)})" if names else ""))
        args.study = names[0]
    study = load_study(storage, args.study)
    if not study.user_attrs.get("config") and study.trials:
        raise CliError(f"study '{args.study}' was not created by tune (no configuration recorded)")
    return study

def cmd_show(args) -> int:
    study = open_existing(args)
    if args.json:
        if args.format not in ("table", "json"):
            raise CliError(f"--json and --format {args.format} ask for two formats: give one")
        args.format = "json"
    if args.format == "csv":
        print(trials_csv(study, limit=args.limit), end="")
    elif args.format == "json":
        print(trials_json(study, limit=args.limit))
    else:
        print(counts_line(study))
        print(format_table(ranked_rows(study), limit=args.limit, precision=recorded_precision(study)))
    return 0

# A study tuned on a config.json records the file's absolute path beside its identity (not in it: the same model
# read from another path is the same study), so that export finds the file again from any folder.
MODEL_PATH_ATTR = "model_path"


def _record_model_path(study, model_arg) -> None:
    """Records where a config.json model was read from (a catalog key records nothing)."""
    if model_arg is None or str(model_arg).strip().lower() in catalog_names():
        return
    path = str(Path(model_arg).expanduser().resolve())
    if study.user_attrs.get(MODEL_PATH_ATTR) != path:
        study.set_user_attr(MODEL_PATH_ATTR, path)


def _recorded_path(study) -> str | None:
    path = study.user_attrs.get(MODEL_PATH_ATTR)
    return path if isinstance(path, str) and Path(path).exists() else None


def _study_model(args, identity: dict, study) -> tuple:
    """(the model a study was tuned on, where it was taken from, for a message): --model when given, else its
    recorded name (a catalog model's key, or a config.json folder of that name here), else the config.json path it
    recorded (check_model_identity then refuses a file edited since)."""
    if getattr(args, "model", None):
        return as_recorded_name(load_model(args.model), identity["model"]), f"--model {str(args.model)[:80]}"
    name = identity["model"]
    try:
        model = load_model(name)
    except ModelError:
        path = _recorded_path(study)
        if path:
            try:
                return as_recorded_name(load_model(path), name), f"{path[:120]}, the file the study was tuned on"
            except ModelError as e:
                raise CliError(f"study '{args.study}' was tuned on a config.json model ({name}); the "
                               f"file it recorded does not load now ({e}): pass that file with --model PATH") from None
        if identity.get("architecture") and name not in catalog_names():
            raise CliError(f"study '{args.study}' was tuned on a config.json model ({name}) not found "
                           f"here: pass that file with --model PATH") from None
        raise
    return model, (f"the catalog's {name}" if name in catalog_names() else f"{str(name)[:80]}/config.json here")

def _check_stored_config(study: str, identity) -> None:
    """The stored study config export builds its run from: one line naming the field that a peer (a shared
    PostgreSQL study) or another program left malformed, instead of a traceback or a recipe of garbage."""
    def bad(field: str, want: str):
        return CliError(f"study '{study}': stored config field '{field}' is not {want}; re-create the study")
    if not isinstance(identity, dict):
        raise CliError(f"study '{study}': its stored config is not a mapping; re-create the study")
    gpus = identity.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise bad("gpus", "a positive integer")
    for field in ("workload", "stack"):
        if not isinstance(identity.get(field), dict):
            raise bad(field, "a mapping")
    price = identity.get("usd_per_gpu_hour")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))):
        raise bad("usd_per_gpu_hour", "a number")

def cmd_export(args) -> int:
    study = open_existing(args)
    identity = study.user_attrs.get("config")
    if not identity:
        raise CliError(f"study '{args.study}' was not created by tune (no configuration recorded)")
    _check_stored_config(args.study, identity)
    # the price the study was tuned at (recorded since issue 15; older studies used the catalog's)
    gpu = load_gpu(identity["gpu"]).with_price(identity.get("usd_per_gpu_hour"))
    model, source = _study_model(args, identity, study)
    check_model_identity(identity, model, args.study, source)
    try:
        config = StudyConfig(model, gpu, identity["gpus"], Workload(**identity["workload"]), Stack(**identity["stack"]))
    except TypeError as e:   # a key the nouns do not take: a peer's or another program's edit
        raise CliError(f"study '{args.study}': its stored config does not describe a run ({type(e).__name__}); "
                       f"re-create the study") from None
    rows = ranked_rows(study)
    if not rows:
        # as the tuning run that completed none: nothing is wrong with the input, there is just no result (exit 1)
        print(f"tune: study '{args.study}' has no completed trial to export", file=sys.stderr)
        return 1
    paths = export_rows(distinct_top(rows, args.top), config, check_output_folder(args.out), study)
    if args.json:
        print(json.dumps({"study": args.study, "recipes": [str(p) for p in paths]}))
    else:
        for path in paths:
            print(path)
    return 0
