"""The slime launch of a layout: the environment and the exact shell command of a recipe's `run`.

The command follows the reference recipes (`../shared/reference/recipes/qwen3.6-35b-a3b/h200/`)
line for line: the export lines, a blank line, then `python3 -m <entry> --async \\` with one flag
(or one fixed group of flags) per line. The layout's flags come from `search_space.megatron_args`
and sit where the reference puts them: parallel flags after `--debug-train-only`, then recompute,
then batching; offload flags between `--use-distributed-optimizer` and
`--use-precision-aware-optimizer`; an fp8 workload's flags (FP8_ARGS) after `--attention-backend flash`, then the
flex dispatcher flags (argparse keeps the later value, so they override the alltoall in slime's MODEL_ARGS). A dense
model's command has no expert flags (Megatron's defaults: EP 1, ETP = TP).

The model's architecture flags are `${MODEL_ARGS[@]}`, as in the reference. The first line of the
command is a comment naming the slime script that defines them (`slime_model_script`: only for the catalog model
that script defines, never for another config.json in a folder of its name), or the flags built from the config.

A workload the slime command does not set up (`unpriced_setup`: a Megatron-LM/Bridge step, LoRA, CUDA graphs,
images) keeps its recipe as the prediction it is, says so in a second comment line, and its launch stops at once.

The recipe keeps the leaderboard's format byte for byte; a job submitted to slime translates its shorthand
(`job_entry_words`: `--async` is the train_async.py entry, not a flag; `job_flags`: DEPRECATED_FLAGS replaced;
SHELL_ENV_INPUTS: what a shell env value needs computed on the cluster first). experiments.slime.runner does it.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from cost_model.metrics import PEFT_NAMES
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.hardware import GpuSpec, node_placement
from cost_model.nouns.model_spec import ModelSpec
from cost_model.nouns.workload import STEP_OPTION_DEFAULTS, Workload
from cost_model.nouns.layout import Layout
from cost_model.nouns.names import clean_name
from search_space.megatron_args import (batch_args, dispatcher_args, launch_model_args, moment_args, offload_args,
                                        parallel_args, recompute_args)

# Megatron's flags for the fp8 the cost model prices. Its fp8 GEMM rates are torch._scaled_mm with e4m3 x e4m3
# operands and one fp32 scale per tensor (experiments/checks/compute.py, cost_model/profile.py fp8_ratio), applied
# to every linear and expert GEMM, with fp8 copies of the linear layers' inputs saved for the backward
# (constants.yaml fp8_activation_factor); attention, embedding and LM head stay bf16. In Megatron/Transformer
# Engine that is `--fp8-format e4m3` (e4m3 for every fp8 tensor) with per-tensor current scaling,
# `--fp8-recipe tensorwise` (choices tensorwise, delayed, mxfp8, blockwise at slime's pin 1dcf0da). Blockwise
# (slime's own fp8 example) and mxfp8 (Blackwell) scale per block: GEMMs the profile did not measure.
FP8_ARGS = ("--fp8-format", "e4m3", "--fp8-recipe", "tensorwise")

# Flags of Megatron's expert grid: left out for a dense model (Megatron's defaults, EP 1 and ETP = TP, hold).
_EXPERT_FLAGS = ("--expert-model-parallel-size", "--expert-tensor-parallel-size")

ENTRY_MODULE = "<slime entry module>"

# `NCCL_NVLS_ENABLE` as slime's run scripts set it: 1 when `nvidia-smi topo -m` shows NVLink.
NVLS_EXPR = '$([ "$NVLINK_COUNT" -gt 0 ] && echo 1 || echo 0)'

# The rollout function of the reference runs: pre-tokenized fixed-length SFT rows.
ROLLOUT_FUNCTION = "pretokenized_sft_rollout.generate_rollout"

# slime's `scripts/models/*.sh` that define MODEL_ARGS, per catalog model (checked in THUDM/slime @624b824).
# qwen3.5-397B-A17B.sh exists only on a PR branch (refs/pull/2051), not on main; Qwen3.6-35B-A3B has
# the Qwen3.5-35B-A3B architecture, and slime's own qwen36 script just sources qwen3.5-35B-A3B.sh.
# slime has no script for Llama 3 (other than llama3.1-8B-Instruct.sh) or GPT-OSS on main.
_MODEL_SCRIPTS = {
    "qwen3.6-35b-a3b": "scripts/models/qwen3.5-35B-A3B.sh",
    "qwen3.5-35b-a3b": "scripts/models/qwen3.5-35B-A3B.sh",
    "qwen3.5-397b-a17b": "scripts/models/qwen3.5-397B-A17B.sh",
    "qwen3-30b-a3b": "scripts/models/qwen3-30B-A3B.sh",
    "qwen3-235b-a22b": "scripts/models/qwen3-235B-A22B.sh",
    "qwen3-next-80b-a3b": "scripts/models/qwen3-next-80B-A3B.sh",
    "deepseek-v3": "scripts/models/deepseek-v3.sh",
    "moonlight-16b-a3b": "scripts/models/moonlight.sh",
    "qwen3.5-27b": "scripts/models/qwen3.5-27B.sh",
    "qwen3.5-4b": "scripts/models/qwen3.5-4B.sh",
    "qwen3.5-0.8b": "scripts/models/qwen3.5-0.8B.sh",
    "glm4.5": "scripts/models/glm4.5-355B-A32B.sh",
    "glm4.5-air": "scripts/models/glm4.5-106B-A12B.sh",
}

# Fixed groups of the reference command, each printed on one line.
_OPTIMIZER_LINES = (
    ("--optimizer", "adam", "--lr", "1e-5", "--lr-decay-style", "cosine", "--min-lr", "1e-6"),
    ("--lr-warmup-fraction", "0.1", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98"),
)
_MISC_LINES = (
    ("--attention-dropout", "0.0", "--hidden-dropout", "0.0"),
    ("--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32"),
    ("--attention-backend", "flash"),
)


class CommandError(AttuneError, ValueError):
    """A value that would change the shape of the shell command (a newline or other control character)."""


# A control character in a word would add a line (a newline) or hide text (an escape) in the command.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Raw(str):
    """A shell word written as is (a "$VAR" placeholder, an array expansion), never quoted."""


# Where slime's MODEL_ARGS script's flags go in the command (a line of its own in the recipe).
MODEL_ARGS = Raw("${MODEL_ARGS[@]}")

# The recipe's cluster paths: shell variables the recipe's reader sets.
PLACEHOLDERS = {name: Raw(f'"${name}"') for name in ("HF_CKPT", "TORCH_DIST", "SFT_DATA", "PROFILE_DIR")}


def slime_model_script(model: ModelSpec) -> str | None:
    """slime's MODEL_ARGS script for the model, relative to the slime checkout
    (e.g. 'scripts/models/qwen3.5-35B-A3B.sh'); None when slime has none for it. The script defines one
    architecture: it serves only the catalog model it is listed for (`catalog_twin`), never another config.json
    that happens to sit in a folder of that model's name."""
    key = catalog_twin(model)
    return _MODEL_SCRIPTS[key] if key is not None else None


