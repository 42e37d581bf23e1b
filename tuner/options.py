"""The command line's flags: what each subcommand takes, and what the shared ones become.

The parsers only describe; the commands (tuner.study_commands, tuner.what_if, tuner.catalog_commands)
act on what they parse.
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from cost_model.nouns.errors import AttuneError
from recipes.files import LinkedTarget
from cost_model.nouns.hardware import GpuSpec, load_gpu, node_placement
from cost_model.nouns.layout_codec import LAYOUT_KEYS
from cost_model.nouns.model_spec import ModelSpec, load_model
from cost_model.nouns.stack import STACK_FIXES, STACK_NAMES
from cost_model.nouns.workload import (CUDA_GRAPHS, FRAMEWORKS, MAX_GLOBAL_BATCH, MAX_IMAGE_SIZE, MAX_IMAGES_PER_ROW,
                                       MAX_SEQ_LEN, PEFTS, PRECISIONS, ROUTINGS, Workload)
from search_space.enumerate import MAX_GPUS
from tuner.predict_request import MAX_BATCH_REQUESTS, MAX_REQUEST_CHARS, MAX_USD_PER_GPU_HOUR, REQUEST_KEYS

SUBCOMMANDS = ("show", "export", "report", "predict", "models", "gpus", "profile", "trial")
# Subcommands whose own module parses their arguments (tuner.cli.DELEGATED).
OWN_PARSER_SUBCOMMANDS = ("check-convergence", "component-test")

# Upper bounds on what flags may ask for: far above any job trained today, low enough that the work
# before the first answer stays bounded (the search space grows with the GPU count's divisors).
MAX_LAYERS = 1024
MAX_TRIALS = 100_000
MAX_STEPS = 100_000
MAX_GPU_HOURS = 10_000_000
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600
SHOW_FORMATS = ("table", "csv", "json")


class CliError(AttuneError):
    """A flag value, or a combination of flags, the command cannot run with."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (CliError: `tune: error: ...`, exit 2), not a usage dump, and no
    abbreviated flags: `tune --stack megatron-runner` names --stack as unknown, not --stack-fix's choices."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise CliError(f"{message} (see {self.prog} --help)")


@contextmanager
def one_line_usage_errors():
    """Parsers built elsewhere (the delegated subcommands' own argparse) end in one line too, not a usage dump."""
    saved = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = Parser.error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = saved


def bounded_int(low: int, high: int):
    """An argparse type: a decimal integer in [low, high], named in the error (no 0x10, 1_0 or other digits)."""
    def parse(text: str) -> int:
        digits = text.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", digits):
            raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)}")
        # a 5,000-digit number is out of range, not a reason to convert it
        value = int(digits) if len(digits.lstrip("+-0")) <= 30 else None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:,} and {high:,}, got {_shown(text)}")
        return value
    parse.__name__ = "integer"
    return parse


def bounded_number(high: float):
    """An argparse type: a finite number above zero and at most `high` (no nan, inf, negatives or 1e308)."""
    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else float("nan")
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {_shown(text)}") from None
        if not (math.isfinite(value) and 0 < value <= high):
            raise argparse.ArgumentTypeError(f"must be a finite number above 0 and at most {high:,g}, "
                                             f"got {_shown(text)}")
        return value
    parse.__name__ = "number"
    return parse


def stop_margin(text: str) -> float | None:
    """An argparse type: the agent's stop margin, a fraction in [0, 10], or `off` (None: never stop early)."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text) if len(text) <= 40 else float("nan")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction or 'off', got {_shown(text)}") from None
    if not (math.isfinite(value) and 0 <= value <= 10):
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to 10 or 'off', got {_shown(text)}")
    return value


def offload_fractions(text: str) -> tuple[float, ...]:
    """An argparse type: the optimizer offload fractions a study searches, comma-separated numbers in [0, 1]."""
    values = []
    for part in text.split(",") if len(text) <= 200 else [text]:
        try:
            value = float(part) if part.strip() else float("nan")
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers from 0 to 1 separated by commas, got "
                                             f"{_shown(text)}") from None
        if not (math.isfinite(value) and 0 <= value <= 1):
            raise argparse.ArgumentTypeError(f"each fraction must be from 0 to 1, got {_shown(part)}")
        values.append(value)
    return tuple(sorted(set(values)))


def study_name(text: str) -> str:
    """An argparse type: a study name is printed and stored; it must be non-empty printable text."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a study, got an empty name")
    if len(text) > 200 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable text of at most 200 characters, got {_shown(text)}")
    return text


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


