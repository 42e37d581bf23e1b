"""Megatron-LM's own verdict on a command line, computed on the CPU (a test helper, not a test file).

`validate(argv, world_size)` runs, in order, every Megatron check a training layout meets before
the first step, each with megatron-core's own code (0.19.2, the version the test extra installs):

1. argparse        `megatron.training.arguments.add_megatron_arguments` (flag names, choices, types)
2. validate_args   `megatron.training.arguments.validate_args` (world % TP*PP*CP, CP vs seq-length,
                   EP vs num_experts, VPP needs PP > 1, selective recompute takes no method,
                   CPU offload needs --use-precision-aware-optimizer, ...)
3. config          `core_transformer_config_from_args` -> TransformerConfig/MLATransformerConfig
                   __post_init__ (heads % TP, query groups vs TP, full recompute needs a method and
                   --recompute-num-layers, selective takes no --recompute-num-layers, recompute modules)
4. layer_split     `megatron.core.transformer.transformer_block.get_num_layers_to_build`, which every
                   pipeline stage calls when it builds its layers (layers % PP, and with VPP the
                   stage's layers % VPP; validate_args skips the first when VPP is set)
5. parallel_state  `parallel_state.initialize_model_parallel` on a fake process group of
                   `world_size` ranks (world % TP*PP*CP and the expert grid world % ETP*EP*PP)
6. dispatcher      the MoE layer's token dispatcher constructor for the configured type
                   (`MoEFlexTokenDispatcher` asserts ETP x EP > 1 for DeepEP), with the local expert
                   count computed as `BaseMoELayer.__init__` does (moe_layer.py: experts % EP)
7. microbatches    `ConstantNumMicroBatchesCalculator`, which slime builds at start-up
                   (`slime/backends/megatron_utils/initialize.py` -> init_num_microbatches_calculator):
                   global batch % (micro batch x DP)

What needs a GPU or GPU-only packages is patched, and only for the duration of one call:
`get_device_arch_version` -> 9 and `torch.cuda.get_device_capability` -> (9, 0) (H100/H200),
`torch.cuda.Stream` -> a stub (the alltoall dispatcher's side stream);
`transformer_config.is_te_min_version` -> True and RoPE's fused kernel -> a stub (the training image
has a recent Transformer Engine, `Stack.transformer_engine`); DeepEP's buffer manager -> a stub
(`Stack.deepep`); CUDA_DEVICE_MAX_CONNECTIONS=1, WORLD_SIZE and RANK=0 in the environment (slime's
launch sets the first; Megatron asserts it for TP or CP > 1 before Blackwell).

Each call is independent: the parsed namespace is deep-copied before validation, the fake process
group and Megatron's parallel state are torn down afterwards, and no global calculator is set.
A call takes a few milliseconds.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import logging
import os
import warnings
from typing import Sequence
from unittest import mock

# slime's own flags that can appear in a layout's argv (search_space.megatron_args.batch_args);
# value: how many values follow the flag. They are removed before Megatron's parser sees the argv.
SLIME_ONLY_FLAGS = {"--use-dynamic-batch-size": 0, "--max-tokens-per-gpu": 1}

STAGES = ("argparse", "validate_args", "config", "layer_split", "parallel_state", "dispatcher",
          "microbatches")


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and sys.exit(2)
        raise _ArgumentError(message)


_PARSER: _Parser | None = None


def _parser() -> _Parser:
    global _PARSER
    if _PARSER is None:
        from megatron.training.arguments import add_megatron_arguments

        parser = _Parser(description="Megatron-LM Arguments", allow_abbrev=False)
        with _quiet():
            add_megatron_arguments(parser)
        _PARSER = parser
    return _PARSER


@contextlib.contextmanager
def _quiet():
    megatron_logger = logging.getLogger("megatron")
    level = megatron_logger.level
    megatron_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        megatron_logger.setLevel(level)


class _StubDispatchManager:
    """Stands in for DeepEP's buffer manager (the DeepEP library is a stack item, not Megatron)."""

    def __init__(self, *args, **kwargs):
        pass


class _StubStream:
    def __init__(self, *args, **kwargs):
        pass


def _strip_slime_flags(argv: Sequence[str]) -> list[str]:
    out, i = [], 0
    argv = list(argv)
    while i < len(argv):
        if argv[i] in SLIME_ONLY_FLAGS:
            i += 1 + SLIME_ONLY_FLAGS[argv[i]]
        else:
            out.append(argv[i])
            i += 1
    return out


def parse(argv: Sequence[str], world_size: int) -> argparse.Namespace:
    """Megatron's parse_args on `argv`, with the environment a slime launch of `world_size` gives
    (what `megatron.training.arguments.parse_args` does after argparse, minus the yaml and MSC options)."""
    args = _parser().parse_args(_strip_slime_flags(argv))
    args._is_global_batch_size_explicitly_specified = args.global_batch_size is not None
    args.rank = 0
    args.world_size = world_size
    # argparse shares mutable defaults (lists) between parses; validate_args may append to them.
    return copy.deepcopy(args)


def _patches(world_size: int) -> contextlib.ExitStack:
    import torch
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import transformer_config
    from megatron.core.transformer.moe import token_dispatcher
    from megatron.training import arguments

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(os.environ, {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1", "WORLD_SIZE": str(world_size), "RANK": "0",
        "LOCAL_RANK": "0"}))
    stack.enter_context(mock.patch.object(arguments, "get_device_arch_version", lambda: 9))
    stack.enter_context(mock.patch.object(arguments, "_print_args", lambda *a, **k: None))
    stack.enter_context(mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)))
    stack.enter_context(mock.patch.object(transformer_config, "is_te_min_version", lambda *a, **k: True))
    stack.enter_context(mock.patch.object(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None))
    stack.enter_context(mock.patch.object(token_dispatcher, "_DeepepManager", _StubDispatchManager))
    # The alltoall dispatcher creates a side CUDA stream, kept in a class attribute (restored on exit).
    stack.enter_context(mock.patch.object(torch.cuda, "Stream", _StubStream))
    stack.enter_context(mock.patch.object(token_dispatcher.MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None))
    stack.enter_context(_quiet())
    return stack


