"""A megatron-core backend ("torch-native") for machines without Transformer Engine and Apex.

megatron-core 0.19.2 without TE/Apex can only build its `local` spec: routed experts run as
`SequentialMLP` (two small matmuls per local expert, 1,557 launches a step for a 2-layer
Qwen3-30B-A3B shape on an H200, GPU idle ~70% of the step) and core attention as
`DotProductAttention` (baddbmm + softmax + bmm, an [b*np, s, s] score tensor per layer). This
backend keeps everything else of megatron's local spec (ColumnParallelLinear/RowParallelLinear,
SelfAttention with RoPE, q/k norm and output gate, TopKRouter, the alltoall/allgather token
dispatchers, shared experts, TransformerLayer and its recompute paths, TP/SP/EP/ETP process groups)
and swaps three pieces:

(a) routed experts: `TorchGroupedMLP`, megatron's own `TEGroupedMLP` driver (the same code path TE
    runs: GLU split, router-prob weighting, `moe_act` recompute via CheckpointWithoutOutput) over
    two grouped linears that call `torch._grouped_mm` / `torch.nn.functional.grouped_mm` (forward
    and backward through torch autograd). Weight layout and sharding are those of megatron's
    GroupedMLP/TEGroupedMLP: each rank holds num_experts / EP local experts; fc1 is column-parallel
    over the expert-TP group (ETP shards the FFN dim; for SwiGLU each shard holds [gate | up] of
    its FFN slice), fc2 row-parallel over ETP. The grouped linears do no communication: the token
    dispatcher all-gathers / reduce-scatters over ETP, as it does for TE ("explicit expert comm").
    One parameter per projection, [local_experts, out, in] (TE's per-expert weight{i} stacked;
    the `allreduce` / `tensor_model_parallel` attributes are set as ColumnParallelLinear sets them
    for experts, so DDP reduces them over the expert-data-parallel group).
(b) core attention: `TorchSDPAttention`, torch.nn.functional.scaled_dot_product_attention
    (is_causal=True; GQA through enable_gqa when torch's dispatcher keeps a fused kernel for it,
    else by repeating the KV heads), on the TP-local heads SelfAttention hands it.
(c) norms: `TorchNorm`, torch.nn.RMSNorm / LayerNorm. Needed because megatron's torch norm
    (`WrappedTorchNorm`) asserts `not config.sequence_parallel`, so without Apex/TE no layout with
    TP > 1 (slime always adds --sequence-parallel) can be built. TorchNorm is the same torch module
    with the `sequence_parallel` attribute on its weight (what Apex's FusedLayerNorm sets), so
    `finalize_model_grads` all-reduces its gradient over TP, as for TE/Apex norms.

What cannot be swapped cleanly, and is refused with a reason (`unsupported`):
- context parallelism: TE's ring attention (TEDotProductAttention, cp_comm_type) has no torch
  equivalent here; megatron's own DotProductAttention refuses CP > 1 as well.
- learnable / off-by-one softmax (attention sinks, GPT-OSS): SDPA has no sink term.
- sliding-window layers (GPT-OSS): SDPA has no window argument; a dense [s, s] mask would drop
  the fused kernels (the `local` backend supports both, slowly).
- MLA (DeepSeek-V3, Moonlight): not wired here (MLASelfAttention would work with SDPA, but the
  runner does not build MLATransformerConfig).
- FP8/FP4 expert GEMMs, TE's op-fuser (fused grouped MLP), delayed expert wgrad: TE-only.

Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next) are megatron's GatedDeltaNet on every backend, placed by
the model's layer pattern (config.linear_attention_freq); see gdn.py for the spec, the kernel (fla, or
megatron's torch gated delta rule) and the initial weights.

`layer_spec(model, backend)` returns the TransformerLayer ModuleSpec for a catalog model and
`block_spec(model, config, backend, ...)` the per-stage block spec the runner builds; both record
the backend and kernels in `ModuleSpec.metainfo` / `kernel_report()`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
from functools import partial
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cost_model.nouns.model_spec import DENSE, LINEAR_ATTENTION, MOE, ModelSpec
from experiments.megatron import same_weights
# build_* check `unsupported`; callers import these here
from experiments.megatron.backend_support import BACKENDS, SDPA_BACKENDS, unsupported  # noqa: F401


# Kernels that ran in this process (the runner reports them with its result).
_KERNELS: dict = {}

# Which fused SDPA kernel TorchSDPAttention uses: "auto" is torch's own dispatch; a name forces
# that kernel (torch.nn.attention.sdpa_kernel), so a kernel found wrong for a shape can be avoided.
# (backend_support.SDPA_BACKENDS names the same kernels without torch; a test keeps the two alike)
SDPA_KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
_SDPA_POLICY = {"backend": "auto"}


def set_sdpa_backend(name: str) -> None:
    if name not in SDPA_BACKENDS:
        raise ValueError(f"sdpa backend must be one of {', '.join(SDPA_BACKENDS)}, got {name!r}")
    _SDPA_POLICY["backend"] = name


def sdpa_context():
    """The context TorchSDPAttention runs SDPA in under the current policy."""
    name = _SDPA_POLICY["backend"]
    return contextlib.nullcontext() if name == "auto" else sdpa_kernel([SDPA_KERNELS[name]])


def reset_kernel_report() -> None:
    _KERNELS.clear()


def kernel_report() -> dict:
    """What the swapped modules actually called in this process (counts per kernel)."""
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in _KERNELS.items()}


def _count(key: str, n: int = 1) -> None:
    _KERNELS[key] = _KERNELS.get(key, 0) + n


def _note(key: str, value: str) -> None:
    _KERNELS.setdefault(key, set()).add(value)


# ------------------------------------------------------------------------------------ kernels
def grouped_mm_fn():
    """(callable, name) of torch's grouped GEMM: the public F.grouped_mm where torch has it
    (torch > 2.10), else torch._grouped_mm; (None, reason) when neither exists."""
    fn = getattr(F, "grouped_mm", None)
    if fn is not None:
        return fn, "torch.nn.functional.grouped_mm"
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        return fn, "torch._grouped_mm"
    return None, f"torch {torch.__version__} has neither torch.nn.functional.grouped_mm nor torch._grouped_mm"


def te_available() -> bool:
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        from megatron.core.extensions.transformer_engine import HAVE_TE
    except Exception:  # noqa: BLE001 - a broken TE install counts as absent
        return False
    return bool(HAVE_TE)


def torch_native_available() -> tuple[bool, str]:
    fn, name = grouped_mm_fn()
    if fn is None:
        return False, name
    if not hasattr(F, "scaled_dot_product_attention"):
        return False, f"torch {torch.__version__} has no scaled_dot_product_attention"
    return True, f"{name} + torch.nn.functional.scaled_dot_product_attention"


def disable_te_checkpoint_fp8() -> bool:
    """Make megatron's CheckpointWithoutOutput skip its FP8 path when TE is absent; True when patched.

    megatron-core 0.19.2 sets `self.fp8 = fp8 is not None` (tensor_parallel/random.py), so the default
    fp8=False is taken as FP8 and the forward calls `FP8GlobalStateManager.is_fp8_enabled()`, a name only
    imported with TE: every selective recompute through CheckpointWithoutOutput (`layernorm`, `moe_act`)
    crashes with NameError without TE. Without TE there is no FP8, so fp8 is forced off (idempotent)."""
    from megatron.core.tensor_parallel import random as mrandom
    if getattr(mrandom, "HAVE_TE", False):
        return False
    cls = mrandom.CheckpointWithoutOutput
    if getattr(cls.__init__, "_attune_no_fp8", False):
        return True
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.fp8 = False

    __init__._attune_no_fp8 = True
    cls.__init__ = __init__
    return True


def resolve_backend(requested: str = "auto") -> tuple[str, str]:
    """(backend, why): te when transformer_engine is importable, else torch-native, else local."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "te":
        if not te_available():
            raise ImportError("backend te requested but transformer_engine is not importable")
        return "te", "requested"
    if requested == "torch-native":
        ok, why = torch_native_available()
        if not ok:
            raise ImportError(f"backend torch-native requested but {why}")
        return "torch-native", "requested"
    if requested == "local":
        return "local", "requested"
    if te_available():
        return "te", "auto: transformer_engine importable"
    ok, why = torch_native_available()
    if ok:
        return "torch-native", f"auto: transformer_engine not importable; {why}"
    return "local", f"auto: transformer_engine not importable and {why}"




