"""One what-if question for the cost model, from command-line flags or a JSON line.

A request is a mapping with the flags' names: model, gpu, gpus, seq_len, global_batch, precision,
routing, framework, cuda_graphs, peft, images_per_row, image_size, usd_per_gpu_hour, stack_fix,
layout {recipe layout keys}; or recipe (a path).
`tune predict` and `tune predict --batch` both resolve requests here, so the two never disagree.
"""
from __future__ import annotations

import json

from cost_model.nouns.hardware import load_gpu, node_placement
from cost_model.hypotheses import Interval as HypothesesInterval, default_hypotheses, predict_interval
from cost_model.nouns.model_spec import load_model
from cost_model.predict import Prediction, predict
from cost_model.profile import HardwareProfile
from cost_model.nouns.workload import Workload
from cost_model.nouns.case import Case
from cost_model.nouns.layout_codec import layout_from_values, layout_values
from tuner.intervals import own_prediction_interval, runner_priced
from search_space.enumerate import MAX_GPUS
from search_space.rules import check
from cost_model.nouns.stack import STACK_FIXES, STACK_NAMES, Stack
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown, shown_name
from tuner.interval import Interval
from tuner.model_identity import as_recorded_name, check_recipe_model

REQUEST_KEYS = ("model", "gpu", "gpus", "seq_len", "global_batch", "precision", "routing", "framework", "cuda_graphs",
                "peft", "images_per_row", "image_size", "usd_per_gpu_hour", "stack_fix", "stack", "layout", "recipe")
# Far above any cloud price; a bound keeps $/1M tokens a finite, printable figure.
MAX_USD_PER_GPU_HOUR = 1000
# `predict --batch`: one request is a few hundred characters; the bounds keep what one line or one
# batch can make the command read (and answer) finite, stdin included.
MAX_REQUEST_CHARS = 64 * 1024
MAX_BATCH_REQUESTS = 100_000


class RequestError(AttuneError, ValueError):
    """A request that cannot be answered; the message names the problem in one line."""


CASE_KEYS = ("model", "gpu", "gpus", "seq_len", "global_batch", "precision", "routing", "framework", "cuda_graphs",
             "peft", "images_per_row", "image_size", "layout")


def resolve(request: dict, notes: list[str] | None = None) -> Case:
    """The case a request asks about; `notes` gets what the answer's reader must know (a recipe whose model
    could not be checked, rows longer than a micro-batch's token cap)."""
    case = _resolve(request, notes)
    note = long_rows_note(case)
    if note and notes is not None:
        notes.append(note)
    return case


def long_rows_note(case: Case) -> str | None:
    """Where one row holds more tokens a GPU than max_tokens_per_gpu: slime still runs it, a row longer than the cap
    in a micro-batch of its own, so the layout's label (mt M) is not what a micro-batch holds; None otherwise."""
    layout, seq_len = case.layout, case.workload.seq_len
    per_gpu = seq_len / layout.cp
    if layout.max_tokens_per_gpu >= per_gpu:
        return None
    cp = f" ({per_gpu:,.0f} a GPU at CP {layout.cp})" if layout.cp > 1 else ""
    how = ("as slime packs them (a row longer than the cap gets a micro-batch of its own)" if case.stack.dynamic_batching
           else "as the megatron runner splits them (whole rows)")
    return (f"rows of {seq_len:,} tokens{cp} exceed max_tokens_per_gpu {layout.max_tokens_per_gpu:,}, so each "
            f"micro-batch holds one row, {how}: the prediction prices {per_gpu:,.0f} tokens a GPU per micro-batch")


