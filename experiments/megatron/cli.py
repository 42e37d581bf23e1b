"""`python -m experiments.megatron`: measure one layout, or run a suite, on this machine's GPUs."""
from __future__ import annotations

import argparse
import json
import sys

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import HardwareError, load_gpu
from cost_model.nouns.layout import InvalidLayout
from cost_model.nouns.layout_codec import layout_from_stored, parse_pairs
from cost_model.nouns.model_spec import ModelError, load_model
from cost_model.nouns.workload import Workload
from experiments.megatron.launch import STARTUP_GRACE_S
from experiments.megatron.runner import DEFAULT_SEED, MegatronRunner, detect_gpu, visible_gpus
from experiments.megatron.suite import SuiteSetup, parse_suite, run_suite
from experiments.runner import TrialSpec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.megatron",
                                description="Measure a layout with megatron-core on the local GPUs.")
    p.add_argument("--suite", help="run the trials of a suite JSON file, one JSON line each")
    p.add_argument("--out", help="append each suite result line to this JSONL file")
    p.add_argument("--budget-s", type=float, help="suite: stop starting trials after this many seconds")
    p.add_argument("--only", help="suite: comma-separated trial names to run")
    p.add_argument("--model", help="catalog model name or config.json path")
    p.add_argument("--gpus", type=int, help="GPUs (world size)")
    p.add_argument("--layers", default="auto", help="layers to build ('auto': largest predicted to fit)")
    p.add_argument("--replace-gdn", action="store_true",
                   help="build Gated DeltaNet layers as full attention (default: megatron-core's GatedDeltaNet)")
    p.add_argument("--keep-gdn", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old commands
    p.add_argument("--layout", nargs="*", default=[], metavar="KEY=VALUE", help="Layout fields, e.g. tp=2 ep=1")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--window", help="inclusive 0-based step window A:B (default 2:N-1)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--routing", default="natural", choices=("natural", "balanced"))
    p.add_argument("--backend", default="auto", choices=("auto", "te", "torch-native", "local"))
    p.add_argument("--launcher", default="auto", choices=("auto", "mp", "ray"))
    p.add_argument("--rows", help="JSONL of {'tokens': [...], 'loss_mask': [...]} rows (default: random tokens)")
    p.add_argument("--gpu", default="auto", help="catalog GPU for predictions (default: from nvidia-smi)")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="a trial's limit (default 300; with --suite: each trial's, instead of the suite's own, e.g. "
                        "for first Gated DeltaNet trials that compile their kernels on a fresh machine)")
    p.add_argument("--hang-timeout-s", type=float, default=120.0,
                   help="fail as a hang when no rank reports for this long once training steps run")
    p.add_argument("--startup-grace-s", type=float, default=STARTUP_GRACE_S,
                   help="the same before the first training step (imports, NCCL, model build, warm-up)")
    p.add_argument("--log-dir", help="worker logs (default: a temporary directory)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--torch-compile", action="store_true", help="let megatron's jit_fuser functions compile")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def _fail(msg: str) -> int:
    print(f"megatron_runner: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.suite and (not args.model or not args.gpus):
        return _fail("give --suite FILE, or --model and --gpus")
    if args.replace_gdn and args.keep_gdn:
        return _fail("--replace-gdn and --keep-gdn contradict each other")
    try:
        layout = None
        if args.suite:
            parse_suite(args.suite)  # validate before looking for GPUs
        else:
            load_model(args.model)
            layout = layout_from_stored({**parse_pairs(args.layout), "world_size": args.gpus})
    except (ValueError, ModelError, InvalidLayout, OSError) as e:
        return _fail(str(e))
    n = visible_gpus()
    if n == 0:
        return _fail("no CUDA GPU visible (torch.cuda.device_count() == 0); the megatron runner measures real "
                     "training steps and needs the GPUs it runs on")
    if args.gpu == "auto":
        gpu = detect_gpu()
        if gpu is None:
            return _fail("cannot map this GPU to the catalog (nvidia-smi); pass --gpu h200|h100|b200|gb200")
    else:
        try:
            gpu = load_gpu(args.gpu)
        except HardwareError as e:
            return _fail(str(e))
    if args.suite:
        only = [s for s in (args.only or "").split(",") if s]
        setup = SuiteSetup(gpu, launcher=args.launcher, rows_file=args.rows, log_root=args.log_dir,
                           timeout_s=args.timeout_s)
        run_suite(args.suite, args.out, setup, budget_s=args.budget_s, only=only or None)
        return 0
    if args.gpus > n:
        return _fail(f"--gpus {args.gpus} but {n} GPU(s) visible")
    return _run_one(args, gpu, layout)


def _run_one(args, gpu, layout) -> int:
    """One trial from the flags: its result as one line (or one JSON object); exit 0 when it ran."""
    window = None
    if args.window:
        a, _, b = args.window.partition(":")
        window = (int(a), int(b))
    layers = None if args.layers == "auto" else int(args.layers)
    runner = MegatronRunner(layers=layers, replace_gdn=args.replace_gdn, backend=args.backend, launcher=args.launcher,
                            timeout_s=args.timeout_s or 300.0, hang_timeout_s=args.hang_timeout_s,
                            startup_grace_s=args.startup_grace_s, seed=args.seed, rows_file=args.rows,
                            log_dir=args.log_dir, torch_compile=args.torch_compile)
    workload = Workload(seq_len=args.seq_len, global_batch=args.global_batch, routing=args.routing, framework="megatron")
    spec = TrialSpec(Case(load_model(args.model), gpu, workload, layout), steps=args.steps,
                     window=window or (min(2, args.steps - 1), args.steps - 1))
    result = runner.run(spec)
    if args.json:
        print(json.dumps(result.to_dict(), separators=(",", ":"), default=str))
    else:
        print(result.summary())
    return 0 if result.status == "ok" else 1