def catalog_twin(model: ModelSpec) -> str | None:
    """The catalog key, among those slime has a script for, of the model `model` is: the catalog model itself, or
    a config.json equal to it in every field but its names (launch-only fields too: slime's script sets the RoPE base
    and norm epsilon). None: no script defines this model."""
    from dataclasses import replace

    from cost_model.nouns.model_spec import catalog_names, load_model

    known = set(catalog_names())
    keys = sorted(_MODEL_SCRIPTS, key=lambda k: k != model.name)   # its own name first
    for key in keys:
        if key not in known:
            continue
        catalog = load_model(key)
        if replace(model, name=catalog.name, display_name=catalog.display_name, hf_repo=catalog.hf_repo) == catalog:
            return key
    return None


def _no_script(model: ModelSpec) -> str:
    """Why the launch does not source a slime script for the model (see `slime_model_script`)."""
    shown_model = clean_name(model.display_name)
    if model.name in _MODEL_SCRIPTS:   # a config.json in a folder named like a catalog model, of another architecture
        return (f"{shown_model}'s config.json is not the architecture slime's {_MODEL_SCRIPTS[model.name]} "
                f"defines")
    return f"slime has no scripts/models script for {shown_model}"


def slime_loss_mask_type(model: ModelSpec) -> str | None:
    """slime's `--loss-mask-type` (choices qwen, qwen3, qwen3_5, distill_qwen at 624b824: Qwen chat templates
    only) for the model's chat template; None (the flag left out) for a model of another family.

    Neither value changes the reference run: its pre-tokenized rows carry their own loss mask, and attune's
    rollout function never builds one. A Qwen3.5/3.6 model names qwen3_5 (the reference recipes), Qwen3 qwen3,
    Qwen2 qwen (slime's default, its ChatML template); for Llama, Mistral, DeepSeek, GLM or GPT-OSS no choice is
    their template, so the command does not claim one (slime's default applies and is not read).
    """
    if model.model_type.startswith("qwen3_5"):
        return "qwen3_5"
    if model.model_type in ("qwen3", "qwen3_moe", "qwen3_next"):
        return "qwen3"
    if model.model_type in ("qwen2", "qwen2_moe"):
        return "qwen"
    return None


