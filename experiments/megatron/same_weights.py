"""Every layout of one model starts from the same weights (the megatron runner's `cpu_init`).

Convergence arms compare layouts, so they must start from one model. megatron's CPU initialisation
(use_cpu_initialization) draws each dense weight whole and keeps this rank's TP slice, which makes TP
layouts agree; two things still depend on the layout, and are fixed here:
- routed experts: a rank would draw only its local block (`init_experts_cpu` draws each global expert);
- pipeline splits: a stage draws only its own layers, in construction order (`seeded_layer` reseeds
  the generator per global layer);
- Gated DeltaNet layers: megatron slices in_proj contiguously (its TP shards are per section) and
  draws conv1d and A_log per rank (`init_gdn_cpu` draws each whole and slices it per section).
The megatron runner checks the result on GPUs by the step-1 losses of different layouts; the tests
check the shards and the generator states on the CPU.
"""
from __future__ import annotations

import dataclasses
import math

import torch


def init_experts_cpu(weight: torch.Tensor, init_method, *, first_expert: int, partition_dim: int,
                     etp_rank: int, etp_size: int, stride: int = 1) -> None:
    """CPU initialisation of local experts that gives every layout the same full model.

    megatron's CPU initialisation (use_cpu_initialization) draws each dense weight whole and keeps
    this rank's TP slice, so TP 1 and TP 2 start from the same function. Drawing a rank's local
    expert block directly would not: EP ranks would draw identical values for different experts, and
    the number of values drawn (hence every later layer's weights) would depend on EP and ETP.
    Here one number is drawn from the process's CPU generator (the same in every layout), each
    global expert's full [out, in] weight is drawn from a generator seeded by it and the expert's
    index, and the ETP slice is kept as megatron slices a dense weight: `stride` 2 for a GLU fc1,
    whose local shard is [gate slice | up slice] of its FFN slice. The draws run on the GPU when
    there is one (minutes less than on the CPU for 256 experts a layer; the same values on every
    GPU of one type), else on the CPU."""
    base = int(torch.randint(0, 2**62, (1,)).item())
    local, out_local, in_local = weight.shape
    full = [out_local, in_local]
    full[partition_dim] *= etp_size
    per_chunk = full[partition_dim] // (etp_size * stride)
    on_gpu = torch.cuda.is_available()
    draw_on = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    # fork_rng restores the process's generators afterwards: they move on by the one draw above only.
    with torch.no_grad(), torch.random.fork_rng(devices=[draw_on.index] if on_gpu else []):
        for i in range(local):
            (torch.cuda.manual_seed if on_gpu else torch.default_generator.manual_seed)(base + first_expert + i)
            master = torch.empty(full, dtype=torch.float32, device=draw_on)
            init_method(master)
            chunks = torch.split(master.to(weight.dtype), per_chunk, dim=partition_dim)
            weight[i].copy_(torch.cat(chunks[etp_rank::etp_size], dim=partition_dim))


_SEEDED: dict = {}


def seeded_layer(layer_class, seed: int):
    """`layer_class` (a TransformerLayer) that, under CPU initialisation, reseeds the process's CPU
    generator from `seed` and its global layer number before building its weights.

    megatron's CPU initialisation draws weights in construction order, and a pipeline stage builds
    only its own layers: without this, layer 3 of a PP 2 run would get the values layer 1 gets at
    PP 1. Reseeding per global layer makes each layer's weights, and the generator state the output
    layer is drawn from after the last layer, the same for every PP and VPP split."""
    key = (layer_class, seed)
    if key not in _SEEDED:
        class SeededLayer(layer_class):
            def __init__(self, config, submodules, layer_number: int = 1, *args, **kwargs):
                if config.use_cpu_initialization:
                    torch.default_generator.manual_seed(seed * 1_000_003 + _global_layer_number(
                        config, layer_number, kwargs.get("vp_stage"), kwargs.get("pg_collection"),
                        kwargs.get("is_mtp_layer", False) or not kwargs.get("add_layer_offset", True)))
                super().__init__(config, submodules, layer_number, *args, **kwargs)

        SeededLayer.__name__ = SeededLayer.__qualname__ = f"Seeded{layer_class.__name__}"
        _SEEDED[key] = SeededLayer
    return _SEEDED[key]