class _StageError(Exception):
    """A failure in a later stage of one combined step (parallel_state, then dispatcher)."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


def _message(stage: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{stage}: {type(exc).__name__}: {text}"


def validate(argv: Sequence[str], world_size: int) -> tuple[bool, str]:
    """(accepted, message): whether Megatron accepts `argv` on `world_size` GPUs, and if not, the
    stage (see STAGES) and Megatron's own error message."""
    stage = "argparse"
    try:
        with _patches(world_size):
            args = parse(argv, world_size)

            stage = "validate_args"
            from megatron.training.arguments import core_transformer_config_from_args, validate_args

            validate_args(args, {})

            stage = "config"
            config = core_transformer_config_from_args(args)

            stage = "layer_split"
            from megatron.core.transformer.transformer_block import get_num_layers_to_build

            for pp_rank in sorted({0, args.pipeline_model_parallel_size - 1}):
                with _pipeline_rank(pp_rank, args.virtual_pipeline_model_parallel_size):
                    get_num_layers_to_build(config, vp_stage=0, pp_rank=pp_rank)

            stage = "parallel_state"
            _check_process_groups(args, config, world_size)

            stage = "microbatches"
            from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

            ConstantNumMicroBatchesCalculator(
                args.global_batch_size, args.micro_batch_size, args.data_parallel_size,
                args.decrease_batch_size_if_needed, 0)
    except _StageError as e:
        return False, _message(e.stage, e.__cause__)
    except Exception as e:  # noqa: BLE001 - Megatron raises AssertionError, ValueError, RuntimeError...
        return False, _message(stage, e)
    return True, "accepted"


def stage_layers(argv: Sequence[str], world_size: int) -> list[list[int]]:
    """The layer indices Megatron builds on each pipeline rank (all its virtual stages, in order), from
    megatron-core's own get_transformer_layer_offset and get_num_layers_to_build; raises what Megatron raises."""
    with _patches(world_size):
        args = parse(argv, world_size)
        from megatron.training.arguments import core_transformer_config_from_args, validate_args
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        validate_args(args, {})
        config = core_transformer_config_from_args(args)
        vpp = args.virtual_pipeline_model_parallel_size
        ranks = []
        for pp_rank in range(args.pipeline_model_parallel_size):
            indices: list[int] = []
            for vp_stage in (range(vpp) if vpp else [None]):
                with _pipeline_rank(pp_rank, vpp):
                    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
                    count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
                indices.extend(range(offset, offset + count))
            ranks.append(indices)
        return ranks


@contextlib.contextmanager
def _pipeline_rank(pp_rank: int, vpp: int | None):
    """parallel_state's pipeline rank and virtual size set for the call: with --pipeline-model-parallel-layout,
    megatron-core's layer offset and count read them from there and ignore the pp_rank argument."""
    from megatron.core import parallel_state

    parallel_state.set_pipeline_model_parallel_rank(pp_rank)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp)
    try:
        yield
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


def _check_process_groups(args, config, world_size: int) -> None:
    """initialize_model_parallel on a fake process group, then the MoE token dispatcher."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        try:
            # The call megatron/training/initialize.py:_initialize_distributed makes.
            parallel_state.initialize_model_parallel(
                args.tensor_model_parallel_size,
                args.pipeline_model_parallel_size,
                args.virtual_pipeline_model_parallel_size,
                gtp_remat_size=args.gtp_weight_remat_size,
                expert_gtp_remat_size=args.expert_gtp_weight_remat_size,
                context_parallel_size=args.context_parallel_size,
                hierarchical_context_parallel_sizes=args.hierarchical_context_parallel_sizes,
                hybrid_context_parallel=args.hybrid_context_parallel,
                expert_model_parallel_size=args.expert_model_parallel_size,
                num_distributed_optimizer_instances=args.num_distributed_optimizer_instances,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                order="tp-cp-ep-dp-pp" if not args.use_tp_pp_dp_mapping else "tp-cp-ep-pp-dp",
                create_gloo_process_groups=False,
            )
        except Exception as e:
            raise _StageError("parallel_state") from e
        if config.num_moe_experts:
            try:
                _build_token_dispatcher(config)
            except Exception as e:
                raise _StageError("dispatcher") from e
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _build_token_dispatcher(config) -> None:
    from megatron.core import utils
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe import token_dispatcher

    pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["ep", "expt_tp", "tp_ep"])
    # megatron/core/transformer/moe/moe_layer.py BaseMoELayer.__init__
    ep_size = utils.get_pg_size(pg_collection.ep)
    ep_rank = utils.get_pg_rank(pg_collection.ep)
    assert config.num_moe_experts % ep_size == 0
    num_local_experts = config.num_moe_experts // ep_size
    local_expert_indices = [ep_rank * num_local_experts + i for i in range(num_local_experts)]
    # MoELayer.__init__ picks the dispatcher class by type.
    cls = {
        "allgather": token_dispatcher.MoEAllGatherTokenDispatcher,
        "alltoall": token_dispatcher.MoEAlltoAllTokenDispatcher,
        "flex": token_dispatcher.MoEFlexTokenDispatcher,
    }[config.moe_token_dispatcher_type]
    cls(num_local_experts, local_expert_indices, config=config, pg_collection=pg_collection)
