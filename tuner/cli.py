"""The `tune` command line.

    tune --model M --gpu G [--gpus N] [--trials K] [--study NAME] [--storage URL] [--backend predict]
    tune show | export | predict | models | gpus

Every error the user can cause ends in one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cost_model.hardware import GpuSpec, HardwareError, all_gpus, load_gpu
from cost_model.model_spec import ModelError, ModelSpec, catalog_names, load_model
from cost_model.predict import Prediction, predict
from cost_model.workload import FRAMEWORKS, PRECISIONS, ROUTINGS, Workload, WorkloadError
from search_space.enumerate import SpaceOptions, enumerate_layouts
from cost_model.layout import InvalidLayout, Layout
from cost_model.stack import STACK_FIXES, Stack
from cost_model.layout_codec import LAYOUT_KEYS, layout_from_values, parse_pairs, to_optuna_params
from tuner.predict_request import ANSWERABLE_ERRORS, REQUEST_KEYS, RequestError, answer, resolve, result_dict
from cost_model.errors import AttuneError

SUBCOMMANDS = ("show", "export", "predict", "models", "gpus", "profile", "trial")
# Subcommands whose module parses its own arguments and returns its own exit code.
DELEGATED = {"check-convergence": "experiments.convergence", "component-test": "experiments.adam_component_test"}
EXIT_USAGE = 2


class CliError(AttuneError):
    pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]]).main(argv[1:])
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "run"
    if command != "run":
        argv = argv[1:]
    parser = PARSERS[command]()
    args = parser.parse_args(argv)
    if command in ("run", "show", "export"):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    from cost_model.profile import ProfileError
    from experiments.runner import RunnerError
    from recipes.recipe import RecipeError
    from tuner.study import StudyError

    try:
        return COMMANDS[command](args)
    except (ModelError, HardwareError, WorkloadError, InvalidLayout, CliError, StudyError, RecipeError,
            ProfileError, RequestError, RunnerError, OSError) as e:
        print(f"tune: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("tune: interrupted; finished trials are kept in the study", file=sys.stderr)
        return 130


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(text.split())


# ---------------------------------------------------------------- shared options

def _add_target(p: argparse.ArgumentParser, required: bool = True):
    p.add_argument("--model", required=required, help="catalog name (see `tune models`) or path to a config.json")
    p.add_argument("--gpu", required=required, help="GPU type (see `tune gpus`)")
    p.add_argument("--gpus", type=int, default=None, help="number of GPUs (default: one node)")


def _add_workload(p: argparse.ArgumentParser):
    p.add_argument("--seq-len", type=int, default=8192, help="tokens per row (default 8192)")
    p.add_argument("--global-batch", type=int, default=128, help="rows per optimizer step (default 128)")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--routing", choices=ROUTINGS, default="natural",
                   help="natural: real data, unbalanced experts; balanced: forced router balance")
    p.add_argument("--framework", choices=FRAMEWORKS, default="slime",
                   help="slime: slime's eager Megatron step (default); megatron: a tuned Megatron-LM/Bridge step")
    p.add_argument("--usd-per-gpu-hour", type=float, default=None, help="override the GPU's catalog price")
    p.add_argument("--stack-fix", action="append", default=[], choices=STACK_FIXES,
                   help="a fix your training image has (repeatable)")
    p.add_argument("--profile", default=None,
                   help="hardware profile YAML (from `tune profile`) to use instead of the one shipped for the GPU")


def _profile(args):
    from cost_model.profile import load_profile

    return load_profile(args.profile) if getattr(args, "profile", None) else None


def _add_storage(p: argparse.ArgumentParser):
    p.add_argument("--study", default=None, help="study name (default: <model>-<gpu>-x<gpus>)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL or SQLite path (default: sqlite:///studies/attune.sqlite3)")


def _target(args) -> tuple[ModelSpec, GpuSpec, int]:
    model = load_model(args.model)
    gpu = load_gpu(args.gpu).with_price(getattr(args, "usd_per_gpu_hour", None))
    gpus = args.gpus if args.gpus is not None else gpu.gpus_per_node
    if gpus < 1:
        raise CliError(f"--gpus must be at least 1, got {gpus}")
    return model, gpu, gpus


def _workload(args) -> Workload:
    return Workload(seq_len=args.seq_len, global_batch=args.global_batch, precision=args.precision,
                    routing=args.routing, framework=args.framework)


# ---------------------------------------------------------------- tune (the study loop)

def _run_parser():
    p = argparse.ArgumentParser(prog="tune", description="Find the fastest training layout for a model on a GPU "
                                "cluster. Subcommands: " + ", ".join(SUBCOMMANDS) + ".")
    _add_target(p)
    _add_workload(p)
    _add_storage(p)
    p.add_argument("--trials", type=int, default=20, help="trials to add to the study (default 20)")
    _add_backend(p)
    p.add_argument("--proposer", choices=("agent", "tpe"), default="agent",
                   help="agent: reads predictions and measurements; tpe: Optuna's TPE sampler")
    p.add_argument("--top", type=int, default=3, help="recipes to export for the best layouts (default 3)")
    p.add_argument("--out", default="studies/recipes", help="folder for exported recipes (default studies/recipes)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verify-top", type=int, default=None,
                   help="measured backends: run the convergence arm for the K fastest measured layouts (default 3)")
    p.add_argument("--reference", nargs="*", default=None, metavar="KEY=VALUE",
                   help="the convergence reference layout (default: the simplest valid layout that fits)")
    p.add_argument("--on-interrupted", choices=("retry", "skip"), default="retry",
                   help="trials a killed tuner left running are marked failed; retry their layouts or skip them")
    return p


def _add_backend(p: argparse.ArgumentParser, default: str | None = "predict"):
    choices = ("predict", "megatron", "slime")
    p.add_argument("--backend", choices=choices if default else choices[1:], default=default, required=not default,
                   help="predict: the cost model answers (no GPU; figures labelled predicted); megatron: short "
                        "megatron-core trials on this machine's GPUs; slime: slime jobs on a Ray cluster")
    p.add_argument("--steps", type=int, default=20, help="steps of a measured trial (default 20)")
    p.add_argument("--layers", type=int, default=None,
                   help="megatron: run the first L layers (default: the most that fit the local GPUs)")
    p.add_argument("--rows", help="megatron: token rows (JSONL {\"tokens\": [...]}) for measured trials and "
                                  "convergence arms (default: random tokens, nothing to learn)")
    p.add_argument("--ray-address", help="slime: the Ray cluster's Jobs API address (http://HEAD:8265)")
    p.add_argument("--slime-dir", help="slime: the slime checkout on the cluster")
    p.add_argument("--entry-module", default="train", help="slime: the training entry (default train)")
    p.add_argument("--hf-checkpoint", help="slime: $HF_CKPT on the cluster")
    p.add_argument("--torch-dist", help="slime: $TORCH_DIST on the cluster")
    p.add_argument("--sft-data", help="slime: pre-tokenised rows (JSONL) on the cluster")
    p.add_argument("--hang-timeout", type=float, default=None, help="seconds without a new step before a trial "
                   "is stopped as hung")


def measured_window(steps: int) -> tuple[int, int]:
    """The leaderboard's window 5..19 for 20 steps; the same shape (skip the first quarter) otherwise."""
    if steps < 2:
        raise CliError(f"--steps must be at least 2, got {steps}")
    return (5, 19) if steps == 20 else (max(1, steps // 4), steps - 1)


def make_runner(args, profile=None):
    """The trial runner the --backend flags ask for; RunnerError if it cannot run trials at all."""
    if args.backend == "predict":
        from experiments.predicted_runner import PredictedRunner

        return PredictedRunner(profile=profile)
    if args.backend == "megatron":
        from experiments.megatron_runner import MegatronRunner, visible_gpus
        from experiments.runner import RunnerError

        if visible_gpus() < 1:
            raise RunnerError("no CUDA GPU found: --backend megatron runs trials on this machine's GPUs")

        # Every measured trial may become a convergence arm: start all layouts from the same weights.
        verify_top = getattr(args, "verify_top", 0)  # `tune trial` has no convergence arm
        verify = verify_top is None or verify_top > 0
        if args.rows:
            from experiments.megatron_runner import load_rows
            try:
                load_rows(args.rows)
            except OSError as e:
                raise CliError(f"--rows {args.rows}: cannot read: {e.strerror or e}") from None
            except ValueError as e:
                raise CliError(f"--rows: {e}") from None
        runner = MegatronRunner(layers=args.layers, cpu_init=verify, rows_file=args.rows)
        if args.hang_timeout:
            runner.hang_timeout_s = args.hang_timeout
        return runner
    from experiments.slime_runner import SlimeRunner

    if not args.ray_address or not args.slime_dir:
        raise CliError("--backend slime needs --ray-address and --slime-dir")
    kwargs = {"hang_timeout_s": args.hang_timeout} if args.hang_timeout else {}
    return SlimeRunner(args.ray_address, args.slime_dir, args.entry_module, hf_ckpt=args.hf_checkpoint,
                       torch_dist=args.torch_dist, sft_data=args.sft_data, **kwargs)


def cmd_run(args) -> int:
    from tuner.proposer import AgentProposer, SamplerProposer
    from tuner.report import counts_line, format_table, ranked_rows
    from tuner.study import (StudyConfig, default_study_name, load_or_create, open_storage, recover_interrupted,
                             run_study, storage_url)

    if args.trials < 1:
        raise CliError(f"--trials must be at least 1, got {args.trials}")
    model, gpu, gpus = _target(args)
    config = StudyConfig(model, gpu, gpus, _workload(args), Stack.with_fixes(args.stack_fix), SpaceOptions(),
                         _profile(args), steps=args.steps, window=measured_window(args.steps))
    candidates = _score_space(config)
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
        from tuner.verify import default_reference, verify_top as run_verification

        reference = reference or default_reference(proposer_candidates(candidates), gpus)
        print(f"convergence arm: reference {reference.long_label}", file=sys.stderr)
        for v in run_verification(study, config, runner, verify_top, reference):
            print(f"  trial {v['trial']} {v['layout']}: convergence {v['result']} "
                  f"(correlation {v['correlation']}, final loss difference {v['final_loss_difference']}, "
                  f"pointwise failures {v['pointwise_failures']})")
        rows = ranked_rows(study)
    if rows and args.top > 0:
        paths = _export_rows(rows[:args.top], config, Path(args.out), study)
        print("recipes (status predicted, measured or verified):")
        for path in paths:
            print(f"  {path}")
    return 0


def proposer_candidates(scored):
    from tuner.proposer import Candidate

    return [Candidate(l, p) for l, p in scored]


def parse_reference(pairs: list[str], config) -> Layout:
    from search_space.rules import check

    layout = layout_from_values(parse_pairs(pairs), config.world_size, config.workload.seq_len)
    check(layout, config.model, config.workload, config.stack)
    return layout


def _score_space(config) -> list[tuple[Layout, Prediction]]:
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


def _export_rows(rows, config, out: Path, study=None) -> list[Path]:
    """Recipes for the rows: `predicted`, `measured` (a real trial's figures) or `verified` (measured and
    its convergence arm passed). Nothing becomes verified without a passing verdict."""
    from recipes.recipe import build_recipe, recipe_name, recipe_path, write_recipe

    trials = {t.number: t for t in study.get_trials(deepcopy=False)} if study is not None else {}
    paths = []
    for row in rows:
        prediction = predict(config.model, config.gpu, config.workload, row.layout, profile=config.profile)
        recipe = build_recipe(config.model, config.gpu, config.workload, row.layout, prediction)
        trial = trials.get(row.number)
        if row.kind == "measured" and trial is not None:
            result = trial.user_attrs.get("result") or {}
            recipe["result"].update(
                tokens_per_s_per_gpu=round(row.tokens_per_s_per_gpu, 2),
                usd_per_million_tokens=round(config.gpu.usd_per_gpu_hour / (row.tokens_per_s_per_gpu * 3600) * 1e6, 2),
                step_time_cv_percent=result.get("step_time_cv_percent"), mfu=result.get("mfu"),
                gpu_hours=result.get("gpu_hours"), **_measured_run_fields(result, config))
            from recipes.correctness import record_convergence
            from tuner.verify import convergence_of, reference_of

            recipe["status"] = "measured"
            convergence = convergence_of(study, row.number)
            if convergence:
                record_convergence(recipe, convergence, reference_of(study, row.number))
        path = recipe_path(out, config.model, config.gpu, recipe_name(row.layout))
        write_recipe(recipe, path)
        paths.append(path)
    return paths


def _measured_run_fields(result: dict, config) -> dict:
    """What a recipe's result says about the measured run: who measured it, what model actually ran
    (a truncated model, replaced layers), its steps, window and tokens, and how its MFU was counted."""
    from experiments.runner import TrialResult

    detail = TrialResult.from_dict(result).details
    notes = list(detail.get("notes") or [])
    optimizer = detail.get("optimizer") or ""
    if "NOT applied" in optimizer:  # e.g. bf16 moments asked for, the standard optimizer ran
        notes.append(optimizer.split("; ")[-1])
    run = (detail.get("model_run") or {}).get("name")
    measured = result.get("source") or "measured"
    if notes:
        measured += f"; model run {run or '?'}: " + "; ".join(notes)
    window = detail.get("window") or list(config.window)
    rows = detail.get("global_batch_rows") or config.workload.global_batch
    seq = detail.get("seq_len") or config.workload.seq_len
    peak = config.gpu.peak_tflops(config.workload.precision)
    return {"measured": measured,
            "mfu_note": (f"measured: 6 x active params of the model run{f' ({run})' if run else ''} x tokens/s per "
                         f"GPU / {peak:g} TFLOP/s ({config.gpu.display_name} dense {config.workload.precision} peak)"),
            "steps_per_run": detail.get("steps_run") or config.steps, "window": list(window),
            "window_tokens": (window[1] - window[0] + 1) * rows * seq, "runs": 1,
            "gpu_hours_note": "measured: the trial's wall time (start-up included) x its GPUs"}


# ---------------------------------------------------------------- show / export

def _show_parser():
    p = argparse.ArgumentParser(prog="tune show", description="Ranked table of a study's trials.")
    _add_storage(p)
    p.add_argument("--limit", type=int, default=None, help="rows to print (default all)")
    return p


def _open_existing(args):
    from tuner.study import load_study, open_storage, storage_url

    if not args.study:
        raise CliError("--study NAME is required")
    return load_study(open_storage(storage_url(args.storage)), args.study)


def cmd_show(args) -> int:
    from tuner.report import counts_line, format_table, ranked_rows

    study = _open_existing(args)
    print(counts_line(study))
    print(format_table(ranked_rows(study), limit=args.limit))
    return 0


def _export_parser():
    p = argparse.ArgumentParser(prog="tune export", description="Write recipe YAMLs for a study's best layouts.")
    _add_storage(p)
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--out", required=True, help="folder; recipes go to OUT/<model>/<gpu>/<name>.yaml")
    return p


def cmd_export(args) -> int:
    from tuner.report import ranked_rows
    from tuner.study import StudyConfig

    study = _open_existing(args)
    identity = study.user_attrs.get("config")
    if not identity:
        raise CliError(f"study '{args.study}' was not created by tune (no configuration recorded)")
    config = StudyConfig(load_model(identity["model"]), load_gpu(identity["gpu"]), identity["gpus"],
                         Workload(**identity["workload"]), Stack(**identity["stack"]))
    rows = ranked_rows(study)
    if not rows:
        raise CliError(f"study '{args.study}' has no completed trial to export")
    for path in _export_rows(rows[:args.top], config, Path(args.out), study):
        print(path)
    return 0


# ---------------------------------------------------------------- predict

def _predict_parser():
    p = argparse.ArgumentParser(prog="tune predict", description="Predict memory, step time and throughput of "
                                "one layout, from a recipe or from flags; or of many, one JSON request a line.")
    p.add_argument("--recipe", help="a recipe YAML (its model, GPU, workload and layout)")
    _add_target(p, required=False)
    _add_workload(p)
    p.add_argument("--layout", nargs="*", default=[], metavar="KEY=VALUE",
                   help="layout fields: " + ", ".join(LAYOUT_KEYS))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--explain", action="store_true", help="print where the time and the memory go")
    p.add_argument("--recipe-out", help="write the predicted recipe for this layout")
    p.add_argument("--batch", metavar="REQUESTS.jsonl",
                   help="one JSON request a line (keys: " + ", ".join(REQUEST_KEYS) + "); '-' reads stdin; "
                        "prints one JSON result a line, in order; an invalid request gets an error field")
    return p


def _request_from_args(args) -> dict:
    if getattr(args, "recipe", None):
        return {"recipe": args.recipe, "usd_per_gpu_hour": args.usd_per_gpu_hour, "stack_fix": args.stack_fix}
    if not (args.model and args.gpu):
        raise CliError("give --recipe FILE, or --model, --gpu and --layout KEY=VALUE ...")
    return {"model": args.model, "gpu": args.gpu, "gpus": args.gpus, "seq_len": args.seq_len,
            "global_batch": args.global_batch, "precision": args.precision, "routing": args.routing,
            "framework": args.framework, "usd_per_gpu_hour": args.usd_per_gpu_hour, "stack_fix": args.stack_fix,
            "layout": parse_pairs(args.layout)}


def cmd_predict(args) -> int:
    profile = _profile(args)
    if args.batch:
        return _predict_batch(args.batch, profile)
    resolved = resolve(_request_from_args(args))
    prediction = answer(resolved, profile)
    if args.recipe_out:
        from recipes.recipe import build_recipe, write_recipe

        write_recipe(build_recipe(resolved.model, resolved.gpu, resolved.workload, resolved.layout, prediction),
                     Path(args.recipe_out))
    if args.json:
        print(json.dumps(result_dict(resolved, prediction)))
    elif args.explain:
        print(explain(resolved.model, resolved.gpu, resolved.layout, prediction))
    else:
        print(summary_line(resolved.model, resolved.gpu, resolved.layout, prediction))
    return 0


def _predict_batch(path: str, profile) -> int:
    from cost_model.profile import ProfileError
    from recipes.recipe import RecipeError

    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    answerable = ANSWERABLE_ERRORS + (ModelError, HardwareError, WorkloadError, RecipeError, ProfileError)
    with stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                resolved = resolve(request)
                out = result_dict(resolved, answer(resolved, profile))
            except json.JSONDecodeError as e:
                out = {"error": f"line {number}: not JSON ({e.msg} at column {e.colno})"}
            except answerable as e:
                out = {"error": f"line {number}: {_one_line(e)}"}
            print(json.dumps(out))
    return 0


def summary_line(model: ModelSpec, gpu: GpuSpec, layout: Layout, p: Prediction) -> str:
    fits = "fits" if p.fits else "DOES NOT FIT: " + "; ".join(p.reasons)
    return (f"{model.display_name} on {layout.world_size} x {gpu.display_name}, {layout.long_label}: predicted "
            f"{p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {p.step_time_s:.2f} s, MFU {p.mfu:.1%}, "
            f"peak {p.peak_memory_gib:.1f} GiB, {fits} ({p.source}; --explain for the breakdown)")


def explain(model: ModelSpec, gpu: GpuSpec, layout: Layout, p: Prediction) -> str:
    """Where the time and the memory go, as two tables."""
    lines = [f"{model.display_name} on {layout.world_size} x {gpu.display_name}: {layout.long_label}",
             f"every figure is predicted ({p.source})",
             f"fits: {'yes' if p.fits else 'NO: ' + '; '.join(p.reasons)}",
             f"tokens/s/GPU {p.tokens_per_s_per_gpu:,.0f}   step {p.step_time_s:.2f} s   MFU {p.mfu:.1%}   "
             f"$/1M tokens {p.usd_per_million_tokens:.3f}",
             f"{p.num_microbatches} micro-batches of {p.tokens_per_microbatch:,.0f} tokens per GPU per step",
             "",
             f"{'step time':<28}{'seconds':>9}{'share':>8}"]
    for k, v in sorted(p.breakdown.items(), key=lambda kv: -kv[1]):
        if v > 0:
            lines.append(f"  {k:<26}{v:9.2f}{v / p.step_time_s:8.1%}")
    lines.append(f"  {'total':<26}{p.step_time_s:9.2f}{1:8.1%}")
    lines += ["", f"{'memory per GPU':<28}{'GiB':>9}{'share':>8}"]
    mem = p.memory.as_dict()
    for k in ("weights", "grads", "optimizer", "activations", "buffers"):
        lines.append(f"  {k:<26}{mem[k]:9.1f}{mem[k] / mem['total']:8.1%}")
    lines.append(f"  {'total (most-loaded GPU)':<26}{mem['total']:9.1f}   of {p.gpu_memory_gib:.1f} usable")
    lines.append(f"  {'host memory per node':<26}{p.host_memory_gib_per_node:9.0f}   of "
                 f"{p.host_memory_capacity_gib:.0f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- catalogs

def _models_parser():
    p = argparse.ArgumentParser(prog="tune models", description="The model catalog.")
    p.add_argument("--json", action="store_true")
    return p


def cmd_models(args) -> int:
    rows = []
    for name in catalog_names():
        m = load_model(name)
        pc = m.params
        rows.append({"name": name, "display_name": m.display_name, "model_type": m.model_type,
                     "layers": m.num_hidden_layers, "hidden": m.hidden_size, "experts": m.num_experts,
                     "top_k": m.num_experts_per_tok, "total_params": pc.total, "active_params": pc.active,
                     "active_non_embedding": pc.active_non_embedding, "hf_repo": m.hf_repo})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<20}{'model':<22}{'layers':>7}{'hidden':>8}{'experts':>9}{'top-k':>6}"
          f"{'total':>10}{'active':>9}{'active-emb':>11}")
    for r in rows:
        print(f"{r['name']:<20}{r['display_name']:<22}{r['layers']:>7}{r['hidden']:>8}{r['experts']:>9}"
              f"{r['top_k']:>6}{r['total_params'] / 1e9:>9.2f}B{r['active_params'] / 1e9:>8.2f}B"
              f"{r['active_non_embedding'] / 1e9:>10.2f}B")
    print("parameter counts derived from each architecture (catalog: cost_model/catalog/models)")
    return 0


def _gpus_parser():
    p = argparse.ArgumentParser(prog="tune gpus", description="The GPU catalog, with the source of each figure.")
    p.add_argument("--json", action="store_true")
    return p


def cmd_gpus(args) -> int:
    from dataclasses import asdict

    from cost_model.profile import shipped_profile

    gpus = all_gpus()
    if args.json:
        rows = []
        for g in gpus:
            profile = shipped_profile(g.name)
            rows.append(asdict(g) | {"profile": profile.summary() if profile else None,
                                     "rates": "profile" if profile else "datasheet x constants.yaml efficiencies"})
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<7}{'bf16 TF':>9}{'fp8 TF':>9}{'HBM GB':>8}{'TB/s':>6}{'NVL dom':>8}{'NVL GB/s':>9}"
          f"{'net GB/s':>9}{'PCIe':>6}{'host GiB':>9}{'GPUs/node':>10}{'$/GPU-h':>8}  instance")
    for g in gpus:
        print(f"{g.name:<7}{g.bf16_tflops:>9,.0f}{g.fp8_tflops:>9,.0f}{g.memory_gb:>8,.0f}{g.hbm_tb_s:>6.2f}"
              f"{g.nvlink_domain:>8}{g.nvlink_gb_s:>9,.0f}{g.internode_gb_s:>9,.0f}{g.pcie_gb_s:>6,.0f}"
              f"{g.host_memory_gib_per_node:>9,.0f}{g.gpus_per_node:>10}{g.usd_per_gpu_hour:>8.2f}  {g.instance}")
    for g in gpus:
        profile = shipped_profile(g.name)
        if profile:
            f = profile.summary()
            print(f"{g.name}: {f['provenance']} profile ({f['device']}, {f['date']}): bf16 GEMM 8192^3 "
                  f"{f['gemm_bf16_8192_tflops']:,.0f} TFLOP/s, HBM copy {f['hbm_copy_tb_s']} TB/s, "
                  f"all-to-all {f.get('all_to_all_busbw_gb_s_at_256MB', '-')} GB/s at 256 MiB, H2D {f['h2d_gb_s']} GB/s")
        else:
            print(f"{g.name}: no profile; datasheet peaks x the efficiency curves of constants.yaml")
    print("catalog figures from datasheets and cloud price lists; `tune gpus --json` gives the source of each")
    return 0


