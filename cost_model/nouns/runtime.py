"""What the training process does with GPU memory beyond the model's own tensors, runtime by runtime.

- slime (the leaderboard's): NCCL communicators made lazily (no device_id), TE's FusedAdam, slime's log-prob
  loss, Qwen3.5/3.6 Gated DeltaNet as the HF module (the whole row on every TP and CP rank);
- megatron (Megatron-LM/Bridge): the same, with megatron's vocab-parallel loss and megatron-core's GatedDeltaNet
  (heads over TP, CP by a head all-to-all);
- megatron-runner (attune's runner without TE, experiments/megatron): device_id bound in init_process_group, so
  every group's communicator exists at start; torch AdamW(foreach), an fp32 temporary the size of the shard;
  unfused kernels that keep more inputs for the backward (cost_model.activations.runner_dense_layer_bytes); one
  torch._grouped_mm per expert linear (cost_model/step_time.py exposed_expert_calls).
All run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. Pure data: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.nouns.layout import Layout

EAGER, LAZY = "eager", "lazy"
MEGATRON_LOSS, SLIME_LOSS = "megatron", "slime"


@dataclass(frozen=True)
class Runtime:
    name: str
    fused_adam: bool              # False: torch AdamW(foreach) holds an fp32 temporary of the shard in its step
    nccl_init: str                # EAGER: a communicator per process group at start; LAZY: on first collective
    loss_path: str                # MEGATRON_LOSS or SLIME_LOSS (see cost_model.loss_path)
    gdn_sharded: bool             # megatron-core GatedDeltaNet (TP/CP-sharded heads) vs the HF module (replicated)
    expandable_segments: bool
    source: str
    fused_kernels: bool = True    # TE's fused RoPE, SwiGLU, norms; False: unfused ops keep more inputs
    per_expert_gemm_calls: bool = True   # TE's GroupedLinear: a GEMM call per local expert; False: one grouped GEMM
    # megatron-core builds the CPU-offload optimizer twice; True: the first build is collected before the first step
    # (the runner's gc.collect); False: its fp32 copies are counted at the first step's optimizer peak
    offload_first_build_collected: bool = False
    # True: the hardware profile's runner figures (its runner_components, device_memory.runner_outside) were
    # measured on this runtime, so they price it; False: the fitted terms and the memory parts do
    profiled: bool = False


# slime's initialize_model_and_optimizer runs gc.collect (clear_memory) right after setup_model_and_optimizer
# (slime/backends/megatron_utils/model.py): an offloaded optimizer's first build is gone before the first step.
SLIME = Runtime("slime", fused_adam=True, nccl_init=LAZY, loss_path=SLIME_LOSS, gdn_sharded=False,
                expandable_segments=True, offload_first_build_collected=True,
                source="slime on Megatron-LM: TE FusedAdam, NCCL communicators on first use, HF Gated DeltaNet")
MEGATRON = Runtime("megatron", fused_adam=True, nccl_init=LAZY, loss_path=MEGATRON_LOSS, gdn_sharded=True,
                   expandable_segments=True,
                   source="Megatron-LM/Bridge: TE FusedAdam, NCCL communicators on first use, megatron-core GDN")
MEGATRON_RUNNER = Runtime("megatron-runner", fused_adam=False, nccl_init=EAGER, loss_path=MEGATRON_LOSS,
                          gdn_sharded=True, expandable_segments=True, fused_kernels=False,
                          per_expert_gemm_calls=False, offload_first_build_collected=True, profiled=True,
                          source="attune megatron runner without TE: torch AdamW(foreach), every NCCL "
                                 "communicator at start (device_id bound), megatron-core GDN, unfused kernels, "
                                 "an offloaded optimizer's first build collected before the first step")
RUNTIMES = {r.name: r for r in (SLIME, MEGATRON, MEGATRON_RUNNER)}


def default_runtime(framework: str, precision_aware_optimizer: bool = True) -> Runtime:
    """The runtime a prediction assumes when none is given. Without the precision-aware optimizer (no
    Transformer Engine) the stack is the megatron runner's: that is the only one that runs without TE."""
    if not precision_aware_optimizer:
        return MEGATRON_RUNNER
    return SLIME if framework == "slime" else MEGATRON