def _global_layer_number(config, layer_number: int, vp_stage, pg_collection, no_offset: bool) -> int:
    """The 1-based global layer number megatron's TransformerLayer computes for itself."""
    if no_offset:
        return layer_number
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    pp = getattr(pg_collection, "pp", None) if pg_collection is not None else None
    pp_rank = pp.rank() if pp is not None else (parallel_state.get_pipeline_model_parallel_rank()
                                                if parallel_state.model_parallel_is_initialized() else 0)
    return layer_number + get_transformer_layer_offset(config, vp_stage, pp_rank)


def seed_layers(spec, init_seed: int | None):
    """The block spec with every layer class reseeding per global layer (see seeded_layer)."""
    if init_seed is None:
        return spec
    spec.layer_specs = [dataclasses.replace(ls, module=seeded_layer(ls.module, init_seed)) for ls in spec.layer_specs]
    return spec


def _draw(seed: int, shape, init) -> torch.Tensor:
    """A full fp32 tensor drawn by `init` from the CPU generator seeded with `seed` (as megatron's
    _initialize_affine_weight_cpu draws a master weight)."""
    torch.default_generator.manual_seed(seed)
    master = torch.empty(*shape, dtype=torch.float32)
    init(master)
    return master


def _shard(full: torch.Tensor, sections: list[int], rank: int, size: int, dim: int = 0) -> torch.Tensor:
    """This TP rank's part of a tensor made of `sections` along `dim`, each sharded evenly over TP."""
    parts = torch.split(full, sections, dim=dim)
    return torch.cat([p.chunk(size, dim=dim)[rank] for p in parts], dim=dim)


def init_gdn_cpu(m, base: int) -> None:
    """Every GDN parameter of module `m` drawn whole (the TP 1 layout: in_proj rows q|k|v|z|beta|alpha,
    conv1d channels q|k|v) from generators seeded by `base`, and sliced as megatron shards it."""
    cfg = m.config
    rank, size = m.pg_collection.tp.rank(), m.tp_size
    dtype = cfg.params_dtype
    qk, v, nv = m.qk_dim, m.v_dim, m.num_value_heads
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        in_proj = _draw(base, (m.in_proj_dim, m.hidden_size), cfg.init_method)
        m.in_proj.weight.copy_(_shard(in_proj, [qk, qk, v, v, nv, nv], rank, size).to(dtype))
        conv_init = ((lambda t: torch.nn.init.uniform_(t, -m.conv_init, m.conv_init)) if m.conv_init is not None
                     else (lambda t: torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5))))  # nn.Conv1d's default
        conv = _draw(base + 1, (m.conv_dim, 1, m.conv_kernel_dim), conv_init)
        m.conv1d.weight.copy_(_shard(conv, [qk, qk, v], rank, size).to(dtype))
        if m.conv1d.bias is not None:
            bound = 1.0 / math.sqrt(m.conv_kernel_dim)
            bias = _draw(base + 2, (m.conv_dim,), lambda t: torch.nn.init.uniform_(t, -bound, bound))
            m.conv1d.bias.copy_(_shard(bias, [qk, qk, v], rank, size).to(dtype))
        a = _draw(base + 3, (nv,), lambda t: t.uniform_(*m.A_init_range))
        m.A_log.copy_(_shard(torch.log(a), [nv], rank, size).to(dtype))
        m.dt_bias.fill_(1.0)
        out = _draw(base + 4, (m.hidden_size, v), cfg.output_layer_init_method)
        m.out_proj.weight.copy_(_shard(out, [v], rank, size, dim=1).to(dtype))