# ---------------------------------------------------------------- profile

def _profile_parser():
    p = argparse.ArgumentParser(prog="tune profile", description="Measure this machine's GPUs (GEMM, grouped GEMM, "
                                "attention, NCCL collectives, host transfers, CPU Adam) into a profile YAML, or "
                                "derive a profile for another GPU type from a measured one.")
    p.add_argument("--model", default=None, help="also measure this model's own GEMM and attention shapes")
    p.add_argument("--out", default=None, help="output YAML (default profile-<gpu>.yaml)")
    p.add_argument("--quick", action="store_true", help="small grids, for a smoke run")
    p.add_argument("--derive", metavar="GPU", help="write a profile for GPU derived from a measured one")
    p.add_argument("--from", dest="source", default="h200", help="the measured profile's GPU type (with --derive)")
    return p


def cmd_profile(args) -> int:
    from experiments.hardware_profile import write_profile

    if args.derive:
        from cost_model.derive_profile import derive_profile
        from cost_model.profile import ProfileError, shipped_profile

        source, target = load_gpu(args.source), load_gpu(args.derive)
        measured = shipped_profile(source.name)
        if measured is None:
            raise ProfileError(f"no shipped profile for {source.name} to derive from")
        derived = derive_profile(measured.raw, source, target)
        out = Path(args.out or f"profile-{target.name}.yaml")
        write_profile(derived, out)
        print(f"derived profile for {target.display_name} written to {out}")
        return 0
    from experiments.hardware_profile import NoGpuError, report_written, run_profile

    model = load_model(args.model) if args.model else None
    try:
        profile = run_profile(model, quick=args.quick)
    except NoGpuError as e:
        raise CliError(str(e)) from None
    report_written(profile, args.out)
    return 0


