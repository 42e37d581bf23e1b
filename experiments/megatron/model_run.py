"""The model a trial actually trains, and what the cost model predicts for it.

A trial may build fewer layers than the catalog model and, when asked (replace_gdn), replaces Gated
DeltaNet layers by full attention; the cost model's comparison must be for exactly that model, so
both are built here. By default GDN layers are megatron-core's GatedDeltaNet (see gdn.py).
"""
from __future__ import annotations

from dataclasses import replace

from cost_model.nouns.case import Case
from cost_model.nouns.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, ModelSpec

GDN_NOTE = "gdn: replaced by full attention (replace_gdn asked for)"
GDN_KEPT_NOTE = "gdn: megatron-core GatedDeltaNet"


def trial_model(model: ModelSpec, layers: int | None = None, replace_gdn: bool = False) -> ModelSpec:
    """The ModelSpec a trial actually trains: the first `layers` layers of `model` (all when None),
    Gated DeltaNet layers replaced by full attention when `replace_gdn`, and no MTP layers.

    Built with dataclasses.replace, so the cost model can predict for exactly what ran."""
    n = model.num_hidden_layers if layers is None else layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"layers must be a positive integer, got {layers!r}")
    if n > model.num_hidden_layers:
        raise ValueError(f"{model.display_name} has {model.num_hidden_layers} layers; cannot run {n}")
    layer_types = tuple(model.layer_types[:n])
    gdn = LINEAR_ATTENTION in layer_types
    if replace_gdn:
        layer_types = tuple(FULL_ATTENTION if t == LINEAR_ATTENTION else t for t in layer_types)
    tags = []
    if n != model.num_hidden_layers:
        tags.append(f"L{n}")
    if replace_gdn and gdn:
        tags.append("gdn->full")
    changes = dict(num_hidden_layers=n, layer_types=layer_types, mlp_types=tuple(model.mlp_types[:n]),
                   num_nextn_predict_layers=0)
    if replace_gdn and gdn:
        changes.update(linear_num_key_heads=0, linear_num_value_heads=0, linear_key_head_dim=0,
                       linear_value_head_dim=0, linear_conv_kernel_dim=0)
    if tags:
        changes.update(name=f"{model.name}[{','.join(tags)}]",
                       display_name=f"{model.display_name} [{', '.join(tags)}]")
    return replace(model, **changes)


def trial_model_notes(model: ModelSpec, run: ModelSpec, how: str = "") -> list[str]:
    notes = []
    if run.num_hidden_layers != model.num_hidden_layers:
        notes.append(f"truncated: {run.num_hidden_layers} of {model.num_hidden_layers} layers"
                     + (f" ({how})" if how else ""))
    replaced = sum(1 for a, b in zip(model.layer_types, run.layer_types) if a == LINEAR_ATTENTION and b != a)
    if replaced:
        notes.append(f"{GDN_NOTE}: {replaced} of {run.num_hidden_layers} layers")
    elif run.count(LINEAR_ATTENTION):
        notes.append(f"{GDN_KEPT_NOTE}: {run.count(LINEAR_ATTENTION)} of {run.num_hidden_layers} layers "
                     f"(kernel: details.kernels.linear_attention)")
    if model.num_nextn_predict_layers:
        notes.append(f"mtp: {model.num_nextn_predict_layers} MTP layer(s) not built")
    return notes


def predict_run(case: Case, runtime=None, profile=None):
    """The prediction for what this runner runs: without Transformer Engine there is no precision-aware
    optimizer, so the optimizer shard holds fp32 master weights and moments. `runtime`: the stack a stored run
    ran on, when it is not today's runner (benchmarks.measured_runs.MeasuredRun.runtime); `profile`: a hardware
    profile other than the one shipped for the GPU type (a user's `tune profile`)."""
    import importlib.util

    from cost_model.predict import predict
    te = importlib.util.find_spec("transformer_engine") is not None
    return predict(case.model, case.gpu, case.workload, case.layout, precision_aware_optimizer=te, runtime=runtime,
                   profile=profile)


def auto_layers(case: Case, replace_gdn: bool = False) -> tuple[int, str]:
    """The largest layer count (a multiple of PP x VPP) the cost model predicts to fit the case's
    layout on its GPU; raises ValueError when not even the smallest does."""
    model, layout = case.model, case.layout
    step = layout.pp * layout.vpp
    best = None
    for n in range(step, model.num_hidden_layers + 1, step):
        p = predict_run(case.replace(model=trial_model(model, n, replace_gdn)))
        if not p.fits:
            break  # memory grows with layers
        best = (n, p.peak_memory_gib, p.gpu_memory_gib)
    if best is None:
        raise ValueError(f"the cost model predicts that not even {step} layer(s) of {model.display_name} fit "
                         f"{layout.long_label} on {case.gpu.display_name}")
    n, peak, cap = best
    return n, f"auto: largest layer count predicted to fit ({peak:.1f} of {cap:.1f} GiB)"


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron's --make-vocab-size-divisible-by 128 padding, times TP."""
    m = multiple * tp
    return -(-vocab // m) * m
