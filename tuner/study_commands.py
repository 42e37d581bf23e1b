"""The study commands: `tune` (run the study loop), `tune show` and `tune export`."""
from __future__ import annotations

import sys
from pathlib import Path

from cost_model.layout import Layout
from cost_model.layout_codec import layout_from_values, parse_pairs, to_optuna_params
from cost_model.model_spec import load_model
from cost_model.predict import Prediction, predict
from cost_model.hardware import load_gpu
from cost_model.stack import Stack
from cost_model.workload import Workload
from search_space.enumerate import SpaceOptions, enumerate_layouts
from tuner.backends import make_runner, measured_window
from tuner.export import export_rows
from tuner.options import CliError, profile, target, workload
from tuner.proposer import AgentProposer, Candidate, SamplerProposer
from tuner.report import counts_line, format_table, ranked_rows, trials_csv, trials_json
from tuner.study import (StudyConfig, default_study_name, load_or_create, load_study, open_storage,
                         recover_interrupted, run_study, storage_url)


def cmd_run(args) -> int:
    if args.trials < 1:
        raise CliError(f"--trials must be at least 1, got {args.trials}")
    model, gpu, gpus = target(args)
    config = StudyConfig(model, gpu, gpus, workload(args), Stack.with_fixes(args.stack_fix), SpaceOptions(),
                         profile(args), steps=args.steps, window=measured_window(args.steps))
    candidates = score_space(config)
    runner = make_runner(args, config.profile)  # an unreachable cluster fails here, before the study is touched
    reference = parse_reference(args.reference, config) if args.reference else None
    name = args.study or default_study_name(model, gpu, gpus)
    url = storage_url(args.storage)
    storage = open_storage(url, create_dirs=args.storage is None)
    study = load_or_create(storage, name, config)
    proposer = (AgentProposer(proposer_candidates(candidates), to_optuna_params)
                if args.proposer == "agent" else SamplerProposer())
    kind = "predicted by the cost model" if args.backend == "predict" else f"measured by the {args.backend} runner"
    print(f"tuning {config.describe()}: {len(candidates):,} fitting layouts of the search space; "
          f"study '{name}' in {url}; backend {args.backend} (figures are {kind})", file=sys.stderr)
    interrupted = recover_interrupted(study)
    if interrupted:
        what = "skipped" if args.on_interrupted == "skip" else "retried when proposed again"
        print(f"trials {', '.join(map(str, interrupted))} were interrupted (the tuner stopped while they ran): "
              f"marked failed, their layouts {what}", file=sys.stderr)
    summary = run_study(study, config, runner, proposer, args.trials,
                        progress=not args.no_progress, skip_interrupted=args.on_interrupted == "skip")
    if summary.exhausted:
        print("every distinct fitting layout has been tried", file=sys.stderr)
    rows = ranked_rows(study)
    print(counts_line(study))
    print(format_table(rows, limit=10))
    verify_top = args.verify_top if args.verify_top is not None else (0 if args.backend == "predict" else 3)
    if verify_top > 0 and args.backend != "predict":
        _verify(study, config, runner, verify_top, reference or default_reference_of(candidates, gpus))
        rows = ranked_rows(study)
    if rows and args.top > 0:
        paths = export_rows(rows[:args.top], config, Path(args.out), study)
        print("recipes (status predicted, measured or verified):")
        for path in paths:
            print(f"  {path}")
    return 0


def _verify(study, config, runner, top: int, reference: Layout) -> None:
    """The convergence arm for the `top` fastest measured layouts, one line per verdict."""
    from tuner.verify import verify_top

    print(f"convergence arm: reference {reference.long_label}", file=sys.stderr)
    for v in verify_top(study, config, runner, top, reference):
        print(f"  trial {v['trial']} {v['layout']}: convergence {v['result']} "
              f"(correlation {v['correlation']}, final loss difference {v['final_loss_difference']}, "
              f"pointwise failures {v['pointwise_failures']})")


def default_reference_of(scored, gpus: int) -> Layout:
    from tuner.verify import default_reference

    return default_reference(proposer_candidates(scored), gpus)


def proposer_candidates(scored) -> list[Candidate]:
    return [Candidate(l, p) for l, p in scored]


def parse_reference(pairs: list[str], config) -> Layout:
    from search_space.rules import check

    layout = layout_from_values(parse_pairs(pairs), config.world_size, config.workload.seq_len)
    check(layout, config.model, config.workload, config.stack)
    return layout


def score_space(config) -> list[tuple[Layout, Prediction]]:
    """Every layout of the space that is predicted to fit, with its prediction; CliError when none does."""
    scored = [(l, predict(config.model, config.gpu, config.workload, l, profile=config.profile))
              for l in enumerate_layouts(config.model, config.world_size, config.workload, config.stack,
                                         config.options)]
    if not scored:
        raise CliError(f"no valid layout exists for {config.describe()} (check the GPU count against the "
                       f"model's heads, experts and layers)")
    fitting = [(l, p) for l, p in scored if p.fits]
    if not fitting:
        least = min(scored, key=lambda lp: lp[1].peak_memory_gib)
        raise CliError(f"no layout of {config.model.display_name} fits on {config.world_size} x "
                       f"{config.gpu.display_name}: the smallest predicted peak is {least[1].peak_memory_gib:.1f} GiB "
                       f"({least[0].long_label}), {least[1].reasons[0] if least[1].reasons else ''}")
    return fitting


# ---------------------------------------------------------------- show / export

def open_existing(args):
    if not args.study:
        raise CliError("--study NAME is required")
    return load_study(open_storage(storage_url(args.storage)), args.study)


def cmd_show(args) -> int:
    study = open_existing(args)
    if args.format == "csv":
        print(trials_csv(study, limit=args.limit), end="")
    elif args.format == "json":
        print(trials_json(study, limit=args.limit))
    else:
        print(counts_line(study))
        print(format_table(ranked_rows(study), limit=args.limit))
    return 0


def cmd_export(args) -> int:
    study = open_existing(args)
    identity = study.user_attrs.get("config")
    if not identity:
        raise CliError(f"study '{args.study}' was not created by tune (no configuration recorded)")
    config = StudyConfig(load_model(identity["model"]), load_gpu(identity["gpu"]), identity["gpus"],
                         Workload(**identity["workload"]), Stack(**identity["stack"]))
    rows = ranked_rows(study)
    if not rows:
        raise CliError(f"study '{args.study}' has no completed trial to export")
    for path in export_rows(rows[:args.top], config, Path(args.out), study):
        print(path)
    return 0