_OFFS_CACHE: dict = {}


def _offsets(m_splits, device) -> torch.Tensor:
    """int32 cumulative row ends per expert, as grouped_mm's `offs` wants (cached for fc2, which
    gets the same split list as fc1)."""
    if torch.is_tensor(m_splits):
        return torch.cumsum(m_splits.to(device=device, dtype=torch.int64), 0).to(torch.int32)
    key = (str(device), tuple(int(m) for m in m_splits))
    hit = _OFFS_CACHE.get("last")
    if hit is not None and hit[0] == key:
        return hit[1]
    offs = torch.tensor(list(accumulate(key[1])), dtype=torch.int32, device=device)
    _OFFS_CACHE["last"] = (key, offs)
    return offs


def _contiguous_grad(grad: torch.Tensor) -> torch.Tensor:
    # grouped_mm's backward rejects expanded (stride-0) output gradients, e.g. from a .sum().
    return grad.contiguous()


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, m_splits) -> torch.Tensor:
    """y[rows of expert e] = x[rows of expert e] @ weight[e].T for a [E, out, in] weight, rows
    grouped by expert in order (the dispatcher's permuted layout)."""
    fn, name = grouped_mm_fn()
    if fn is None:
        raise RuntimeError(name)
    offs = _offsets(m_splits, x.device)
    y = fn(x, weight.transpose(1, 2), offs=offs)
    if y.requires_grad:
        y.register_hook(_contiguous_grad)
    _count(name)
    return y