# What each step option (`STEP_OPTION_DEFAULTS`) asks that slime's command does not set up, in words.
_UNSET_UP = {"peft": lambda v: f"{PEFT_NAMES.get(v, v)} adapters on a frozen base (--peft {v})",
             "cuda_graphs": lambda v: f"CUDA graphs (--cuda-graphs {v})",
             "images_per_row": lambda v: f"{v} image(s) per row through the vision encoder"}


def unpriced_setup(workload: Workload) -> str | None:
    """What the cost model priced that slime's command does not set up (None: the command runs the priced job):
    a Megatron-LM/Bridge step, LoRA on a frozen base, CUDA graphs, images through a vision encoder. The command
    trains every weight of the model on pre-tokenized text rows with slime's eager step."""
    parts = []
    if workload.framework != "slime":
        parts.append(f"a Megatron-LM/Bridge step (--framework {workload.framework})")
    options = workload.step_options
    for name in STEP_OPTION_DEFAULTS:
        if name in options:
            parts.append(_UNSET_UP[name](options[name]))
    if not parts:
        return None
    return ("the prediction is of " + ", ".join(parts) + ", which this slime command does not set up: it would run "
            "slime's full fine-tuning of text rows, another job")


def precision_args(workload: Workload) -> list[str]:
    """The workload's precision as Megatron's flags: none for bf16 (the reference's), FP8_ARGS for fp8."""
    return list(FP8_ARGS) if workload.precision == "fp8" else []


def launch_model_args_for(model: ModelSpec, layout: Layout) -> tuple[list[str] | None, str]:
    """`launch_model_args`, with its MoE dispatcher left out where the layout's own flags set another (flex): the
    command then names the dispatcher once."""
    built, missing = launch_model_args(model)
    if built is None or "--moe-token-dispatcher-type" not in dispatcher_args(layout):
        return built, missing
    built = list(built)
    i = built.index("--moe-token-dispatcher-type") if "--moe-token-dispatcher-type" in built else None
    if i is not None:
        del built[i:i + 2]
    return built, missing


def actor_placement(layout: Layout, gpu: GpuSpec) -> tuple[int, int]:
    """(--actor-num-nodes, --actor-num-gpus-per-node): ceil(world / GPUs per node) nodes, the same
    number of GPUs on each. Raises HardwareError (a ValueError) when the world size does not split evenly over them."""
    return node_placement(gpu, layout.world_size)


def slime_env(layout: Layout, gpu: GpuSpec) -> dict[str, str]:
    """The run's environment variables, in the reference recipes' order. The flex dispatcher adds
    NVSHMEM_DISABLE_NCCL=1, as slime's DeepEP run scripts (e.g. run-qwen3.5-35B-A3B-sft.sh) set it. The EP
    all-to-all overlap needs more than one CUDA connection (Megatron's MoE README: "CUDA_DEVICE_MAX_CONNECTIONS > 1";
    its arguments check suggests 32): 1 would serialise the streams it overlaps."""
    env = {
        "CUDA_DEVICE_MAX_CONNECTIONS": "32" if layout.overlap_moe_expert_parallel_comm else "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "NCCL_NVLS_ENABLE": NVLS_EXPR,
    }
    if layout.dispatcher == "flex":
        env["NVSHMEM_DISABLE_NCCL"] = "1"
    return env