def _trial_parser():
    p = argparse.ArgumentParser(prog="tune trial", description="Run one trial of one layout outside any study and "
                                "print its result (measured by the chosen backend).")
    _add_target(p)
    _add_workload(p)
    _add_backend(p, default=None)
    p.add_argument("--layout", nargs="*", default=[], metavar="KEY=VALUE", help="layout fields: " + ", ".join(LAYOUT_KEYS))
    p.add_argument("--json", action="store_true")
    return p


def cmd_trial(args) -> int:
    from dataclasses import asdict

    from experiments.runner import TrialSpec

    request = _request_from_args(args)
    resolved = resolve(request)
    answer(resolved)  # the layout's rules, before any GPU is touched
    runner = make_runner(args, _profile(args))
    result = runner.run(TrialSpec(resolved, steps=args.steps, window=measured_window(args.steps)))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"{resolved.layout.long_label}: {result.summary()}")
    return 0 if result.status == "ok" else 1


PARSERS = {"run": _run_parser, "show": _show_parser, "export": _export_parser, "predict": _predict_parser,
           "models": _models_parser, "gpus": _gpus_parser, "profile": _profile_parser, "trial": _trial_parser}
COMMANDS = {"run": cmd_run, "show": cmd_show, "export": cmd_export, "predict": cmd_predict,
            "models": cmd_models, "gpus": cmd_gpus, "profile": cmd_profile, "trial": cmd_trial}

if __name__ == "__main__":
    sys.exit(main())