def reference_grouped_linear(x: torch.Tensor, weight: torch.Tensor, m_splits) -> torch.Tensor:
    """The per-expert loop grouped_linear replaces (tests compare the two)."""
    splits = [int(m) for m in (m_splits.tolist() if torch.is_tensor(m_splits) else m_splits)]
    parts = torch.split(x, splits)
    return torch.cat([p @ weight[e].t() for e, p in enumerate(parts)]) if parts else x.new_zeros(0, weight.shape[1])


# ------------------------------------------------------------------------------------ modules
def _megatron():
    """megatron-core imports, deferred so this module imports without megatron (reasons only)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name
    return parallel_state, set_tensor_model_parallel_attributes, get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name


class _TorchGroupedLinear(torch.nn.Module):
    """num_gemms expert linears in one [num_gemms, out, in] parameter, run by grouped_mm.

    Constructor and forward follow megatron's TEGroupedLinear (what TEGroupedMLP builds):
    forward(x, m_splits) -> (output, bias or None)."""

    parallel_mode = ""

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config, init_method,
                 bias: bool, skip_bias_add: bool, **te_args):
        """te_args: the rest of TEGroupedLinear's keywords, as megatron's TEGroupedMLP passes them (it fixes the
        signature, so no context object): is_expert, pg_collection, and tp_comm_buffer_name and name (unused
        without TE)."""
        unknown = set(te_args) - {"is_expert", "pg_collection", "tp_comm_buffer_name", "name"}
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}")
        pg_collection = te_args.get("pg_collection")
        super().__init__()
        if not te_args.get("is_expert"):
            raise ValueError("torch-native grouped linears are for routed experts only (is_expert=True)")
        parallel_state, set_tp_attrs, get_tracker, expert_tracker_name = _megatron()
        tp_group = getattr(pg_collection, "expt_tp", None) if pg_collection is not None else None
        if tp_group is None and parallel_state.model_parallel_is_initialized():
            tp_group = parallel_state.get_expert_tensor_parallel_group(check_initialized=False)
        tp_size = tp_group.size() if tp_group is not None else 1
        if self.parallel_mode == "column":
            if output_size % tp_size:
                raise ValueError(f"expert fc1 width {output_size} is not divisible by ETP {tp_size}")
            out_features, in_features, partition_dim = output_size // tp_size, input_size, 1
        else:
            if input_size % tp_size:
                raise ValueError(f"expert fc2 width {input_size} is not divisible by ETP {tp_size}")
            out_features, in_features, partition_dim = output_size, input_size // tp_size, 2
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.skip_bias_add = skip_bias_add
        self.use_bias = bias
        self.config = config
        # ColumnParallelLinear's rule for experts: reduce over the expert-DP group when the expert
        # grid differs from the dense one (EP > 1 or ETP != TP).
        use_expert_pgs = (config.expert_model_parallel_size > 1
                          or config.expert_tensor_parallel_size != config.tensor_model_parallel_size)
        device = torch.device("cpu") if config.use_cpu_initialization else torch.device("cuda", torch.cuda.current_device())
        self.weight = torch.nn.Parameter(torch.empty(num_gemms, out_features, in_features,
                                                     dtype=config.params_dtype, device=device))
        if config.perform_initialization:
            tracker = get_tracker()
            if device.type == "cpu":
                ep_group = getattr(pg_collection, "ep", None) if pg_collection is not None else None
                if ep_group is None and parallel_state.model_parallel_is_initialized():
                    ep_group = parallel_state.get_expert_model_parallel_group(check_initialized=False)
                same_weights.init_experts_cpu(
                    self.weight, init_method, first_expert=(ep_group.rank() if ep_group is not None else 0) * num_gemms,
                    partition_dim=partition_dim - 1, etp_rank=tp_group.rank() if tp_group is not None else 0,
                    etp_size=tp_size, stride=2 if self.parallel_mode == "column" and config.gated_linear_unit else 1)
            elif tracker.is_initialized():
                with tracker.fork(expert_tracker_name()):
                    init_method(self.weight)
            else:
                init_method(self.weight)
        set_tp_attrs(self.weight, is_parallel=True, dim=partition_dim, stride=1)
        setattr(self.weight, "allreduce", not use_expert_pgs)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(num_gemms, out_features, dtype=config.params_dtype, device=device))
            set_tp_attrs(self.bias, is_parallel=self.parallel_mode == "column", dim=1, stride=1)
            setattr(self.bias, "allreduce", not use_expert_pgs)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, m_splits):
        y = grouped_linear(x, self.weight, m_splits)
        if self.bias is None:
            return y, None
        if self.skip_bias_add:
            return y, self.bias  # TEGroupedMLP._apply_bias zips one bias row per expert with the splits
        counts = m_splits if torch.is_tensor(m_splits) else torch.tensor(list(m_splits), device=y.device)
        return y + self.bias.repeat_interleave(counts.to(y.device), dim=0).to(y.dtype), None

    def backward_dw(self):
        """No delayed weight-gradient pass: autograd computes wgrad in backward."""

    def extra_repr(self) -> str:
        return f"{self.parallel_mode}, experts={self.num_gemms}, in={self.in_features}, out={self.out_features}"


class TorchColumnParallelGroupedLinear(_TorchGroupedLinear):
    parallel_mode = "column"


class TorchRowParallelGroupedLinear(_TorchGroupedLinear):
    parallel_mode = "row"


def _grouped_mlp_class():
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    class TorchGroupedMLP(TEGroupedMLP):
        """megatron's TEGroupedMLP driver over torch grouped-GEMM linears (no TE anywhere)."""

        def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
            if config.fp8 or config.fp4:
                raise NotImplementedError("FP8/FP4 expert GEMMs need Transformer Engine")
            if config.use_transformer_engine_op_fuser:
                raise NotImplementedError("the fused grouped MLP (TE op fuser) needs Transformer Engine")
            if config.moe_latent_size:
                raise NotImplementedError("MoE latent projections need Transformer Engine")
            if pg_collection is None:
                from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
                pg_collection = get_default_pg_collection()
            super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection, name=name)

    return TorchGroupedMLP