def entry_words(python: str, entry_module: str) -> tuple[str, ...]:
    """The command's first words: `PYTHON -m ENTRY --async`, or `PYTHON ENTRY --async` for a script path (.py)."""
    if entry_module.endswith(".py"):
        return (python, entry_module, "--async")
    return (python, "-m", entry_module, "--async")


# --- the recipe's format as a job slime accepts ------------------------------------------------------------
# The format's `--async` is no slime flag (slime ignores unknown flags): it names slime's asynchronous entry,
# which slime's run scripts launch as `python3 train_async.py` from the checkout.
ASYNC_ENTRY = "train_async.py"

# Flags current Megatron-LM deprecates, as the job passes them instead (the recipe keeps the leaderboard's):
# TransformerConfig warns "moe_enable_deepep is deprecated. Please use --moe-flex-dispatcher-backend=deepep
# instead." (megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM main and 1dcf0da, the commit
# slime's image pins), and sets moe_flex_dispatcher_backend = "deepep" from it.
DEPRECATED_FLAGS = {"--moe-enable-deepep": ("--moe-flex-dispatcher-backend", "deepep")}

# Environment values the format writes as shell, and the lines that compute their inputs on the cluster first,
# as slime's run scripts do (e.g. scripts/run-qwen3.5-35B-A3B-sft.sh): NVLINK_COUNT from `nvidia-smi topo -m`.
SHELL_ENV_INPUTS = {NVLS_EXPR: "NVLINK_COUNT=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)"}


def job_entry_words(python: str, entry: str | None = None) -> tuple[str, ...]:
    """The job's first words for the format's `PYTHON -m <entry> --async`: `PYTHON train_async.py` (the
    entry `--async` names) by default; `PYTHON ENTRY` for a script path (.py), `PYTHON -m ENTRY` for a module.
    `--async` itself is dropped: slime has no such flag."""
    entry = entry or ASYNC_ENTRY
    return (python, entry) if entry.endswith(".py") else (python, "-m", entry)


def job_flags(words: list[str]) -> tuple[list[str], list[str]]:
    """The flags with each deprecated one replaced (DEPRECATED_FLAGS), and a note per replacement."""
    out, notes = [], []
    for word in words:
        if word in DEPRECATED_FLAGS:
            replacement = DEPRECATED_FLAGS[word]
            out += replacement
            notes.append(f"{word} (deprecated in Megatron-LM) passed as {' '.join(replacement)}")
        else:
            out.append(word)
    return out, notes


def slime_flag_lines(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, *, num_rollout: int,
                     paths: Mapping[str, str] = PLACEHOLDERS) -> list[tuple[str, ...]]:
    """The flags after `--async`, one tuple per line of the recipe's command, in the reference's order.

    `(MODEL_ARGS,)` stands where the model's architecture flags go; `paths` gives the values of
    $HF_CKPT, $TORCH_DIST, $SFT_DATA and $PROFILE_DIR (the recipe keeps the shell variables, a runner
    passes the cluster's paths). Raises HardwareError (a ValueError) when the world size does not split over the nodes."""
    nodes, per_node = actor_placement(layout, gpu)
    return [
        ("--actor-num-nodes", str(nodes)),
        ("--actor-num-gpus-per-node", str(per_node)),
        (MODEL_ARGS,),
        ("--hf-checkpoint", paths["HF_CKPT"]),
        ("--ref-load", paths["TORCH_DIST"]),
        ("--rollout-function-path", ROLLOUT_FUNCTION),
        ("--prompt-data", paths["SFT_DATA"]),
        ("--input-key", "messages"),
        ("--metadata-key", "metadata"),
        ("--num-rollout", str(num_rollout)),
        ("--rollout-batch-size", str(workload.global_batch)),
        ("--global-batch-size", str(workload.global_batch)),
        ("--loss-type", "sft_loss"),
        *([("--loss-mask-type", mask)] if (mask := slime_loss_mask_type(model)) else []),
        ("--calculate-per-token-loss",),
        ("--disable-compute-advantages-and-returns",),
        ("--debug-train-only",),
        *[line for line in per_flag(parallel_args(layout)) if model.is_moe or line[0] not in _EXPERT_FLAGS],
        *per_flag(recompute_args(layout)),
        *per_flag(batch_args(layout)),
        *_OPTIMIZER_LINES,
        ("--use-distributed-optimizer",),
        *per_flag(offload_args(layout)),
        ("--use-precision-aware-optimizer",),
        *per_flag(moment_args(layout)),
        *_MISC_LINES,
        *([tuple(fp8)] if (fp8 := precision_args(workload)) else []),
        *per_flag(dispatcher_args(layout)),
        ("--distributed-timeout-minutes", "30"),
        ("--tensorboard-dir", paths["PROFILE_DIR"]),
    ]