def _resolve(request: dict, notes: list[str] | None) -> Case:
    if not isinstance(request, dict):
        raise RequestError("a request must be a JSON object")
    unknown = sorted(set(request) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(f"unknown request key(s) {', '.join(map(shown_name, unknown[:5]))}; known: {', '.join(REQUEST_KEYS)}")
    _check_types(request)
    name = request.get("stack")
    if name is not None and name not in STACK_NAMES:
        raise RequestError(f"unknown stack {shown_name(name)}; known: {', '.join(STACK_NAMES)}")
    fixes = request.get("stack_fix") or []
    if isinstance(fixes, str):
        fixes = [fixes]
    if request.get("recipe"):
        from recipes.recipe import load_recipe

        extra = [k for k in CASE_KEYS if k != "model" and request.get(k) not in (None, {}, [])]
        if request.get("stack") not in (None, "image"):   # a recipe runs on its training image (its source)
            extra.append("stack")
        if extra:
            raise RequestError(f"a request with a recipe takes its model, GPUs, workload and layout from it; drop "
                               f"{', '.join(extra)}")
        # a model given with a recipe is the config.json it was exported from (checked by digest below)
        loaded = load_recipe(request["recipe"], model=load_model(request["model"]) if request.get("model") else None)
        case = loaded.case
        if request.get("model"):
            case = case.replace(model=as_recorded_name(case.model, loaded.data.get("model")))
        # the recipe's name loads the catalog's model: a recipe exported from another model of that name (a
        # config.json named like it) records that model's digest, and would be priced as the catalog's
        note = check_recipe_model(loaded.data, case.model, request["recipe"])
        if note and notes is not None:
            notes.append(note)
        # A recipe was run on its own image; its stack carries the output-gate fix (see its stack block).
        return case.replace(gpu=case.gpu.with_price(request.get("usd_per_gpu_hour")),
                            stack=Stack.with_fixes(list(fixes) or ["output-gate-tp"]))
    if not request.get("model") or not request.get("gpu"):
        raise RequestError("a request needs a recipe, or a model, a gpu and a layout")
    model = load_model(request["model"])
    gpu = load_gpu(request["gpu"]).with_price(request.get("usd_per_gpu_hour"))
    gpus = request["gpus"] if request.get("gpus") is not None else gpu.gpus_per_node   # 0 is refused, not a node
    if not 1 <= gpus <= MAX_GPUS:
        raise RequestError(f"gpus must be between 1 and {MAX_GPUS:,}, got {shown(gpus)}")
    node_placement(gpu, gpus)   # slime runs the same number of GPUs on each node: HardwareError, one line
    name = request.get("stack") or "image"
    stack = Stack.named(name, list(fixes))
    given = {k: request[k] for k in ("seq_len", "global_batch", "precision", "routing", "framework",
                                     "cuda_graphs", "peft", "images_per_row", "image_size")
             if request.get(k) is not None}
    if "framework" not in given and Workload.framework not in stack.frameworks:
        given["framework"] = stack.frameworks[0]   # the stack runs one step only: naming the stack names it
    workload = Workload(**given)
    raw_layout = request.get("layout") or {}
    if not isinstance(raw_layout, dict):
        raise RequestError("layout must be a mapping of layout keys to values")
    layout = layout_from_values(raw_layout, gpus, workload.seq_len)
    if workload.framework not in stack.frameworks:
        runs = " or ".join(_STEPS[f] for f in stack.frameworks)
        raise RequestError(f"the {name} stack runs {runs}: give framework {' or '.join(stack.frameworks)} "
                           f"(--framework {stack.frameworks[0]})")
    case = Case(model, gpu, workload, layout, stack)
    _stack_refusal(name, stack, case)
    return case


def _stack_refusal(name: str, stack: Stack, case: Case) -> None:
    """RequestError for what the megatron runner refuses to run, in the runner's own words (a price of its stack
    for a run it would not start answers what no run can check), or a global batch the stack cannot split."""
    from experiments.megatron.backend_support import microbatch_refusal
    from tuner.backends import megatron_unsupported

    reason = megatron_unsupported(case.model, case.workload, case.layout) if name == "megatron-runner" else None
    reason = reason or _stack_lacks(stack, case.layout)
    if reason:
        raise RequestError(f"{stack.source} does not run this: {reason}; the image stack prices it")
    refusal = None if stack.dynamic_batching else microbatch_refusal(case.layout, case.workload.global_batch)
    if refusal:
        raise RequestError(f"{stack.source} cannot run this layout: {refusal} (slime's dynamic batching "
                           f"can: predict it with the image stack)")


def _stack_lacks(stack: Stack, layout) -> str | None:
    """A layout field the named stack cannot run (the torch-native runner: no ring attention, so CP 1; no
    precision-aware optimizer, so fp32 Adam moments): the search space leaves such layouts out of its studies."""
    if layout.cp > 1 and not stack.context_parallel:
        return f"CP {layout.cp} (context parallelism needs Transformer Engine's ring attention)"
    if layout.exp_avg_dtype != "fp32" and not layout.offloaded and not stack.precision_aware_optimizer:
        return (f"{layout.exp_avg_dtype} Adam moments (they need the precision-aware optimizer, Transformer Engine's "
                f"FusedAdam; the runner would train with fp32 moments)")
    return None


_STEPS = {"slime": "slime's step", "megatron": "Megatron's own step"}   # a Workload.framework in words


# The JSON type each request key takes (layout: a mapping, checked by the layout codec).
_TEXT = ("recipe", "model", "gpu", "precision", "routing", "framework", "cuda_graphs", "peft")
_INTS = ("gpus", "seq_len", "global_batch", "images_per_row", "image_size")


def _check_types(request: dict) -> None:
    """Each field of the JSON type it takes, named in one line when not (a bad line is answered in place)."""
    for key in _TEXT:
        if request.get(key) is not None and not isinstance(request[key], str):
            raise RequestError(f"{key} must be a string, got {shown(request[key])}")
    for key in _INTS:
        value = request.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RequestError(f"{key} must be an integer, got {shown(value)}")
    price = request.get("usd_per_gpu_hour")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                              or not 0 < price <= MAX_USD_PER_GPU_HOUR):   # NaN fails the comparison too
        raise RequestError(f"usd_per_gpu_hour must be a number above 0 and at most {MAX_USD_PER_GPU_HOUR:,}, "
                           f"got {shown(price)}")
    name = request.get("stack")
    if name is not None and name not in STACK_NAMES:
        raise RequestError(f"unknown stack {shown_name(name)}; known: {', '.join(STACK_NAMES)}")
    fixes = request.get("stack_fix")
    if fixes is not None and not isinstance(fixes, str) and not (
            isinstance(fixes, list) and all(isinstance(f, str) for f in fixes)):
        raise RequestError(f"stack_fix must be a string or a list of strings, got {shown(fixes)}")
    unknown = [f for f in ([fixes] if isinstance(fixes, str) else fixes or []) if f not in STACK_FIXES]
    if unknown:
        raise RequestError(f"unknown stack_fix {', '.join(map(shown_name, unknown[:5]))}; known: {', '.join(STACK_FIXES)}")