class TorchSDPAttention(torch.nn.Module):
    """Core attention by torch.nn.functional.scaled_dot_product_attention.

    Same constructor and forward contract as megatron's DotProductAttention: query [sq, b, np, hn],
    key/value [sk, b, ng, hn] (TP-local heads) -> context [sq, b, np * hn_v]."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__()
        from megatron.core.transformer.utils import is_layer_window_attention

        self.config = config
        if config.context_parallel_size != 1:
            raise NotImplementedError(f"context parallelism (CP {config.context_parallel_size}) needs TE's ring "
                                      f"attention; torch SDPA has none")
        if config.softmax_type != "vanilla":
            raise NotImplementedError(f"softmax_type {config.softmax_type!r} (attention sinks) is not expressible "
                                      f"with scaled_dot_product_attention")
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
            raise NotImplementedError("sliding-window attention is not supported by the torch-native backend")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_offset = None
        self.current_max_attn_logits = None
        self._gqa_mode: dict = {}

    def _gqa(self, q, k, v, causal, attn_mask) -> str:
        """enable_gqa when torch's SDPA dispatcher picks a fused kernel for it, else repeat KV heads."""
        key = (q.device.type, q.dtype, q.shape[-1], q.shape[1], k.shape[1], _SDPA_POLICY["backend"])
        mode = self._gqa_mode.get(key)
        if mode is None:
            mode = "repeat_kv"
            try:
                choice = torch._fused_sdp_choice(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=causal,
                                                 scale=self.softmax_scale, enable_gqa=True)
                if int(choice) > 0:  # 0: math (unfused), -1: error
                    mode = "enable_gqa"
            except Exception:  # noqa: BLE001 - older torch: no enable_gqa in the dispatcher
                mode = "repeat_kv"
            self._gqa_mode[key] = mode
        return mode

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **unused):
        with sdpa_context():  # the kernel choice (and the GQA probe) under the runner's SDPA policy
            return self._attend(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)

    def _attend(self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params):
        from megatron.core.transformer.enums import AttnMaskType

        if packed_seq_params is not None:
            raise NotImplementedError("packed sequences (THD) are not supported by the torch-native attention")
        if attention_bias is not None:
            raise NotImplementedError("attention bias is not supported by the torch-native attention")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal
        mask = None
        if not causal and mask_type != AttnMaskType.no_mask and attention_mask is not None:
            mask = ~attention_mask.bool()  # megatron: True = masked out; SDPA: True = attend
        sq, b, np_, _ = query.shape
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        kwargs = {}
        if k.shape[1] != np_:
            if np_ % k.shape[1]:
                raise ValueError(f"{np_} query heads are not a multiple of {k.shape[1]} KV heads")
            mode = self._gqa(q, k, v, causal, mask)
            _note("gqa", mode)
            if mode == "enable_gqa":
                kwargs["enable_gqa"] = True
            else:
                rep = np_ // k.shape[1]
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
        dropout = self.dropout_p if self.training else 0.0
        if "sdpa_backend" not in _KERNELS:
            _note("sdpa_backend", _sdpa_backend_name(q, k, v, mask, dropout, causal, self.softmax_scale, kwargs))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                             scale=self.softmax_scale, **kwargs)
        _count("torch.nn.functional.scaled_dot_product_attention")
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)


