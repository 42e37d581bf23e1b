"""Recipe files: export a predicted layout in the leaderboard's recipe format, and load one back.

The format is the reference recipes' (`../shared/reference/recipe-format.md` and the two examples
beside it): the same field groups, keys and nesting, in the same order. What a prediction does not
know (the image's versions, the dataset, measured figures, correctness checks) is null, or a string
saying "not measured (predicted)". The prediction itself is kept under `result.predicted`.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from cost_model.metrics import mfu_counting
from cost_model.nouns.case import Case
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.hardware import GpuSpec, HardwareError, load_gpu
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import layout_from_recipe_block, recipe_block
from cost_model.nouns.model_spec import ModelError, ModelSpec, catalog_names, load_model
from cost_model.nouns.names import file_name, shown
from cost_model.predict import Prediction, microbatches
from cost_model.nouns.stack import Stack
from cost_model.nouns.user_file import parse_yaml, read_user_text
from cost_model.nouns.workload import STEP_OPTION_DEFAULTS, Workload, WorkloadError
from recipes.correctness import CorrectnessError, correctness_block
from recipes.files import LinkedTarget, write_atomic
from recipes.slime_command import actor_placement, slime_env, slime_run, unpriced_setup
from search_space.enumerate import MAX_GPUS
from search_space.rules import STACK, violations

SCHEMA_VERSION = 1
NOT_MEASURED = "not measured (predicted)"
STEPS_PER_RUN = 20
WINDOW = (5, 19)  # measured steps, inclusive


class RecipeError(AttuneError, ValueError):
    """A recipe file that cannot be read, or whose fields do not describe a valid run. One line."""


@dataclass(frozen=True)
class LoadedRecipe:
    case: Case    # its stack: the one the layout was checked against (Stack() when none was given)
    data: dict    # the recipe file as read


# ---------------------------------------------------------------------------- building
def build_recipe(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout, prediction: Prediction, *,
                 status: str = "predicted", stack_note: str | None = None, headline: float | None = None) -> dict:
    """A predicted layout's recipe, every group of the reference ones, led by `headline` (posterior median) if given."""
    from tuner.model_identity import full_digest
    _, mfu, usd = prediction.figures_at(tokens := headline or prediction.tokens_per_s_per_gpu)
    _, per_node = actor_placement(layout, gpu)
    window_steps = WINDOW[1] - WINDOW[0] + 1
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model.display_name,
        "gpu": {
            "type": gpu.display_name,
            "memory_gb": _number(gpu.memory_gb),
            "count": layout.world_size,
            "per_node": per_node,
            "instance": gpu.instance,
        },
        "author": {"name": "attune-llm", "url": None},
        "status": status,
        "stack": _stack_block(gpu, workload, stack_note, per_node),
        "workload": _workload_block(workload),
        "layout": layout_block(layout, workload, model.is_moe),
        "result": {
            "tokens_per_s_per_gpu": round(tokens, 2),
            "usd_per_million_tokens": round(usd, 2),
            "step_time_cv_percent": None,
            "mfu": round(mfu, 4),
            "mfu_note": f"predicted: 6 x active params x tokens/s per GPU / {mfu_counting(gpu, workload, mfu)}",
            "active_params": {
                "count": model.params.active_non_embedding,
                "source": f"https://huggingface.co/{model.hf_repo}" if model.hf_repo else None,
                "revision": None,
                # the digest of the model priced (tuner.model_identity): read back with another model of its
                # name (a config.json named like a catalog model), its figures would be that model's
                "architecture": full_digest(model),
            },
            "measured": None,
            "steps_per_run": STEPS_PER_RUN,
            "window": list(WINDOW),
            "window_tokens": window_steps * workload.global_batch * workload.seq_len,
            "runs": 0,
            "profiler": None,
            "gpu_hours": None,
            "gpu_hours_note": NOT_MEASURED,
            "predicted": _predicted_block(prediction, gpu, headline),
        },
        "correctness": {
            "result": "not run",
            "summary": "not run: a predicted layout; no component tests or convergence check yet",
            "reference": None,
            "configuration": "not run",
            "component_tests": [],
            "convergence": {
                "steps": None,
                "result": None,
                "correlation": None,
                "final_loss_difference": None,
                "pointwise_failures": None,
                "note": "not run",
            },
            "rules": None,
        },
        "env": slime_env(layout, gpu),
        "patches": [],
        "run": slime_run(model, gpu, workload, layout, num_rollout=STEPS_PER_RUN),
    }