# ------------------------------------------------------------------------------ megatron's process groups
# The NCCL groups megatron-core 0.19.2's initialize_model_parallel builds (parallel_state.py, its
# group_desc names), as (name, size) for one rank of the first pipeline stage, which is a member of
# every group kind (later stages miss POSITION_EMBEDDING_GROUP, middle stages EMBEDDING_GROUP too).
# tests/test_cost_model_memory.py checks this list against megatron-core itself (fake process group).
def megatron_process_groups(layout: Layout) -> tuple[tuple[str, int], ...]:
    """Megatron builds the expert groups whether or not the model has experts."""
    tp, pp, cp, dp, ep, etp, edp = layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.etp, layout.edp
    return (
        ("DEFAULT_PROCESS_GROUP", layout.world_size),   # init_process_group's own
        ("GTP_WEIGHT_REMAT_GROUP", 1),
        ("DATA_PARALLEL_GROUP_WITH_CP", dp * cp),
        ("DATA_PARALLEL_GROUP", dp),
        ("CONTEXT_PARALLEL_GROUP", cp),
        ("MODEL_PARALLEL_GROUP", tp * pp),
        ("TENSOR_MODEL_PARALLEL_GROUP", tp),
        ("PIPELINE_MODEL_PARALLEL_GROUP", pp),
        ("EMBEDDING_GROUP", 1 if pp == 1 else 2),
        ("POSITION_EMBEDDING_GROUP", 1),
        ("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", tp * dp * cp),
        ("TENSOR_AND_DATA_PARALLEL_GROUP", tp * dp),
        ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", tp * cp),
        ("EXPERT_GTP_WEIGHT_REMAT_GROUP", 1),
        ("EXPERT_MODEL_PARALLEL_GROUP", ep),
        ("EXPERT_TENSOR_PARALLEL_GROUP", etp),
        ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", etp * ep),
        ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", etp * ep * pp),
        ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP", etp * ep * pp),
        ("EXPERT_DATA_PARALLEL_GROUP", edp),
        ("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", layout.world_size),
    )


# Groups a training step issues collectives on whatever their size: the distributed optimizer's gradient
# reduce-scatter and parameter all-gather (dense over DP x CP, experts over expert-DP), its gradient-norm
# all-reduce, and the default group (barriers).
_ALWAYS_USED = {"DEFAULT_PROCESS_GROUP", "DATA_PARALLEL_GROUP_WITH_CP", "EXPERT_DATA_PARALLEL_GROUP",
                "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"}
# Groups whose collectives megatron skips at size 1 (TP/SP, CP ring, pipeline sends, the embedding
# all-reduce, token dispatch, the aux-loss and grad-stats reductions).
_USED_ABOVE_ONE = {"TENSOR_MODEL_PARALLEL_GROUP", "CONTEXT_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP",
                   "EMBEDDING_GROUP", "EXPERT_MODEL_PARALLEL_GROUP", "EXPERT_TENSOR_PARALLEL_GROUP",
                   "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
                   "MODEL_PARALLEL_GROUP"}


def communicators(layout: Layout, runtime: Runtime, is_moe: bool = True) -> tuple[tuple, tuple]:
    """(created, used): the (name, size) of the NCCL communicators one rank holds, and of those a
    training step communicates on (their channel buffers are allocated on first use). Eager
    initialisation creates one for every group; lazy only for the groups used."""
    groups = megatron_process_groups(layout)
    used = tuple(g for g in groups if g[0] in _ALWAYS_USED and (is_moe or g[0] != "EXPERT_DATA_PARALLEL_GROUP")
                 or (g[0] in _USED_ABOVE_ONE and g[1] > 1))
    created = groups if runtime.nccl_init == EAGER else used
    return created, used