def _sdpa_backend_name(q, k, v, mask, dropout, causal, scale, kwargs) -> str:
    names = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                             scale=scale, **kwargs))
    except Exception:  # noqa: BLE001
        return "unknown"
    return f"{names.get(choice, str(choice))} ({q.device.type})"


class TorchNorm:
    """torch.nn.RMSNorm / LayerNorm, usable with sequence parallelism.

    megatron's WrappedTorchNorm builds the same torch module but asserts `not sequence_parallel`;
    with SP each TP rank normalizes its own sequence shard (no communication) and only the weight
    gradient needs a TP all-reduce, which finalize_model_grads does for parameters carrying the
    `sequence_parallel` attribute (as Apex's FusedLayerNorm and TE's norms set it)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm", **unused):
        if config.layernorm_zero_centered_gamma:
            raise NotImplementedError("zero-centered gamma is not supported by torch norms")
        if config.normalization == "RMSNorm":
            norm = torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)
        elif config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(normalized_shape=hidden_size, eps=eps)
        else:
            raise NotImplementedError(f"normalization {config.normalization!r} is not supported by the torch-native backend")
        for p in norm.parameters():
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))
        return norm


def _provider_class():
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, SequentialMLP
    from megatron.core.transformer.mlp import MLPSubmodules

    grouped_mlp = _grouped_mlp_class()

    class TorchNativeSpecProvider(LocalSpecProvider):
        """megatron's LocalSpecProvider with torch grouped-GEMM experts, SDPA core attention and
        sequence-parallel-capable torch norms."""

        name = "torch-native"

        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False, has_residual: bool = False):
            return TorchNorm

        def core_attention(self):
            return TorchSDPAttention

        def grouped_mlp_modules(self, moe_use_grouped_gemm: bool):
            if not moe_use_grouped_gemm:
                # megatron's own per-expert loop, as the local backend builds it.
                return partial(SequentialMLP, submodules=MLPSubmodules(
                    linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear, activation_func=None))
            return partial(grouped_mlp, submodules=GroupedMLPSubmodules(
                linear_fc1=TorchColumnParallelGroupedLinear, linear_fc2=TorchRowParallelGroupedLinear))

    return TorchNativeSpecProvider


def TorchNativeSpecProvider():  # noqa: N802 - a factory that reads like the class it returns
    return _provider_class()()


# ------------------------------------------------------------------------------------ specs
KERNELS = {
    "te": {"experts": "TEGroupedMLP (Transformer Engine GroupedLinear)",
           "attention": "TEDotProductAttention (TE fused/flash attention)",
           "norm": "TENorm", "linear": "TE Linear / LayerNormLinear"},
    "torch-native": {"experts": "TorchGroupedMLP: megatron TEGroupedMLP driver over torch grouped_mm",
                     "attention": "torch.nn.functional.scaled_dot_product_attention (causal)",
                     "norm": "torch.nn.RMSNorm (+sequence_parallel grad attribute)",
                     "linear": "megatron ColumnParallelLinear / RowParallelLinear (torch matmul)"},
    "local": {"experts": "SequentialMLP (one ColumnParallelLinear/RowParallelLinear pair per local expert)",
              "attention": "DotProductAttention (baddbmm + softmax + bmm)",
              "norm": "WrappedTorchNorm (torch.nn.RMSNorm; refuses sequence parallelism)",
              "linear": "megatron ColumnParallelLinear / RowParallelLinear (torch matmul)"},
}


def _check(model: ModelSpec, backend: str, cp: int = 1) -> None:
    reasons = unsupported(model, backend, cp)
    if reasons:
        raise NotImplementedError(f"{model.display_name} on backend {backend}: " + "; ".join(reasons))


def _layer_submodules(provider, num_experts: int | None, moe_grouped_gemm: bool, qk_layernorm: bool):
    """get_gpt_layer_local_submodules (megatron 0.19.2, non-MLA branch) for any backend provider
    (megatron's version hard-codes LocalSpecProvider)."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

    layer_norm = provider.layer_norm(rms_norm=True, for_qk=False, has_residual=True)
    qk_norm = provider.layer_norm(rms_norm=True, for_qk=True)
    mlp = get_mlp_module_spec_for_backend(backend=provider, num_experts=num_experts, moe_grouped_gemm=moe_grouped_gemm)
    return TransformerLayerSubmodules(
        input_layernorm=layer_norm,
        self_attention=ModuleSpec(
            module=SelfAttention,
            params={"attn_mask_type": AttnMaskType.causal},
            submodules=SelfAttentionSubmodules(
                linear_qkv=provider.column_parallel_linear(),
                core_attention=provider.core_attention(),
                linear_proj=provider.row_parallel_linear(),
                q_layernorm=qk_norm if qk_layernorm else IdentityOp,
                k_layernorm=qk_norm if qk_layernorm else IdentityOp,
            ),
        ),
        self_attn_bda=get_bias_dropout_add,
        pre_mlp_layernorm=layer_norm,
        mlp=mlp,
        mlp_bda=get_bias_dropout_add,
    )


def _metainfo(backend: str, why: str = "") -> dict:
    info = {"attune_backend": backend, "attune_kernels": dict(KERNELS[backend])}
    if why:
        info["attune_backend_reason"] = why
    if backend == "torch-native":
        info["attune_kernels"]["grouped_gemm"] = grouped_mm_fn()[1]
    return info


def layer_spec(model: ModelSpec, backend: str = "auto", *, mlp_type: str | None = None):
    """The TransformerLayer ModuleSpec for `model`'s layers of `mlp_type` (default: MoE for a MoE
    model) on `backend` (auto: te > torch-native > local). `spec.metainfo` records the backend,
    why it was chosen, and the kernels each piece runs."""
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer

    name, why = resolve_backend(backend)
    _check(model, name)
    mlp_type = mlp_type or (MOE if model.is_moe else DENSE)
    num_experts = model.num_experts if mlp_type == MOE else None
    if name == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
        spec = get_gpt_layer_with_transformer_engine_spec(num_experts=num_experts, moe_grouped_gemm=True,
                                                          qk_layernorm=model.qk_norm)
    elif name == "local":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=True,
                                        qk_layernorm=model.qk_norm, normalization="RMSNorm")
    else:
        spec = ModuleSpec(module=TransformerLayer,
                          submodules=_layer_submodules(TorchNativeSpecProvider(), num_experts, True, model.qk_norm))
    spec.metainfo = {**(spec.metainfo or {}), **_metainfo(name, why)}
    return spec


