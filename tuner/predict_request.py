"""One what-if question for the cost model, from command-line flags or a JSON line.

A request is a mapping with the flags' names: model, gpu, gpus, seq_len, global_batch, precision,
routing, framework, usd_per_gpu_hour, stack_fix, layout {recipe layout keys}; or recipe (a path).
`tune predict` and `tune predict --batch` both resolve requests here, so the two never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.hardware import GpuSpec, load_gpu
from cost_model.model_spec import ModelSpec, load_model
from cost_model.predict import Prediction, predict
from cost_model.profile import HardwareProfile
from cost_model.workload import Workload
from search_space.layout import InvalidLayout, Layout
from search_space.rules import check
from search_space.stack import Stack

LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "max_tokens_per_gpu", "rows_per_microbatch",
               "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
               "optimizer_offload_fraction", "overlap_d2h_h2d", "dispatcher", "exp_avg_dtype")
REQUEST_KEYS = ("model", "gpu", "gpus", "seq_len", "global_batch", "precision", "routing", "framework",
                "usd_per_gpu_hour", "stack_fix", "layout", "recipe")


class RequestError(ValueError):
    """A request that cannot be answered; the message names the problem in one line."""


@dataclass(frozen=True)
class Resolved:
    model: ModelSpec
    gpu: GpuSpec
    workload: Workload
    layout: Layout
    stack: Stack


def layout_value(key: str, raw):
    """A layout field's value from a string (flags) or a JSON value, with its proper type."""
    if key not in LAYOUT_KEYS:
        raise RequestError(f"unknown layout key '{key}'; known: {', '.join(LAYOUT_KEYS)}")
    if raw is None and key in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        return None
    try:
        if key == "recompute_granularity":
            return None if raw in (None, "", "none", "null") else str(raw)
        if key in ("recompute_method", "dispatcher", "exp_avg_dtype"):
            return None if raw is None else str(raw)
        if key == "recompute_modules":
            items = raw.replace("+", ",").split(",") if isinstance(raw, str) else list(raw)
            return tuple(str(m).strip() for m in items if str(m).strip())
        if key == "optimizer_offload_fraction":
            return float(raw)
        if key == "overlap_d2h_h2d":
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return str(raw).lower() in ("true", "1", "yes")
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise ValueError
        return int(raw)
    except (ValueError, TypeError, AttributeError):
        raise RequestError(f"layout value {key}={raw!r} has the wrong type") from None


def pairs_to_layout_values(pairs: list[str]) -> dict:
    values = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise RequestError(f"layout value '{pair}' is not KEY=VALUE")
        key = key.strip().replace("-", "_")
        values[key] = layout_value(key, raw.strip())
    return values


def build_layout(values: dict, world_size: int, seq_len: int) -> Layout:
    values = {k: layout_value(k, v) for k, v in values.items()}
    cp = values.get("cp", 1)
    if "max_tokens_per_gpu" not in values:
        values["max_tokens_per_gpu"] = values.get("rows_per_microbatch", 1) * seq_len // cp
    if "rows_per_microbatch" not in values:
        values["rows_per_microbatch"] = max(1, values["max_tokens_per_gpu"] * cp // seq_len)
    return Layout.from_params({"world_size": world_size, **values})


def resolve(request: dict) -> Resolved:
    if not isinstance(request, dict):
        raise RequestError("a request must be a JSON object")
    unknown = sorted(set(request) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(f"unknown request key(s) {unknown}; known: {', '.join(REQUEST_KEYS)}")
    fixes = request.get("stack_fix") or []
    if isinstance(fixes, str):
        fixes = [fixes]
    if request.get("recipe"):
        from recipes.recipe import load_recipe

        loaded = load_recipe(request["recipe"])
        gpu = loaded.gpu.with_price(request.get("usd_per_gpu_hour"))
        # A recipe was run on its own image; its stack carries the output-gate fix (see its stack block).
        return Resolved(loaded.model, gpu, loaded.workload, loaded.layout,
                        Stack.with_fixes(list(fixes) or ["output-gate-tp"]))
    if not request.get("model") or not request.get("gpu"):
        raise RequestError("a request needs a recipe, or a model, a gpu and a layout")
    model = load_model(request["model"])
    gpu = load_gpu(request["gpu"]).with_price(request.get("usd_per_gpu_hour"))
    gpus = request.get("gpus") or gpu.gpus_per_node
    if not isinstance(gpus, int) or gpus < 1:
        raise RequestError(f"gpus must be a positive integer, got {gpus!r}")
    workload = Workload(**{k: request[k] for k in ("seq_len", "global_batch", "precision", "routing", "framework")
                           if request.get(k) is not None})
    layout_values = request.get("layout") or {}
    if not isinstance(layout_values, dict):
        raise RequestError("layout must be a mapping of layout keys to values")
    layout = build_layout(layout_values, gpus, workload.seq_len)
    return Resolved(model, gpu, workload, layout, Stack.with_fixes(list(fixes)))


def answer(resolved: Resolved, profile: HardwareProfile | None = None) -> Prediction:
    """Check the layout's rules, then predict. Raises InvalidLayout for a layout the stack rejects."""
    check(resolved.layout, resolved.model, resolved.workload, resolved.stack)
    return predict(resolved.model, resolved.gpu, resolved.workload, resolved.layout, profile=profile)


def result_dict(resolved: Resolved, prediction: Prediction) -> dict:
    out = prediction.to_dict()
    out["model"] = resolved.model.name
    out["gpu"] = resolved.gpu.name
    out["gpus"] = resolved.layout.world_size
    out["layout"] = resolved.layout.to_params()
    out["label"] = resolved.layout.long_label
    return out


ANSWERABLE_ERRORS = (RequestError, InvalidLayout)