def slime_run(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, *,
              num_rollout: int = 20, entry_module: str = ENTRY_MODULE) -> str:
    """The exact shell command of the recipe's `run` (ends with a newline)."""
    lines = slime_flag_lines(model, gpu, workload, layout, num_rollout=num_rollout)
    script = slime_model_script(model)
    built, missing = (None, "") if script else launch_model_args_for(model, layout)
    # the display name comes from a user's config.json: one printable line, never a shell line of its own
    if script:
        comment = f"# MODEL_ARGS: source <slime>/{script}"
    elif built is not None:
        comment = (f"# MODEL_ARGS: {_no_script(model)}; built from its config: "
                   + " ".join(shlex.quote(a) for a in built))
    else:
        comment = f"# MODEL_ARGS: {_no_script(model)}; define MODEL_ARGS ({missing})"
    out = [comment]
    unpriced = unpriced_setup(workload)
    if unpriced:
        out.append(f"# NOT THE PRICED JOB: {unpriced}; its launch refuses to run")
    out += [f"export {name}={_env_value(value)}" for name, value in slime_env(layout, gpu).items()]
    out.append("")
    entry = Raw(entry_module) if re.fullmatch(r"<[\w .-]*>", entry_module) else entry_module
    return _script(out + _command_block(entry_words("python3", entry), lines), "command")


def _command_block(head, lines) -> list[str]:
    """The command as shell lines: `head` then one indented line per flag line, joined by continuations."""
    body = [_words(head)] + [_words(line) for line in lines]
    return [f"{'  ' if i else ''}{text} \\" for i, text in enumerate(body[:-1])] + [f"  {body[-1]}"]


def _script(out: list[str], what: str) -> str:
    """The lines as one text; every line is one written above, so none may hold a control character (a field
    that added a shell line of its own)."""
    bad = [line for line in out if _CONTROL.search(line)]
    if bad:
        raise CommandError(f"slime {what} line has a control character: {bad[0][:80]!r}")
    return "\n".join(out) + "\n"


LAUNCH_VARIABLES = ("SLIME_DIR", "HF_CKPT", "TORCH_DIST", "SFT_DATA", "PROFILE_DIR")