def block_spec(model: ModelSpec, config, backend: str = "auto", *, vp_stage: int | None = None,
               pp_rank: int | None = None, init_seed: int | None = None):
    """(TransformerBlockSubmodules for this pipeline stage, metainfo) — what GPTModel is built from.

    Dense/MoE layers follow config.moe_layer_freq and Gated DeltaNet / full attention layers
    config.linear_attention_freq (per-layer lists), sliced to the stage as megatron's block spec
    functions slice them. With `init_seed` (and CPU initialisation) each layer's weights depend on
    the seed and its global layer number only (same_weights.seeded_layer)."""
    name, why = resolve_backend(backend)
    _check(model, name, config.context_parallel_size)
    if name != "te":
        disable_te_checkpoint_fp8()  # selective layernorm / moe_act recompute without TE
    info = _metainfo(name, why)
    gdn_layers = model.count(LINEAR_ATTENTION)
    if gdn_layers:
        from experiments.megatron import gdn
        info["attune_kernels"]["linear_attention"] = gdn.kernel_description()
    if name == "te" and gdn_layers:
        from experiments.megatron import gdn
        return same_weights.seed_layers(gdn.te_block_layers(config, vp_stage, pp_rank), init_seed), info
    if name == "te" or (name == "local" and not gdn_layers):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=name == "te", normalization="RMSNorm",
                                          vp_stage=vp_stage, pp_rank=pp_rank)
        return same_weights.seed_layers(spec, init_seed), info

    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    provider = TorchNativeSpecProvider() if name == "torch-native" else LocalSpecProvider()
    specs = _decoder_layer_specs(config, provider)
    n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
    norm = TorchNorm if name == "torch-native" else provider.layer_norm(rms_norm=True, for_qk=False)
    spec = TransformerBlockSubmodules(layer_specs=specs[offset:offset + n], layer_norm=norm)
    return same_weights.seed_layers(spec, init_seed), info