def _stack_block(gpu: GpuSpec, workload: Workload, stack_note: str | None, per_node: int) -> dict:
    """The recipe's `stack` group: versions not read from any image (null), and what the framework is; a workload
    slime's command does not set up (`unpriced_setup`) says so, and that its launch stops."""
    unpriced = unpriced_setup(workload)
    return {
        "framework": (f"slime (Megatron backend); version {NOT_MEASURED}" if not unpriced else
                      f"{'Megatron-LM/Bridge' if workload.framework != 'slime' else 'slime (Megatron backend)'} as "
                      f"the cost model priced it (the workload fields beyond the format say how): {unpriced}; the "
                      f"launch beside this recipe stops at once; version {NOT_MEASURED}"),
        "megatron_lm": None,
        "transformer_engine": None,
        "pytorch": None,
        "cuda": None,
        "nccl": None,
        "deepep": None,
        "python": None,
        "network": _network(gpu, per_node),
        "source": stack_note or f"{NOT_MEASURED}: no training image was inspected",
    }


def layout_block(layout: Layout, workload: Workload, moe: bool) -> dict:
    """The recipe's `layout` group: its prose (label, summary, highlights), then the codec's layout fields."""
    block = {"label": layout.label, "summary": layout_summary(layout, workload, moe),
             "highlights": layout_highlights(layout), **recipe_block(layout)}
    if not moe:   # a dense model routes no tokens: no dispatcher (load_recipe reads null back as the default)
        block["dispatcher"] = None
    return block


def _schedule_note(layout: Layout, workload: Workload) -> str:
    """Where slime's schedule runs other micro-batches than full bins of the layout's rows (it halves bins until
    each rank has as many as DP, x PP under VPP, ask; a step's last bin holds what is left), what it runs."""
    if workload.framework != "slime":
        return ""
    mean, n_mb, largest = microbatches(layout, workload)
    full = layout.rows_per_microbatch * workload.seq_len / layout.cp
    if mean == largest == full:
        return ""
    rows = largest * layout.cp / workload.seq_len
    return (f" (slime's schedule: {n_mb} micro-batches a rank, the largest of {rows:g} row{'s' if rows != 1 else ''}, "
            f"{mean * layout.cp / workload.seq_len:g} on average on the busiest rank)")


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def layout_summary(layout: Layout, workload: Workload, moe: bool) -> str:
    """One sentence, worded as the reference recipes' `layout.summary` (a dense model's has no dispatcher)."""
    grid = [f"TP {layout.tp}", f"PP {layout.pp}"]
    if layout.vpp > 1:
        grid.append(f"VPP {layout.vpp}")
    grid += [f"CP {layout.cp}"] + ([f"EP {layout.ep}", f"ETP {layout.etp}"] if moe else []) + [f"DP {layout.dp}"]
    n = layout.rows_per_microbatch
    count = _NUMBER_WORDS[n] if n < len(_NUMBER_WORDS) else f"{n:,}"
    rows = f"{count} {workload.seq_len:,}-token row{'s' if n != 1 else ''} per microbatch"
    if layout.cp > 1:
        rows += f", split over CP {layout.cp}"
    rows += _schedule_note(layout, workload)
    if layout.recompute_granularity == "full":
        k = layout.recompute_num_layers
        recompute = f"full recompute ({layout.recompute_method}, {k} layer{'s' if k != 1 else ''})"
    elif layout.recompute_granularity == "selective":
        recompute = f"selective recompute ({', '.join(layout.selective_modules)})"
    else:
        recompute = "no recompute"
    dispatcher = "flex dispatcher (DeepEP)" if layout.dispatcher == "flex" else f"{layout.dispatcher} dispatcher"
    if layout.overlap_moe_expert_parallel_comm:
        dispatcher += " with EP all-to-all overlap"
    parts = [", ".join(grid), rows, recompute] + ([dispatcher] if moe else [])
    optimizer = "precision-aware distributed optimizer" + (
        f" with {layout.exp_avg_dtype} Adam moments" if layout.exp_avg_dtype != "fp32" else "")
    if layout.offloaded:
        offload = "CPU optimizer offload"
        if layout.optimizer_offload_fraction != 1.0:
            offload += f" ({layout.optimizer_offload_fraction:.0%} of the states)"
        if layout.overlap_d2h_h2d:
            offload += " with D2H/H2D overlap"
        parts += [offload, optimizer]
    else:
        parts += [optimizer, "no offload"]
    return "; ".join(parts)