@contextmanager
def writing_user_file(path: str | os.PathLike | None = None):
    """A file or folder the user asked for (`path`, as they gave it) that cannot be written fails the command in
    one line that names their path, never a temporary file of ours."""
    try:
        yield
    except OSError as e:
        raise CliError(unwritable(path, e)) from None


def unwritable(path, e: OSError) -> str:
    """One line for an output that could not be written: the user's path and why, in words."""
    if path is None or isinstance(e, LinkedTarget):
        return str(e)
    why = {errno.EACCES: "is not writable", errno.EPERM: "is not writable (read-only or immutable)",
           errno.EROFS: "is on a read-only file system", errno.ENOTDIR: "has a file where a folder is needed",
           errno.EEXIST: "exists and is not a folder", errno.ENOENT: "is in a folder that does not exist",
           errno.ENOSPC: "is on a full disk", errno.EISDIR: "is a folder, not a file"}.get(e.errno)
    if e.errno == errno.ENOENT and Path(path).parent.is_dir():
        why = "cannot be created in that folder"
    text = str(path)
    shown = repr(text if len(text) <= 120 else "..." + text[-117:])   # a path's end names it
    return f"cannot write {shown}: it {why}" if why else f"cannot write {shown}: {e.strerror or e}"


def check_output_folder(folder: str | os.PathLike) -> Path:
    """Before any work that ends in writing to `folder`: that it is, or can be made, a writable folder; nothing is
    left behind (a file is written and removed in it, or in its nearest existing parent). A bad --out fails first,
    in one line, not after the trials ran."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    with writing_user_file(folder):
        if not existing.is_dir():
            raise OSError(errno.EEXIST if existing == folder else errno.ENOTDIR, "not a folder", str(existing))
        fd, probe = tempfile.mkstemp(prefix=".attune-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    return folder


# ---------------------------------------------------------------- shared flags

def add_target(p: argparse.ArgumentParser, required: bool = True):
    p.add_argument("--model", required=required, help="catalog name (see `tune models`) or path to a config.json")
    p.add_argument("--gpu", required=required, help="GPU type (see `tune gpus`)")
    p.add_argument("--gpus", type=bounded_int(1, MAX_GPUS), default=None,
                   help=f"number of GPUs (default: one node; at most {MAX_GPUS:,})")


def add_workload(p: argparse.ArgumentParser):
    p.add_argument("--seq-len", type=bounded_int(1, MAX_SEQ_LEN), default=8192,
                   help=f"tokens per row (default 8192; at most {MAX_SEQ_LEN:,})")
    p.add_argument("--global-batch", type=bounded_int(1, MAX_GLOBAL_BATCH), default=128,
                   help=f"rows per optimizer step (default 128; at most {MAX_GLOBAL_BATCH:,})")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--routing", choices=ROUTINGS, default="natural",
                   help="natural: real data, unbalanced experts; balanced: forced router balance")
    p.add_argument("--framework", choices=FRAMEWORKS, default="slime",
                   help="slime: slime's eager Megatron step (default); megatron: a tuned Megatron-LM/Bridge step")
    p.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, default="none",
                   help="with --framework megatron: CUDA graphs of the step (partial: attention/router modules; "
                        "full: the whole iteration, no host launch per layer)")
    p.add_argument("--peft", choices=PEFTS, default="none",
                   help="with --framework megatron: lora freezes the base weights (no weight gradients, gradient "
                        "sync or optimizer state for them), as Megatron-Bridge's LoRA runs")
    p.add_argument("--images-per-row", type=bounded_int(0, MAX_IMAGES_PER_ROW), default=0,
                   help="a VLM workload: images per row, run through the model's vision encoder on the first "
                        "pipeline stage (default 0: text)")
    p.add_argument("--image-size", type=bounded_int(1, MAX_IMAGE_SIZE), default=448,
                   help="side of a (square) image in pixels (default %(default)s)")
    p.add_argument("--usd-per-gpu-hour", type=bounded_number(MAX_USD_PER_GPU_HOUR), default=None,
                   help=f"override the GPU's catalog price (above 0, at most {MAX_USD_PER_GPU_HOUR:,})")
    p.add_argument("--stack-fix", action="append", default=[], choices=STACK_FIXES,
                   help="a fix your training image has (repeatable)")
    p.add_argument("--profile", default=None,
                   help="hardware profile YAML (from `tune profile`) to use instead of the one shipped for the GPU")


def add_storage(p: argparse.ArgumentParser, named_by_target: bool = False):
    """--study and --storage; `named_by_target`: the parser has --model/--gpu/--gpus, which name the study when
    --study is left out (the study commands, which have not, take the storage's only study without it)."""
    p.add_argument("--study", default=None, type=study_name,
                   help="study name (default: <model>-<gpu>-x<gpus>)" if named_by_target else
                        "study name (tune names a study <model>-<gpu>-x<gpus>; optional when the storage holds "
                        "one study)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage URL or SQLite path (default: sqlite:///studies/attune.sqlite3)")


def add_backend(p: argparse.ArgumentParser, default: str | None = "predict"):
    choices = ("predict", "megatron", "slime")
    p.add_argument("--backend", choices=choices if default else choices[1:], default=default, required=not default,
                   help=("predict: the cost model answers (no GPU; figures labelled predicted); " if default else "")
                        + "megatron: short megatron-core trials on this machine's GPUs; slime: slime jobs on a Ray "
                          "cluster")
    p.add_argument("--steps", type=bounded_int(1, MAX_STEPS), default=20,
                   help=f"steps of a measured trial (default 20; at most {MAX_STEPS:,})")
    p.add_argument("--layers", type=bounded_int(1, MAX_LAYERS), default=None,
                   help=f"megatron: run the first L layers (default for a study: the most for which a layout without "
                        f"recompute or offload is predicted to fit the local GPUs, one count for every trial; at most "
                        f"{MAX_LAYERS:,})")
    p.add_argument("--rows", help="megatron: token rows (JSONL {\"tokens\": [...]}) for measured trials and "
                                  "convergence arms (default: random tokens, nothing to learn)")
    p.add_argument("--cluster", metavar="FILE", help="slime: the cluster file (YAML: ray_address, slime_dir, "
                   "hf_checkpoint, torch_dist, sft_data, profile_dir, env, ...); the flags below override its fields")
    p.add_argument("--ray-address", help="slime: the Ray cluster's Jobs API address (http://HEAD:8265); "
                                         "--backend predict: a Ray cluster to score the search space on "
                                         "(ray://HEAD:10001, or local for one started on this machine)")
    p.add_argument("--slime-dir", help="slime: the slime checkout on the cluster")
    p.add_argument("--entry-module", default=None,
                   help="slime: the training entry (default train_async.py, what the recipe's --async names)")
    p.add_argument("--hf-checkpoint", help="slime: $HF_CKPT on the cluster")
    p.add_argument("--torch-dist", help="slime: $TORCH_DIST on the cluster")
    p.add_argument("--sft-data", help="slime: pre-tokenised rows (JSONL) on the cluster")
    p.add_argument("--profile-dir", help="slime: $PROFILE_DIR on the cluster (slime's --tensorboard-dir)")
    p.add_argument("--hang-timeout", type=bounded_number(MAX_HANG_TIMEOUT_S), default=None,
                   help=f"seconds without a new step before a trial is stopped as hung (at most {MAX_HANG_TIMEOUT_S:,})")


def add_layout(p: argparse.ArgumentParser):
    # extend, not the default store: `--layout ep=8 --layout ep=4` reaches parse_pairs, which refuses the
    # repeated key, instead of the last flag silently replacing the first
    p.add_argument("--layout", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="layout fields (each key once): " + ", ".join(LAYOUT_KEYS))


# ---------------------------------------------------------------- what the shared flags become

def target(args) -> tuple[ModelSpec, GpuSpec, int]:
    model = load_model(args.model)
    gpu = load_gpu(args.gpu).with_price(getattr(args, "usd_per_gpu_hour", None))
    gpus = args.gpus if args.gpus is not None else gpu.gpus_per_node
    if gpus < 1:
        raise CliError(f"--gpus must be at least 1, got {gpus}")
    node_placement(gpu, gpus)   # slime runs the same number of GPUs on each node: HardwareError, one line
    return model, gpu, gpus


def workload(args) -> Workload:
    return Workload(seq_len=args.seq_len, global_batch=args.global_batch, precision=args.precision,
                    routing=args.routing, framework=args.framework, cuda_graphs=args.cuda_graphs,
                    peft=getattr(args, "peft", "none"), images_per_row=getattr(args, "images_per_row", 0),
                    image_size=getattr(args, "image_size", 448))


def profile(args):
    """The --profile YAML, or None for the profile shipped for the GPU type."""
    from cost_model.profile import load_profile

    return load_profile(args.profile) if getattr(args, "profile", None) else None


def flags_set(args, names, command: str) -> list[str]:
    """The flags among `names` that `args` gives away from `command`'s parser defaults, as --flag-names."""
    defaults = PARSERS[command]()
    return [f"--{n.replace('_', '-')}" for n in names
            if hasattr(args, n) and getattr(args, n) not in (None, [], defaults.get_default(n))]


def check_profile_gpu(profile, gpu) -> None:
    """A --profile of one GPU type priced as another would answer with the wrong chip's rates."""
    if profile is not None and profile.gpu_type != gpu.name:
        raise CliError(f"--profile is a profile of {profile.gpu_type} ({profile.device or profile.provenance}), "
                       f"not of {gpu.name}: pass --gpu {profile.gpu_type}, or a profile of {gpu.name} "
                       f"(tune profile --derive {gpu.name} derives one)")


# ---------------------------------------------------------------- one parser per subcommand

def run_parser():
    p = Parser(prog="tune", formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Find the fastest training layout for a model on a GPU cluster.\nSubcommands: "
                           + ", ".join(SUBCOMMANDS + OWN_PARSER_SUBCOMMANDS) + "\n(tune SUBCOMMAND --help).",
               epilog="exit 0: the study holds a completed trial; 1: none of its trials has completed (nothing to\n"
                      "rank or export; one line says why); 2: bad input (one line; an existing study is left as it was)")
    add_target(p)
    add_workload(p)
    add_storage(p, named_by_target=True)
    p.add_argument("--trials", type=bounded_int(1, MAX_TRIALS), default=20,
                   help=f"trials to add to the study (default 20; 1 to {MAX_TRIALS:,})")
    add_backend(p)
    p.add_argument("--proposer", choices=("agent", "tpe", "gp", "random"), default="agent",
                   help="agent: reads predictions and measurements (default); tpe: Optuna's TPE sampler; "
                        "gp: Optuna's Gaussian-process sampler; random: Optuna's random sampler")
    p.add_argument("--stop-margin", type=stop_margin, default=0.03, metavar="FRACTION|off",
                   help="agent: stop once no untried layout's 95%% upper bound beats the best measured by more than "
                        "this fraction (default 0.03); off: run every --trials")
    p.add_argument("--gpu-hours", type=bounded_number(MAX_GPU_HOURS), default=None, metavar="FLOAT",
                   help="stop when the measured trials have used this many GPU-hours (default: no limit; at most "
                        f"{MAX_GPU_HOURS:,})")
    p.add_argument("--top", type=bounded_int(0, 1000), default=3,
                   help="recipes to export for the best layouts (default 3; 0: none; at most 1,000)")
    p.add_argument("--out", default="studies/recipes", help="folder for exported recipes (default studies/recipes)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: neither the trials' bar nor the scoring's lines (on stdout when stderr is no "
                        "terminal), so stdout holds the result alone")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout (the ranked trials and the recipes written)")
    p.add_argument("--offload-fractions", type=offload_fractions, default=None, metavar="F,F,...",
                   help="optimizer CPU offload fractions to search (default 0,0.5,1; where no layout fits with "
                        "those but a larger partial offload does, 0.6-0.95 are added and said so)")
    p.add_argument("--verify-top", type=bounded_int(0, 1000), default=None,
                   help="measured backends: run the convergence arm for the K fastest measured layouts (default 3)")
    p.add_argument("--reference", nargs="*", default=None, metavar="KEY=VALUE",
                   help="the convergence reference layout (default: the simplest valid layout that fits)")
    p.add_argument("--on-interrupted", choices=("retry", "skip"), default="retry",
                   help="trials a killed tuner left running are marked failed; retry their layouts or skip them")
    return p


def show_parser():
    p = Parser(prog="tune show", description="A study's trials: the ranked table (default), or "
                                "one row per trial as CSV or JSON.")
    add_storage(p)
    p.add_argument("--limit", type=bounded_int(1, 10**9), default=None,
                   help="rows to print, at least 1 (default all): the best N of the table, the first N trials of "
                        "csv/json")
    p.add_argument("--format", choices=SHOW_FORMATS, default="table",
                   help="table: ranked completed trials (default); csv, json: every trial, in trial order")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    return p


def export_parser():
    p = Parser(prog="tune export", description="Write recipe YAMLs for a study's best layouts.")
    add_storage(p)
    p.add_argument("--top", type=bounded_int(1, 1000), default=3, help="recipes to write, 1 to 1,000 (default 3)")
    p.add_argument("--out", required=True, help="folder; recipes go to OUT/<model>/<gpu>/<name>.yaml")
    p.add_argument("--model", help="the config.json a study was tuned on, when it was not a catalog model (checked "
                                   "against the architecture the study recorded)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the recipes written")
    return p


def report_parser():
    p = Parser(prog="tune report", description="A study as a self-contained HTML page: "
                                "OUT/index.html and its PNG figures (no JavaScript, no network).")
    add_storage(p)
    p.add_argument("--out", required=True, help="folder for index.html and its figures (made if missing)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the page written")
    return p


def predict_parser():
    p = Parser(prog="tune predict", description="Predict memory, step time and throughput of "
                                "one layout, from a recipe or from flags; or of many, one JSON request a line.")
    p.add_argument("--recipe", help="a recipe YAML (its model, GPU, workload and layout)")
    add_target(p, required=False)
    add_workload(p)
    p.set_defaults(framework=None)   # left out: the stack's own step (slime's for the image stack)
    add_layout(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--explain", action="store_true", help="print where the time and the memory go")
    p.add_argument("--stack", choices=STACK_NAMES, default="image",
                   help="image: the training image's Transformer Engine stack (default); megatron-runner: attune's "
                        "megatron runner (torch-native kernels), priced from its components measured on the GPU "
                        "(Megatron's own step: --framework megatron is implied)")
    p.add_argument("--recipe-out", help="write the predicted recipe for this layout")
    p.add_argument("--batch", metavar="REQUESTS.jsonl",
                   help="one JSON request a line (keys: " + ", ".join(REQUEST_KEYS) + "); '-' reads stdin; "
                        "prints one JSON object a line, in order, each with its request's line number: the result, "
                        "or {\"line\": N, \"error\": ...} for a request that cannot be answered (blank lines are "
                        f"skipped; lines up to {MAX_REQUEST_CHARS:,} characters, at most {MAX_BATCH_REQUESTS:,} "
                        "requests). Exit 0: every request answered with a result; 1: at least one error object; "
                        "2: the file cannot be read (a file of no request: 0, and a note on stderr says so)")
    return p


def models_parser():
    p = Parser(prog="tune models", description="The model catalog, or the models read from config.json files.")
    p.add_argument("model", nargs="*", metavar="MODEL",
                   help="catalog names or config.json paths to show (default: the whole catalog); a config.json "
                        "shows what tune reads from it: layers, experts, parameter counts")
    p.add_argument("--json", action="store_true")
    return p


def gpus_parser():
    p = Parser(prog="tune gpus", description="The GPU catalog, with the source of each figure.")
    p.add_argument("--json", action="store_true")
    return p


def profile_parser():
    p = Parser(prog="tune profile", description="Measure this machine's GPUs (GEMM, grouped GEMM, "
                                "attention, NCCL collectives, host transfers, CPU Adam) into a profile YAML, or "
                                "derive a profile for another GPU type from a measured one.")
    p.add_argument("--model", default=None, help="also measure this model's own GEMM and attention shapes")
    p.add_argument("--out", default=None, help="output YAML (default profile-<gpu>.yaml)")
    p.add_argument("--quick", action="store_true", help="small grids, for a smoke run")
    p.add_argument("--derive", metavar="GPU", help="write a profile for GPU derived from a measured one")
    p.add_argument("--from", dest="source", default="h200", help="the measured profile's GPU type (with --derive)")
    p.add_argument("--json", action="store_true", help="print what was written as one JSON object on stdout")
    return p


def trial_parser():
    p = Parser(prog="tune trial", description="Run one trial of one layout outside any study and "
                                "print its result (measured by the chosen backend).")
    add_target(p)
    add_workload(p)
    add_backend(p, default=None)
    add_layout(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--dry-run", action="store_true",
                   help="slime: print the Ray job the trial would submit (JSON) and submit nothing")
    return p


PARSERS = {"run": run_parser, "show": show_parser, "export": export_parser, "report": report_parser,
           "predict": predict_parser,
           "models": models_parser, "gpus": gpus_parser, "profile": profile_parser, "trial": trial_parser}