def slime_launch(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, *, num_rollout: int = 20,
                 title: str = "", rollout_dir: str = "") -> str:
    """A runnable bash launch of the recipe's `run`, as slime's own run scripts launch it: from slime's
    checkout ($SLIME_DIR), NVLINK_COUNT computed first, MODEL_ARGS sourced from slime's scripts/models, then
    `python3 train_async.py` with the recipe's flags (deprecated ones as current Megatron-LM takes them). The
    cluster's paths are variables the user sets; the script stops at once, naming the one unset. The rollout
    function (attune's pretokenized_sft_rollout.py) is imported from $ATTUNE_SLIME_FILES, by default
    `rollout_dir` (where it was at export)."""
    out = ["#!/usr/bin/env bash",
           f"# {clean_name(title)}: the recipe's run as a launch you can execute (bash this file; on a running Ray",
           "# cluster set RAY_ADDRESS to its dashboard). Set the variables below to your cluster's paths.",
           "set -eu   # not pipefail: NVLINK_COUNT's pipeline finds no NV link on a machine without one"]
    unpriced = unpriced_setup(workload)
    if unpriced:   # a job other than the one priced must not start (nor wait for paths set to start it)
        out.append(f"echo {shlex.quote('not launched: ' + unpriced)} >&2; exit 2")
    out += [f': "${{{name}:?set {name} (see the recipe)}}"' for name in LAUNCH_VARIABLES]
    out.append(f': "${{ATTUNE_SLIME_FILES:={shlex.quote(rollout_dir)}}}"   # the folder of pretokenized_sft_rollout.py')
    out.append('[ -f "$ATTUNE_SLIME_FILES/pretokenized_sft_rollout.py" ] || { echo "set ATTUNE_SLIME_FILES to the '
               'folder of attune\'s experiments/slime/pretokenized_sft_rollout.py" >&2; exit 2; }')
    out.append('export PYTHONPATH="$ATTUNE_SLIME_FILES:$SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}"')
    out.append('cd -- "$SLIME_DIR"')
    env = slime_env(layout, gpu)
    out += [SHELL_ENV_INPUTS[v] for v in dict.fromkeys(env.values()) if v in SHELL_ENV_INPUTS]
    out += [f"export {name}={_env_value(value)}" for name, value in env.items()]
    out += _ray_job_lines(("PYTHONPATH", *env))
    script = slime_model_script(model)
    built, missing = (None, "") if script is not None else launch_model_args_for(model, layout)
    if script is not None:
        out.append(f"source {shlex.quote(script)}   # MODEL_ARGS")
    elif built is not None:   # slime's scripts/models/*.sh define this array; here it is built from the config
        out.append("MODEL_ARGS=(" + " ".join(shlex.quote(a) for a in built) + ")   # from the model's config.json")
    else:
        why = f"{_no_script(model)} and {missing}: define MODEL_ARGS here"
        out.append(f"echo {shlex.quote(why)} >&2; exit 2")
    lines = [tuple(QUOTED_MODEL_ARGS if w == MODEL_ARGS else w for w in job_flags(list(line))[0])
             for line in slime_flag_lines(model, gpu, workload, layout, num_rollout=num_rollout)]
    # "$@": the ray job submit words where RAY_ADDRESS names a running cluster (_ray_job_lines), else none
    head = (Raw('"$@"'), "python3", Raw(f'"$SLIME_DIR"/{ASYNC_ENTRY}'))
    return _script(out + _command_block(head, lines), "launch")


# The launch expands MODEL_ARGS quoted: a word such as '[1]*32' (Mixtral's --moe-layer-freq) stays one word even
# where a file matches it as a glob (the recipe's `run` keeps the format's unquoted spelling).
QUOTED_MODEL_ARGS = Raw('"${MODEL_ARGS[@]}"')


def _ray_job_lines(names) -> list[str]:
    """On a Ray cluster already running (RAY_ADDRESS: its dashboard, http://HEAD:8265), slime's actors start in the
    cluster's own processes, which see none of this script's exports: the job is submitted with them as its runtime
    environment, as slime's run scripts submit theirs. Without RAY_ADDRESS slime starts Ray here, its workers
    inheriting the exports."""
    words = " ".join(names)
    return ["set --",
            'if [ -n "${RAY_ADDRESS:-}" ]; then   # a running cluster: its actors get the exports as the job\'s env',
            "  RUNTIME_ENV_JSON=$(python3 -c 'import json, os, sys; print(json.dumps({\"env_vars\": "
            f"{{k: os.environ[k] for k in sys.argv[1:]}}}}))' {words})",
            '  set -- ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$RUNTIME_ENV_JSON" --',
            "fi"]


def flat(lines: list[tuple[str, ...]]) -> list[str]:
    """The words of the command lines, in order, as plain strings (an argument list)."""
    return [str(word) for line in lines for word in line]


def per_flag(args: list[str]) -> list[tuple[str, ...]]:
    """Split a flat argument list into one tuple per flag (the flag and its values)."""
    groups: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return [tuple(g) for g in groups]


def _words(words) -> str:
    """The words as shell text: each quoted (shlex) unless Raw; a control character in any word refused."""
    for w in words:
        if _CONTROL.search(str(w)):
            raise CommandError(f"slime command word {str(w)[:80]!r} has a control character (a newline would "
                               f"add a shell line)")
    return " ".join(w if isinstance(w, Raw) else shlex.quote(str(w)) for w in words)


def _env_value(value: str) -> str:
    # A known command substitution (NCCL_NVLS_ENABLE) is evaluated by the shell, as in the reference;
    # any other value is quoted.
    return value if value in SHELL_ENV_INPUTS else shlex.quote(value)