def layout_highlights(layout: Layout) -> str:
    """The short `layout.highlights` line (the references: "max 8,192 tokens/GPU, no offload")."""
    items = [f"max {layout.max_tokens_per_gpu:,} tokens/GPU"]
    if layout.dispatcher == "flex":
        items.append("DeepEP flex dispatcher")
    if layout.recompute_granularity == "selective":
        items.append("selective recompute")
    elif layout.recompute_granularity is None:
        items.append("no recompute")
    if not layout.offloaded:
        items.append("no offload")
    return ", ".join(items)


def _workload_block(workload: Workload) -> dict:
    block = {
        "row_tokens": workload.seq_len,
        "rows": f"fixed {workload.seq_len:,}-token SFT rows; dataset {NOT_MEASURED}",
        "global_batch": workload.global_batch,
        "precision": workload.precision,
        "dataset": {
            "name": None,
            "source": None,
            "revision": None,
            "license": None,
            "rows_sha256": None,
            "build": {
                "name": None,
                "tokenizer": None,
                "loss_mask": None,
                "rows": None,
                "row_tokens": workload.seq_len,
                "padding_tokens": None,
                "seed": None,
                "packing": None,
                "supervised_token_ratio": None,
                "parquet_sha256": None,
                "parquet_bytes": None,
                "builder": None,
            },
        },
    }
    if workload.routing != "natural":
        block["routing"] = workload.routing  # an extension: the format has no routing field
    # Extensions too, only when set: a Megatron-LM/Bridge step the cost model priced (LoRA, images, CUDA graphs),
    # which slime's command in `run` does not set up; recipes of slime workloads stay in the format as it is.
    if workload.framework != "slime":
        block["framework"] = workload.framework
    block.update(workload.step_options)
    return block


def _network(gpu: GpuSpec, per_node: int) -> str:
    per_node_tbps = gpu.internode_gb_s * 8 * gpu.gpus_per_node / 1000
    placed = "" if per_node == gpu.gpus_per_node else f" (this run places {per_node} on each)"
    return (f"{gpu.gpus_per_node} GPUs per node{placed}, {per_node_tbps:g} Tb/s inter-node per node "
            f"(cost-model catalog figure for {gpu.instance}; {NOT_MEASURED})")


def _predicted_block(prediction: Prediction, gpu: GpuSpec, headline: float | None = None) -> dict:
    block = _rounded(prediction.to_dict())
    block["usd_per_gpu_hour"] = _number(gpu.usd_per_gpu_hour)
    if headline is not None and round(headline, 2) != round(prediction.tokens_per_s_per_gpu, 2):
        # two predicted tokens/s in one file: say which is which (tune predict's line says the same)
        block["note"] = (f"the shipped model's own prediction, one of the hypotheses, with its breakdown: "
                         f"{prediction.tokens_per_s_per_gpu:,.0f} tokens/s/GPU; a predicted recipe's result."
                         f"tokens_per_s_per_gpu, mfu and usd_per_million_tokens are the hypotheses' posterior "
                         f"median ({headline:,.0f} tokens/s/GPU), what tune ranks by")
    return block