def _decoder_layer_specs(config, provider) -> list:
    """One TransformerLayer spec per layer of the whole model: (Gated DeltaNet or full attention) x
    (MoE or dense MLP), one spec object per kind."""
    import dataclasses

    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayer

    kinds: dict = {}

    def layer(linear: int, moe: int):
        if (linear, moe) not in kinds:
            sub = _layer_submodules(provider, config.num_moe_experts if moe else None,
                                    bool(moe and config.moe_grouped_gemm), config.qk_layernorm)
            if linear:
                from experiments.megatron import gdn
                attn = gdn.gdn_attention_spec(config, provider)
                sub = dataclasses.replace(sub, self_attention=attn)
                if attn.metainfo["fuse_input_layernorm"]:
                    from megatron.core.transformer.identity_op import IdentityOp
                    sub = dataclasses.replace(sub, input_layernorm=IdentityOp)
            kinds[linear, moe] = ModuleSpec(module=TransformerLayer, submodules=sub)
        return kinds[linear, moe]

    return [layer(a, m) for a, m in zip(_linear_attention_pattern(config), _moe_pattern(config))]


def _moe_pattern(config) -> list[int]:
    freq = config.moe_layer_freq
    if not config.num_moe_experts:
        pattern = [0] * config.num_layers
    elif isinstance(freq, int):
        pattern = [1 if i % freq == 0 else 0 for i in range(config.num_layers)]
    else:
        pattern = list(freq)
    if len(pattern) != config.num_layers:
        raise ValueError(f"moe_layer_freq has {len(pattern)} entries for {config.num_layers} layers")
    return pattern


def _linear_attention_pattern(config) -> list[int]:
    """1 for a Gated DeltaNet layer, 0 for full attention (megatron's get_linear_attention_pattern)."""
    if config.experimental_attention_variant != "gated_delta_net":
        return [0] * config.num_layers
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    return list(get_linear_attention_pattern(config))
