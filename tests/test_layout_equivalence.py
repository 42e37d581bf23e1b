"""Layouts train the same model: the megatron runner's configuration for PP 1, PP 2, the interleaved
PP 2 x VPP 2 and TP 2 (with sequence parallelism) gives the same loss and the same gradients per layer;
for a MoE model, EP 2 and TP 2 x ETP 2 give the same loss as EP 1; for a Qwen3.6-like model with
megatron's Gated DeltaNet layers, TP 2 x ETP 2 and PP 2 give the same loss and gradients, EP 2 the same loss.

Two gloo processes on the CPU run megatron-core's own schedules, tensor-parallel layers and token
dispatcher (allgather: the alltoall one needs CUDA streams) over tiny Llama- and Qwen3.6-shaped
models built by the runner's torch-native block spec with CPU initialisation (fp32, so the comparison
is exact up to summation order). The MoE case fails if a rank draws its local experts itself (the
bug experiments/megatron/same_weights.init_experts_cpu fixed: losses 5.549 / 5.534 / 5.536 instead of
one). This caught a real bug: with ModelParallelConfig's default batched p2p, the interleaved schedule
at PP 2 swapped activations and gradients between the two ranks from the second micro-batch group on
(grad norm ~1e5 instead of ~23 on 2 x H200).
"""
from __future__ import annotations

import dataclasses
import os
import warnings

import pytest
import torch
from experiments.megatron.launch import free_port
from megatron_cpu import cpu_patches, tiny_qwen36_gdn

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SEQ, VOCAB, MICROBATCHES = 32, 256, 4