def _rounded(value, digits: int = 6):
    """Floats to `digits` significant digits, recursively (a readable YAML)."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return value
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    return value


def _number(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


# ---------------------------------------------------------------------------- naming and writing
def recipe_name(layout: Layout) -> str:
    """A file-name slug, unique per distinct layout, e.g. 'tp1-pp1-ep8-dp8-mt8192-full1'."""
    parts = [f"tp{layout.tp}", f"pp{layout.pp}"]
    if layout.vpp > 1:
        parts.append(f"vpp{layout.vpp}")
    if layout.cp > 1:
        parts.append(f"cp{layout.cp}")
    parts.append(f"ep{layout.ep}")
    if layout.etp != layout.tp:   # ETP is TP unless set (Megatron's default): a dense model's name has none
        parts.append(f"etp{layout.etp}")
    parts += [f"dp{layout.dp}", f"mt{layout.max_tokens_per_gpu}"]
    if layout.rows_per_microbatch != 1:
        parts.append(f"r{layout.rows_per_microbatch}")
    if layout.recompute_granularity == "full":
        method = "" if layout.recompute_method == "uniform" else f"{layout.recompute_method}"
        parts.append(f"full{method}{layout.recompute_num_layers}")
    elif layout.recompute_granularity == "selective":
        parts.append("-".join(("sel", *layout.recompute_modules)))
    else:
        parts.append("norc")
    if layout.offloaded:
        parts.append(f"off{layout.optimizer_offload_fraction:g}" + ("-ov" if layout.overlap_d2h_h2d else ""))
    if layout.dispatcher != "alltoall":
        parts.append(layout.dispatcher)
    if layout.overlap_moe_expert_parallel_comm:
        parts.append("a2aov")
    if layout.exp_avg_dtype != "fp32":
        parts.append(f"adam{layout.exp_avg_dtype}")
    return "-".join(parts)


def recipe_path(out_dir: str | os.PathLike, model: ModelSpec, gpu: GpuSpec, name: str) -> Path:
    """out_dir/<model>/<gpu>/<name>.yaml, as the leaderboard lays recipes out."""
    # the model's name may come from a user's config.json (its folder's name): one safe path component each
    stem = name[:-len(".yaml")] if name.endswith(".yaml") else name
    return Path(out_dir) / file_name(model.name, "model") / file_name(gpu.name, "gpu") / f"{file_name(stem)}.yaml"


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_recipe(recipe: dict) -> str:
    """The recipe as YAML text: block style, keys in insertion order, multi-line strings as `|` blocks."""
    return yaml.dump(recipe, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=116)  # 116: the width that reproduces the reference recipes byte for byte


STATUS_RANK = {"predicted": 0, "measured": 1, "verified": 2}


def _run_identity(recipe: dict) -> tuple:
    """What run a recipe describes: model, GPUs, workload and layout (not its labels, dataset or results)."""
    gpu = recipe.get("gpu") if isinstance(recipe.get("gpu"), dict) else {}
    workload = {k: v for k, v in (recipe.get("workload") or {}).items() if k not in ("rows", "dataset")}
    layout = {k: v for k, v in (recipe.get("layout") or {}).items() if k not in ("label", "summary", "highlights")}
    return (recipe.get("model"), gpu.get("type"), gpu.get("count"), repr(sorted(workload.items())),
            repr(sorted(layout.items())))


def _architecture(recipe: dict):
    """The model's architecture digest a recipe records (None: the leaderboard's, or an older export's)."""
    result = recipe.get("result")
    params = result.get("active_params") if isinstance(result, dict) else None
    return params.get("architecture") if isinstance(params, dict) else None


def replacing(recipe: dict, path: Path) -> str | None:
    """Why `recipe` must not replace the file at `path` (None: it may, with the evidence there carried over):
    a file that is no recipe, a recipe of another run (same layout name, another batch, model or workload), or
    one with stronger evidence (measured or verified, against a prediction). Component tests recorded there that
    `recipe` lacks are added to it."""
    if not path.exists():
        return None
    try:
        old = _read_mapping(path)
    except RecipeError as e:
        return f"it is not a recipe tune can read ({e.one_line()})"
    if _run_identity(old) != _run_identity(recipe):
        return "it is a recipe of another run (model, GPUs, workload or layout differ)"
    if None not in (_architecture(old), _architecture(recipe)) and _architecture(old) != _architecture(recipe):
        return "it is a recipe of another model of that name (its architecture digest differs)"
    old_status, new_status = old.get("status"), recipe.get("status")
    if STATUS_RANK.get(old_status, 3) > STATUS_RANK.get(new_status, 0):
        return f"it is a {old_status} recipe and this one is {new_status}"
    from recipes.correctness import CorrectnessError, correctness_block, record_component_test
    try:
        kept = correctness_block(old).get("component_tests") or []
        have = {t.get("test") for t in correctness_block(recipe).get("component_tests") or []}
    except CorrectnessError:
        return None
    for entry in kept:
        if entry.get("test") not in have:
            record_component_test(recipe, entry)
    return None


