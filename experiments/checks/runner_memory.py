"""The profile's runner probe: what the megatron runner's own processes hold outside PyTorch's allocator.

The parts of that memory are measured apart (experiments.checks.device_memory and nccl_memory), but
which of megatron's ~20 communicators a training step really uses, and which kernels it loads, only a
real step shows. So `tune profile` runs the megatron runner itself for a few steps of Qwen3.6-35B-A3B's
first 4 layers (3 Gated DeltaNet, 1 attention; fla's kernels when importable; fewer where they would not fit:
`probe_layers`) on 1 GPU (TP1) and on all
GPUs (EP over all of them), before the profile's own process touches a GPU (a device-level reading
would count it), and records per trial the largest `device peak - reserved peak` over the ranks (the
runner's outside_pytorch figure). The cost model takes it as the floor of what a megatron-runner
process holds outside PyTorch on that many GPUs (cost_model/device_memory.py).

`tune profile --model M` probes with the Gated DeltaNet layers replaced by full attention (`without_gdn` on its
rows), whatever M's layers: the cost model adds what fla's kernels hold (constants.yaml runner_gdn_kernels_gib,
measured on the runner's grids) where the predicted model has such layers, and the probe runs no GDN kernel (on
1 x H100 it took 39 s with them in Qwen3.6's profile, 16 s without in Llama3-8B's; on a fresh machine the kernels'
compilation moves to the builds, which run them anyway). `tune profile` without --model probes with them.
"""
from __future__ import annotations

from experiments.checks.measure import sig

PROBE_MODEL, PROBE_LAYERS, PROBE_SEQ, PROBE_STEPS = "qwen3.6-35b-a3b", 4, 4096, 3
PROBE_TIMEOUT_S = 300


def probe_with_gdn(model) -> bool:
    """Whether the probe runs its Gated DeltaNet layers: only for a profile of no particular model (`model` None)."""
    return model is None


def probe_layouts(world: int) -> list:
    from cost_model.nouns.layout import Layout
    layouts = [Layout(1, max_tokens_per_gpu=PROBE_SEQ)]
    if world > 1:
        layouts.append(Layout(world, ep=world, max_tokens_per_gpu=PROBE_SEQ))
    return layouts


def _outside(per_rank: dict) -> list[float]:
    out = []
    for m in per_rank.values():
        value = m.get("outside_pytorch")
        if value is None and m.get("device_peak") is not None and m.get("peak_reserved") is not None:
            value = m["device_peak"] - m["peak_reserved"]
        if value is not None:
            out.append(float(value))
    return out


def probe_layers(case, gdn: bool = True) -> int:
    """PROBE_LAYERS, or fewer where they would not fit: the most the cost model predicts to fit the GPU. On an 80 GB
    card the 4 layers' weights, fp32 gradients and Adam state alone nearly fill it (predicted 99 GiB on 1 x H100; they
    ran out of memory there on 2026-12-06); what the probe reads, the memory outside PyTorch, does not depend on the
    depth."""
    from experiments.megatron.model_run import predict_run, trial_model
    for n in range(PROBE_LAYERS, 1, -1):
        if predict_run(case.replace(model=trial_model(case.model, n, not gdn))).fits:
            return n
    return 1


def probe_row(layout, result, gdn: bool = True, layers: int = PROBE_LAYERS) -> dict:
    """One probe trial's row: the layout, and the largest outside-PyTorch figure over its ranks (or why not);
    `gdn` False: its Gated DeltaNet layers were replaced by full attention."""
    row = dict(gpus=layout.world_size, layout=layout.long_label,
               model=f"{PROBE_MODEL}, first {layers} layers ({PROBE_STEPS} steps, {PROBE_SEQ}-token rows)"
                     + ("" if gdn else ", Gated DeltaNet layers replaced by full attention"),
               **({} if gdn else {"without_gdn": True}))
    if result.status != "ok":
        return dict(row, error=f"{result.failure_class}: {' '.join(str(result.detail).split())[:200]}")
    outside = _outside(result.details.get("memory_gib_per_rank") or {})
    if not outside:
        return dict(row, error="the runner recorded no device-level peak")
    kernels = result.details.get("kernels") or {}
    return dict(row, outside_gib=sig(max(outside), 4), per_rank_gib=[sig(x, 4) for x in outside],
                linear_attention=kernels.get("linear_attention"))


def measure_runner_outside(world: int, gpu=None, timeout_s: float = PROBE_TIMEOUT_S, runner_factory=None,
                           gdn: bool = True) -> dict:
    """Run the probe trials; {"runner_outside": [rows]}. `gpu`: the catalog GpuSpec (nvidia-smi's by
    default); `runner_factory(timeout_s, gdn, layers)` makes the runner (a MegatronRunner by default; the CPU tests
    pass a stand-in); `gdn` False: the probe model's Gated DeltaNet layers replaced by full attention. Each layout
    runs `probe_layers` of them."""
    from cost_model.nouns.case import Case
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload
    from experiments.runner import TrialSpec
    if gpu is None:
        from experiments.megatron.runner import detect_gpu
        gpu = detect_gpu() or load_gpu("h200")
    if runner_factory is None:
        from experiments.megatron.runner import MegatronRunner

        def runner_factory(limit, gdn, layers):
            return MegatronRunner(layers=layers, replace_gdn=not gdn, timeout_s=limit, scale_batch_to_budget=False)
    rows = []
    for layout in probe_layouts(world):
        workload = Workload(seq_len=PROBE_SEQ, global_batch=2 * layout.dp, framework="megatron")
        case = Case(load_model(PROBE_MODEL), gpu, workload, layout)
        spec = TrialSpec(case, steps=PROBE_STEPS, window=(1, PROBE_STEPS - 1))
        layers = probe_layers(case, gdn)
        rows.append(probe_row(layout, runner_factory(timeout_s, gdn, layers).run(spec), gdn, layers))
    return dict(runner_outside=rows)