def _worker(rank: int, world: int, grid: dict, port: int, out: str) -> None:
    pp, vpp, tp, ep, etp = (grid.get(k, 1) for k in ("pp", "vpp", "tp", "ep", "etp"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    from cost_model.nouns.layout import Layout
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload
    from experiments.megatron import torch_native as tnb
    from experiments.megatron.config import transformer_config_kwargs
    from experiments.megatron.model_run import trial_model
    from experiments.megatron.train_loop import forward_step, step_loss

    parallel_state.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                             expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                                             create_gloo_process_groups=False)
    torch._dynamo.config.disable = True  # as the runner's workers run (TORCHDYNAMO_DISABLE=1): jit_fuser eager
    with cpu_patches(tensor_parallel.get_cuda_rng_tracker()):
        if grid.get("gdn"):
            tiny = tiny_qwen36_gdn()
        elif grid.get("moe"):
            tiny = dataclasses.replace(trial_model(load_model("qwen3.6-35b-a3b"), 2, replace_gdn=True), hidden_size=64,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                                       num_experts_per_tok=2, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=32, vocab_size=VOCAB)
        else:
            tiny = dataclasses.replace(trial_model(load_model("llama3-8b"), 4), hidden_size=64,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       intermediate_size=128, vocab_size=VOCAB)
        layout = Layout(world, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp)
        kw = transformer_config_kwargs(tiny, layout, Workload(seq_len=SEQ, global_batch=MICROBATCHES),
                                          use_cpu_initialization=True)
        kw.update(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
        if grid.get("moe") or grid.get("gdn"):
            kw["moe_token_dispatcher_type"] = "allgather"
        cfg = TransformerConfig(**kw)
        torch.manual_seed(5)  # as the runner's worker does
        chunks = []
        for v in range(vpp):
            stage = v if vpp > 1 else None
            spec, _ = tnb.block_spec(tiny, cfg, "torch-native", vp_stage=stage, init_seed=5)
            chunks.append(GPTModel(
                cfg, spec, vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", vp_stage=stage,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)))
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True)
        chunks = [DistributedDataParallel(config=cfg, ddp_config=ddp, module=c, disable_bucketing=i > 0)
                  for i, c in enumerate(chunks)]
        toks = torch.randint(0, VOCAB, (MICROBATCHES, SEQ + 1), generator=torch.Generator().manual_seed(3))
        batches = [{"tokens": toks[i:i + 1, :-1], "labels": toks[i:i + 1, 1:], "loss_mask": torch.ones(1, SEQ),
                    "position_ids": torch.arange(SEQ).unsqueeze(0)} for i in range(MICROBATCHES)]
        its = [iter(batches) for _ in chunks]
        reduced = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=its if vpp > 1 else its[0],
            model=chunks if vpp > 1 else chunks[0], num_microbatches=MICROBATCHES, seq_length=SEQ,
            micro_batch_size=1, decoder_seq_length=SEQ, forward_only=False)
        # Gradients by global layer, with how TP holds them: a shard, or (sequence parallel) a partial sum
        # that finalize_model_grads would all-reduce; at DP 1 with untied embeddings it has nothing else to do.
        grads = {}
        for c in chunks:
            for layer in c.module.decoder.layers:
                for name, p in layer.named_parameters():
                    kind = ("shard" if getattr(p, "tensor_model_parallel", False)
                            else "partial" if getattr(p, "sequence_parallel", False) and tp > 1 else "whole")
                    grads[f"{layer.layer_number}.{name}"] = (kind, p.main_grad.clone())
        torch.save({"loss": step_loss(reduced), "grads": grads}, f"{out}.{rank}.pt")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


# The ranks are forked from one server process that imported torch and megatron-core once (each spawned rank
# importing them again cost most of this file's time); the server has run nothing, so no thread pool is forked.
_PRELOAD = ["torch", "torch.distributed", "megatron.core.parallel_state", "megatron.core.tensor_parallel",
            "megatron.core.distributed", "megatron.core.models.gpt.gpt_model", "megatron.core.pipeline_parallel",
            "megatron.core.transformer.transformer_config", "experiments.megatron.torch_native",
            "experiments.megatron.config", "experiments.megatron.train_loop", "megatron_cpu", __name__]
_BASELINES: dict = {}


def _run(tmp_path, **grid) -> tuple[float, dict]:
    """(loss, {layer.param: gradient norm, or the gradient itself where one rank holds it whole}) of
    one layout (grid: tp, pp, vpp, ep, etp; moe=True for the MoE model, gdn=True for the GDN + MoE one).
    The one-rank runs are the baselines several tests compare with: run once per session."""
    import multiprocessing

    import torch.multiprocessing as tmp

    key = tuple(sorted(grid.items()))
    if key in _BASELINES:
        return _BASELINES[key]
    world = max(grid.get("pp", 1) * grid.get("tp", 1), grid.get("ep", 1))
    out = str(tmp_path / "-".join(f"{k}{v}" for k, v in sorted(grid.items())))
    multiprocessing.set_forkserver_preload(_PRELOAD)
    tmp.start_processes(_worker, args=(world, grid, free_port(), out), nprocs=world, join=True,
                        start_method="forkserver")
    loss, parts = None, {}
    for rank in range(world):
        d = torch.load(f"{out}.{rank}.pt")
        loss = d["loss"] if d["loss"] is not None else loss
        for name, (kind, g) in d["grads"].items():
            parts.setdefault(name, (kind, []))[1].append(g)
    grads = {}
    for name, (kind, gs) in parts.items():
        if kind == "shard":  # TP shards: compare the whole gradient's norm
            grads[name] = torch.sqrt(sum((g.double() ** 2).sum() for g in gs))
        elif kind == "partial":  # sequence-parallel norms: the sum of the ranks' partial gradients
            grads[name] = sum(gs)
        else:
            grads[name] = gs[0]
    if world == 1:
        _BASELINES[key] = (loss, grads)
    return loss, grads


def _norms(grads: dict) -> dict:
    return {k: (g if g.dim() == 0 else torch.linalg.vector_norm(g.double())) for k, g in grads.items()}


def test_pipeline_splits_give_the_same_loss_and_gradients(tmp_path):
    pytest.importorskip("megatron.core")
    loss1, grads1 = _run(tmp_path)
    assert 5.0 < loss1 < 6.5 and len(grads1) > 20
    for pp, vpp in ((2, 1), (2, 2)):
        loss, grads = _run(tmp_path, pp=pp, vpp=vpp)
        assert loss == pytest.approx(loss1, rel=1e-6), (pp, vpp)
        assert grads.keys() == grads1.keys()
        for name, g in grads1.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-7, msg=f"PP {pp} VPP {vpp}: {name}")


def test_tensor_parallel_with_sequence_parallel_gives_the_same_loss_and_gradients(tmp_path):
    """TP 2 shards every linear (and, with SP, the sequence): the same weights (CPU initialisation
    draws each weight whole), the same loss, and per layer the same gradient norms."""
    pytest.importorskip("megatron.core")
    loss1, grads1 = _run(tmp_path)
    loss2, grads2 = _run(tmp_path, tp=2)
    assert loss2 == pytest.approx(loss1, rel=1e-6)
    assert grads2.keys() == grads1.keys()
    n1, n2 = _norms(grads1), _norms(grads2)
    for name in grads1:
        assert float(n2[name]) == pytest.approx(float(n1[name]), rel=1e-4), name


def test_expert_layouts_start_from_the_same_moe_model(tmp_path):
    """EP 2 (each rank 2 of the 4 experts) and TP 2 x ETP 2 (each rank half of every expert's FFN, its
    fc1 shard [gate | up] of that half) compute the EP 1 loss: the experts are the same experts."""
    pytest.importorskip("megatron.core")
    loss1, _ = _run(tmp_path, moe=True)
    assert 5.0 < loss1 < 6.5
    assert _run(tmp_path, moe=True, ep=2)[0] == pytest.approx(loss1, rel=1e-6)
    assert _run(tmp_path, moe=True, tp=2, etp=2)[0] == pytest.approx(loss1, rel=1e-6)


def _assert_same_gradients(grads1: dict, grads: dict, what: str) -> None:
    n1, n = _norms(grads1), _norms(grads)
    assert grads.keys() == grads1.keys(), what
    for name in grads1:
        assert float(n[name]) == pytest.approx(float(n1[name]), rel=1e-4, abs=1e-9), f"{what}: {name}"


def test_gated_deltanet_model_is_the_same_model_at_tp2_pp2_and_ep2(tmp_path):
    """A tiny Qwen3.6-like model with megatron's GatedDeltaNet layers (3 GDN + 1 full attention, MoE;
    the torch gated delta rule, as without fla): TP 2 (sequence parallel, GDN heads and in_proj
    sections sharded, experts over ETP 2) and PP 2 compute the TP 1 loss and per-layer gradients, and
    EP 2 its loss. Fails when a TP rank's in_proj is a contiguous slice of the full weight (megatron's
    own CPU initialisation) or conv1d/A_log are drawn per rank (see same_weights.init_gdn_cpu)."""
    pytest.importorskip("megatron.core")
    loss1, grads1 = _run(tmp_path, gdn=True)
    assert 5.0 < loss1 < 6.5
    assert any(".self_attention.in_proj.weight" in k for k in grads1)
    assert any(".self_attention.A_log" in k for k in grads1) and any(".self_attention.conv1d.weight" in k for k in grads1)
    loss_tp, grads_tp = _run(tmp_path, gdn=True, tp=2, etp=2)
    assert loss_tp == pytest.approx(loss1, rel=1e-6)
    _assert_same_gradients(grads1, grads_tp, "TP 2")
    loss_pp, grads_pp = _run(tmp_path, gdn=True, pp=2)
    assert loss_pp == pytest.approx(loss1, rel=1e-6)
    _assert_same_gradients(grads1, grads_pp, "PP 2")
    assert _run(tmp_path, gdn=True, ep=2)[0] == pytest.approx(loss1, rel=1e-6)
