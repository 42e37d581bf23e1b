"""The trial runner the --backend flags ask for, and the measured window of a trial's steps."""
from __future__ import annotations

from cost_model.nouns.workload import STEP_OPTION_DEFAULTS, STEP_OPTION_FLAGS
from tuner.options import CliError


def measured_window(steps: int) -> tuple[int, int]:
    """The leaderboard's window 5..19 for 20 steps; the same shape (skip the first quarter, and at least the two
    warm-up steps whenever a step is left after them) otherwise."""
    if steps < 2:
        raise CliError(f"--steps must be at least 2, got {steps}")
    return (5, 19) if steps == 20 else (max(min(2, steps - 1), steps // 4), steps - 1)


def not_set_up(backend: str, **options) -> str | None:
    """Why the `backend` runner would not run the workload asked: a step option (`STEP_OPTION_DEFAULTS`, given by
    name) the cost model prices but no runner sets up (a measured trial would measure a different run); None where
    there is none."""
    for name, default in STEP_OPTION_DEFAULTS.items():
        value = options.get(name, default)
        if value != default:
            return f"{STEP_OPTION_FLAGS[name]} {value}: the {backend} runner does not set it up (it would measure a " \
                   f"different run)"
    return None


def check_set_up(args) -> None:
    """CliError for a workload flag a measuring backend does not set up (before the workload's own rules, so the
    reason given is the final one)."""
    if args.backend != "predict":
        reason = not_set_up(args.backend, **{k: getattr(args, k, d) for k, d in STEP_OPTION_DEFAULTS.items()})
        if args.backend == "slime" and getattr(args, "framework", "slime") != "slime":
            reason = (f"--framework {args.framework}: the slime runner runs slime's own step, not a tuned "
                      f"Megatron-LM/Bridge one (it would measure a different run)")
        if reason:
            raise CliError(f"{reason}; it is predicted only, with --backend predict")


def megatron_unsupported(model, workload, layout=None) -> str | None:
    """Why the megatron runner refuses to run `model` with `workload` (and `layout`): its own refusals
    (experiments.megatron.config: the model, the precision, the layout) and the options it does not set up; None
    where it runs it. `tune trial --backend megatron` and `tune predict --stack megatron-runner` both ask here."""
    from experiments.megatron.config import layout_unsupported, unsupported

    return (unsupported(model, workload.precision) or (layout_unsupported(layout) if layout is not None else None)
            or not_set_up("megatron", **workload.step_options))


def megatron_refused(reason: str):
    """The error `--backend megatron` ends with for what its runner refuses (megatron_unsupported's reason)."""
    from experiments.runner import RunnerError

    return RunnerError(f"--backend megatron: {reason} (--backend slime runs it on a cluster's training image, "
                       f"--backend predict prices it)")


def make_runner(args, profile=None):
    """The trial runner the --backend flags ask for; RunnerError if it cannot run trials at all."""
    check_set_up(args)
    if args.backend == "predict":
        from experiments.predicted_runner import PredictedRunner

        return PredictedRunner(profile=profile)
    if args.backend == "megatron":
        return _megatron_runner(args)
    return _slime_runner(args)


def _megatron_runner(args):
    from experiments.megatron.runner import MegatronRunner, visible_gpus
    from experiments.runner import RunnerError

    if getattr(args, "model", None):
        # a model the runner cannot build fails here, before any GPU is looked for
        from cost_model.nouns.model_spec import load_model
        from experiments.megatron.config import unsupported

        reason = unsupported(load_model(args.model), getattr(args, "precision", "bf16"))
        if reason:
            raise megatron_refused(reason)
    missing = [name for name, module in (("torch", "torch"), ("megatron-core", "megatron.core"))
               if _find_spec(module) is None]
    if missing:
        raise RunnerError(f"--backend megatron runs trials with torch and megatron-core on this machine's GPUs; "
                          f"missing here: {', '.join(missing)} (pip install 'attune-llm[megatron]', or a torch "
                          f"build for your CUDA first)")
    if visible_gpus() < 1:
        raise RunnerError("no CUDA GPU found: --backend megatron runs trials on this machine's GPUs")

    # Every measured trial may become a convergence arm: start all layouts from the same weights.
    verify_top = getattr(args, "verify_top", 0)  # `tune trial` has no convergence arm
    verify = verify_top is None or verify_top > 0
    if args.rows:
        _check_rows(args.rows)
    runner = MegatronRunner(layers=args.layers, cpu_init=verify, rows_file=args.rows)
    if args.hang_timeout:
        runner.hang_timeout_s = args.hang_timeout
    return runner


def _find_spec(module: str):
    """importlib's spec of `module`, None when it (or its parent package) is not installed."""
    import importlib.util

    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None


def _check_rows(path: str) -> None:
    """Read the --rows file once before any trial, so a bad file fails the command, not every trial."""
    from experiments.megatron.data import load_rows

    try:
        load_rows(path)
    except OSError as e:
        raise CliError(f"--rows {path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(f"--rows: {e}") from None


def _slime_runner(args):
    """The slime runner for the --cluster file and the flags over it; every missing or bad field fails here
    in one line, before any job (a --dry-run never connects to Ray)."""
    from cost_model.nouns.model_spec import load_model
    from experiments.slime.cluster import ClusterConfig, load_cluster
    from experiments.slime.runner import SlimeRunner
    from experiments.slime.watch import Limits

    cluster = load_cluster(args.cluster) if getattr(args, "cluster", None) else ClusterConfig()
    cluster = cluster.with_overrides(ray_address=args.ray_address, slime_dir=args.slime_dir,
                                     hf_checkpoint=args.hf_checkpoint, torch_dist=args.torch_dist,
                                     sft_data=args.sft_data, profile_dir=getattr(args, "profile_dir", None),
                                     entry_module=args.entry_module)
    if not cluster.ray_address or not cluster.slime_dir:
        raise CliError("--backend slime needs --ray-address and --slime-dir (or ray_address and slime_dir in "
                       "a --cluster file)")
    limits = Limits(hang_timeout_s=args.hang_timeout) if args.hang_timeout else None
    runner = SlimeRunner(cluster, limits, connect=not getattr(args, "dry_run", False))
    cluster.check_paths()
    runner.check_model(load_model(args.model))
    return runner