def free_path(recipe: dict, path: Path) -> Path:
    """`path`, or the first of path-2, path-3, ... that `recipe` may replace (see `replacing`)."""
    candidate, n = path, 1
    while replacing(recipe, candidate) is not None:
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def write_recipe(recipe: dict, path: str | os.PathLike, *, guard: bool = True) -> Path:
    """Write the recipe atomically (a temporary file in the same directory, then a rename). `guard`: refuse
    (RecipeError) to replace a file `replacing` says must stay; commands that update a recipe they have just
    read pass False."""
    path = Path(path)
    why = replacing(recipe, path) if guard else None
    if why:
        raise RecipeError(f"{path}: not replaced: {why}; write to another file")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, dump_recipe(recipe))
    except LinkedTarget as e:
        raise RecipeError(str(e)) from None
    return path


# ---------------------------------------------------------------------------- loading
@lru_cache(maxsize=1)
def _catalog_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name in catalog_names():
        spec = load_model(name)
        index.setdefault(spec.display_name.lower(), name)
        index.setdefault(name.lower(), name)
    return index


class _Fields:
    """Typed access to one mapping of a recipe, raising one-line RecipeErrors that name the file and field."""

    def __init__(self, path: Path, data: dict, prefix: str = ""):
        self.path, self.data, self.prefix = path, data, prefix

    def fail(self, message: str):
        raise RecipeError(_one_line(f"{self.path}: {message}"))

    def where(self, key: str) -> str:
        return f"field '{self.prefix}{key}'"

    def get(self, key: str, required: bool = True):
        if key not in self.data:
            if required:
                self.fail(f"{self.where(key)} is missing")
            return None
        return self.data[key]

    def mapping(self, key: str) -> "_Fields":
        value = self.get(key)
        if not isinstance(value, dict):
            self.fail(f"{self.where(key)} must be a mapping, got {_kind(value)}")
        return _Fields(self.path, value, f"{self.prefix}{key}.")

    def str(self, key: str, required: bool = True) -> str | None:
        value = self.get(key, required)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(f"{self.where(key)} must be a non-empty string, got {_kind(value)}")
        return value

    def int(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{self.where(key)} must be an integer, got {_kind(value)}")
        return value


def load_recipe(path: str | os.PathLike, *, stack: Stack | None = None, model: ModelSpec | None = None) -> LoadedRecipe:
    """Read a recipe and map it back to a Case: the catalog model (or `model`, a user's config.json the recipe was
    exported from: the caller checks its digest) and GPU, the workload and the Layout.

    The layout is checked with `search_space.rules`: Megatron's and slime's rules always; the rules
    that depend on the training image (source `stack`) only when `stack` is given, since a recipe
    was run on its own image. Every failure raises RecipeError with one line naming the file.
    """
    path = Path(path)
    top = _Fields(path, _read_mapping(path))
    version = top.data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        top.fail(f"field 'schema_version' must be {SCHEMA_VERSION} (the recipe format this tune reads), got "
                 f"{str(version)[:40]}")
    if "correctness" in top.data:   # checked now: a command that records a result must not fail after its run
        try:
            correctness_block(top.data)
        except CorrectnessError as e:
            top.fail(str(e))
    model = model if model is not None else _model(top)
    gpu, world_size = _gpu(top)
    workload = _workload(top)
    layout_fields = top.mapping("layout")
    block = dict(layout_fields.data)
    if block.get("dispatcher", "") is None and not model.is_moe:   # a dense model's recipe names no dispatcher
        block["dispatcher"] = Layout.dispatcher
    try:
        layout = layout_from_recipe_block(block, world_size)
    except InvalidLayout as e:
        top.fail(f"field 'layout': invalid layout: {e}")
    if stack is None:
        found = [v for v in violations(layout, model, workload, Stack()) if v.source != STACK]
    else:
        found = violations(layout, model, workload, stack)
    if found:
        top.fail(f"invalid layout {layout.label}: " + "; ".join(str(v) for v in found))
    _check_says_its_layout(top, layout)
    _check_run_flags(top, model, gpu, workload, layout)
    case = Case(model, gpu, workload, layout, stack if stack is not None else Stack())
    return LoadedRecipe(case=case, data=top.data)


# The `run` command's parallel sizes, as Megatron's flags name them, against the layout's fields.
RUN_FLAGS = {"--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
             "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
             "--expert-tensor-parallel-size": "etp", "--num-virtual-stages-per-pipeline-rank": "vpp"}


def _check_says_its_layout(top: _Fields, layout: Layout) -> None:
    """The recipe's label and its command must describe its layout: a hand edit of one and not the others
    would run, or be read, as another layout."""
    label = (top.data.get("layout") or {}).get("label")
    if isinstance(label, str) and label.strip() and label.strip() != layout.label:
        top.fail(f"field 'layout.label' says {label.strip()[:60]!r} but the layout's fields are {layout.label!r}")
    run = top.data.get("run")
    if not isinstance(run, str):
        return
    for flag, value in _run_flag_values(run):
        field_name = RUN_FLAGS[flag]
        if not value.isdigit() or int(value) != getattr(layout, field_name):
            top.fail(f"field 'run' sets {flag} {value[:20]} but the layout has {field_name.upper()} "
                     f"{getattr(layout, field_name)}")


# The flags of `run` that the layout, the precision or the placement decide (beyond RUN_FLAGS' sizes): a hand edit
# of one of them and not of the layout would run another job than the one priced.
LAYOUT_FLAGS = ("--actor-num-nodes", "--actor-num-gpus-per-node", "--max-tokens-per-gpu", "--recompute-granularity",
                "--recompute-method", "--recompute-num-layers", "--recompute-modules", "--optimizer-cpu-offload",
                "--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
                "--exp-avg-dtype", "--exp-avg-sq-dtype", "--sequence-parallel", "--moe-token-dispatcher-type",
                "--moe-flex-dispatcher-backend", "--overlap-moe-expert-parallel-comm", "--fp8-format", "--fp8-recipe",
                "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                "--pipeline-model-parallel-layout")


def _check_run_flags(top: _Fields, model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout) -> None:
    """The layout's flags in `run` (LAYOUT_FLAGS) are the ones export writes for the recipe's layout, workload and
    GPU: each flag given with its values, none missing, none added."""
    run = top.data.get("run")
    if not isinstance(run, str) or not run.strip():
        return
    try:
        want = _flag_values(_command_words(slime_run(model, gpu, workload, layout)))
    except (AttuneError, ValueError):
        return   # a job export cannot write: its own checks say why elsewhere
    have = _flag_values(_command_words(run))
    for flag in LAYOUT_FLAGS:
        if have.get(flag) != want.get(flag):
            said = f"does not set {flag}" if flag not in have else f"sets {' '.join((flag, *have[flag]))[:80]}"
            wants = "none" if flag not in want else " ".join((flag, *want[flag]))[:80]
            top.fail(f"field 'run' {said} but its layout {layout.long_label} runs with {wants}")


def _command_words(run: str) -> list[str]:
    """The command's words as the shell splits them: comment lines dropped first (an apostrophe there is no quote to
    the shell), line continuations joined; a command the shell cannot split (an unbalanced quote) word by word, its
    quotes removed."""
    import shlex

    text = "\n".join(line for line in run.splitlines() if not line.lstrip().startswith("#")).replace("\\\n", " ")
    try:
        return shlex.split(text, comments=False)
    except ValueError:
        return [w.replace("'", "").replace('"', "") for w in text.split()]


def _flag_values(words: list[str]) -> dict[str, tuple[str, ...]]:
    """Each --flag of LAYOUT_FLAGS with the words after it up to the next flag."""
    out: dict[str, tuple[str, ...]] = {}
    for i, word in enumerate(words):
        if word in LAYOUT_FLAGS:
            values = []
            for w in words[i + 1:]:
                if w.startswith("--") or w.startswith("${"):
                    break
                values.append(w)
            out[word] = tuple(values)
    return out


def _run_flag_values(run: str) -> list[tuple[str, str]]:
    """(flag, value) of each parallel-size flag in the command as the shell would split it (quotes removed:
    `--tensor-model-parallel-size '4'` is 4), inside a bash array too (`ARGS=(--tensor-model-parallel-size 4)`).
    Comment lines are dropped first (an apostrophe there is no quote to the shell); a command the shell cannot
    split is read word by word, its quotes removed, so a quoted flag or value is still seen (`_command_words`)."""
    words = _command_words(run)
    out = []
    for i, word in enumerate(words):
        flag, eq, value = re.sub(r"^[A-Za-z_]\w*\+?=\(|^\(", "", word).partition("=")   # an array's first word
        if flag in RUN_FLAGS:
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            out.append((flag, value[:-1] if value.endswith(")") else value))   # an array's last word
    return out


def _read_mapping(path: Path) -> dict:
    text = read_user_text(path, RecipeError, "recipe file")
    data = parse_yaml(text, str(path), RecipeError)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of recipe fields at the top level, got {_top_kind(data)}")
    return data


def _model(top: _Fields) -> ModelSpec:
    name = top.str("model")
    key = _catalog_index().get(name.strip().lower())
    if key is None:
        shown = name if len(name) <= 60 else name[:57] + "..."
        top.fail(f"field 'model': unknown model '{shown}' (a recipe of your own config.json: pass that file with "
                 f"--model PATH); known: {', '.join(sorted({load_model(n).display_name for n in catalog_names()}))}")
    try:
        return load_model(key)
    except ModelError as e:
        top.fail(f"field 'model': {e}")


def _gpu(top: _Fields) -> tuple[GpuSpec, int]:
    """The catalog GPU and the GPU count."""
    gpu_fields = top.mapping("gpu")
    gpu_type = gpu_fields.str("type")
    try:
        gpu = load_gpu(gpu_type)
    except HardwareError as e:
        top.fail(f"field 'gpu.type': {e}")
    count = gpu_fields.int("count")
    if not 1 <= count <= MAX_GPUS:
        top.fail(f"field 'gpu.count' must be between 1 and {MAX_GPUS:,}, got {str(count)[:40]}")
    per_node = gpu_fields.data.get("per_node")
    if per_node is not None and (isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1
                                 or (count > per_node and count % per_node)):
        top.fail(f"field 'gpu.per_node' {str(per_node)[:40]} does not fit gpu.count {count} (whole nodes of "
                 f"per_node GPUs, or one node)")
    return gpu, count


def _workload(top: _Fields) -> Workload:
    w = top.mapping("workload")
    routing = w.str("routing", required=False) or "natural"
    # the extensions _workload_block writes, when present: their types are their defaults'
    optional = {"framework": "slime", **STEP_OPTION_DEFAULTS, "image_size": 448}
    extensions = {key: (w.int(key) if isinstance(default, int) else w.str(key))
                  for key, default in optional.items() if w.get(key, False) is not None}
    try:
        return Workload(seq_len=w.int("row_tokens"), global_batch=w.int("global_batch"),
                        precision=w.str("precision"), routing=routing, **extensions)
    except WorkloadError as e:
        top.fail(f"field 'workload': {e}")


def _top_kind(data) -> str:
    """What a file that is no recipe holds, by kind alone: its one value may be a password file's only line."""
    return {str: "text", list: "a list", type(None): "null"}.get(type(data), f"a {type(data).__name__} value")


def _kind(value) -> str:
    """A field's value for an error: a short word or number, else its kind and size (never the file's text)."""
    return shown(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())