def answer(resolved: Case, profile: HardwareProfile | None = None) -> Prediction:
    """Check the layout's rules, then predict. Raises InvalidLayout for a layout the stack rejects."""
    check(resolved.layout, resolved.model, resolved.workload, resolved.stack)
    return predict(resolved.model, resolved.gpu, resolved.workload, resolved.layout, profile=profile,
                   precision_aware_optimizer=resolved.stack.precision_aware_optimizer)


def interval_for(resolved: Case, profile: HardwareProfile | None = None,
                 prediction: Prediction | None = None) -> HypothesesInterval:
    """The layout's tokens/s/GPU across the cost model's hypotheses (cost_model.hypotheses), prior weights; for a
    `prediction` priced from the megatron runner's measured components, the runner stack's own prediction widened
    by its measured error (tuner.intervals.runner_stack_sd): the band a study of that runner prints."""
    if prediction is not None and runner_priced(prediction):
        return own_prediction_interval(resolved.model, resolved.gpu, resolved.workload, prediction, profile)
    return predict_interval(default_hypotheses(), resolved.model, resolved.gpu, resolved.workload, resolved.layout,
                            profile=profile, precision_aware_optimizer=resolved.stack.precision_aware_optimizer)


def leads_with_median(interval, prediction: Prediction) -> bool:
    """Whether a prediction leads with its hypotheses' posterior median: across hypotheses (not the runner's own
    prediction, whose band is centred on it) the median is what `tune` ranks and headlines, never one hypothesis."""
    return interval is not None and not runner_priced(prediction) and interval.median is not None


def result_dict(resolved: Case, prediction: Prediction, interval: HypothesesInterval | None = None) -> dict:
    out = prediction.to_dict()
    # the figure to lead with (what `tune` ranks by); tokens_per_s_per_gpu, step_time_s and breakdown are the
    # shipped model's own prediction, one of the hypotheses
    headline = interval.median if leads_with_median(interval, prediction) else prediction.tokens_per_s_per_gpu
    out["headline_tokens_per_s_per_gpu"] = headline
    # the rest of the headline (what the text line prints), at that figure (Prediction.figures_at)
    out["headline_step_time_s"], out["headline_mfu"], out["headline_usd_per_million_tokens"] = \
        prediction.figures_at(headline)
    if interval is not None:
        out["interval"] = {**Interval.of_hypotheses(interval).to_dict(),
                           "by_hypothesis": [{"hypothesis": n, "weight": w, "tokens_per_s_per_gpu": v}
                                             for n, w, v in interval.by_hypothesis],
                           "drivers": interval.drivers()}
    out["model"] = resolved.model.name
    out["gpu"] = resolved.gpu.name
    out["gpus"] = resolved.layout.world_size
    out["layout"] = {"world_size": resolved.layout.world_size, **layout_values(resolved.layout)}
    out["label"] = resolved.layout.long_label
    return out
