"""One rank's training: process groups, the model, the optimizer, the data, the timed steps.

`train` runs in a worker process (see worker.py) and returns what the rank measured; each phase
sends a heartbeat and names itself in `state["phase"]`, so a failure is classified by where it
happened. torch and megatron are imported inside the functions: this module is imported by the
parent, which must stay light.
"""
from __future__ import annotations

import time

import os

from cost_model.nouns.model_spec import LINEAR_ATTENTION
from experiments.megatron.config import build_transformer_config
from experiments.megatron.data import StepBatches, load_rows
from experiments.megatron.memory import GIB, MemoryTracker, churn_report, memory_report
from experiments.megatron.model_run import padded_vocab

# The environment a rank reports back (what it actually ran with, whoever set it).
REPORTED_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCHDYNAMO_DISABLE",
                "FLA_TILELANG", "FLA_FLASH_QLA", "CUDA_HOME")


def train(rank: int, world: int, job: dict, send, state: dict, device_index: int) -> dict:
    """Run the job's steps on this rank; `send(kind, **fields)` reports progress to the parent."""
    gpu_name = _init_parallel(rank, world, job, device_index)
    send("hb", phase="config")
    return {"gpu_name": gpu_name, **run_phases(job, send, state, device_index)}


def run_phases(job: dict, send, state: dict, device_index: int) -> dict:
    """Everything after the process groups: config, build, optimizer, the timed steps; what the rank
    measured (the CPU tests run this on gloo with CUDA calls stubbed)."""
    import megatron.core
    import torch

    from experiments.megatron import torch_native as tnb

    state["phase"] = "config"
    backend, why = tnb.resolve_backend(job["backend"])
    gdn_layers = job["model"].count(LINEAR_ATTENTION)
    fla_status = None
    if gdn_layers:
        from experiments.megatron import gdn
        fla_status = gdn.configure_fla(device_index)  # before fla's first call; refuses a wrong kernel here
    # CPU initialisation draws each full weight once and slices it, so layouts start from the same weights.
    config = build_transformer_config(job["model"], job["layout"], job["workload"], backend=backend,
                                      use_cpu_initialization=bool(job.get("cpu_init")))
    tnb.reset_kernel_report()

    state["phase"] = "build"
    memory = state["memory"] = MemoryTracker()
    chunks, info, n_params = _build_model(job, config, backend)
    mem_built = _allocated_gib()
    memory.sample("after_build")
    send("hb", phase="optimizer")

    state["phase"] = "optimizer"
    optimizer, optimizer_note = build_optimizer(chunks, job["layout"], job["lr"])
    from megatron.core.distributed import finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    mem_opt = _allocated_gib()
    memory.sample("after_optimizer_built")
    batches = _step_batches(job)

    state["phase"] = "train"
    send("hb", phase="train", params=n_params)
    step_times, losses, grad_norms = _run_steps(chunks, optimizer, batches, job, send, memory)
    extra = {}
    if gdn_layers:
        from experiments.megatron import fla_tuning, gdn
        extra = {"fla": fla_status, "fla_dispatch": gdn.fla_dispatches()}
        fla_tuning.record()
    return {
        **extra,
        "env_seen": {k: os.environ.get(k) for k in REPORTED_ENV if os.environ.get(k) is not None},
        "megatron_core": getattr(megatron.core, "__version__", "?"),
        "torch": torch.__version__,
        "backend": backend,
        "backend_reason": why,
        "kernels": info.get("attune_kernels", {}),
        "kernels_ran": tnb.kernel_report(),
        "optimizer": optimizer_note,
        "step_times_s": step_times,
        "losses": losses,
        "grad_norms": grad_norms,
        "num_microbatches": batches.num_microbatches,
        "params_local": n_params,
        "memory_gib": memory_report(mem_built, mem_opt, memory),
        "allocator_churn": churn_report(memory),
    }


def _init_parallel(rank: int, world: int, job: dict, device_index: int) -> str:
    """NCCL, megatron's parallel state and the seeds; returns the GPU's name."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from experiments.megatron import torch_native as tnb

    layout, seed = job["layout"], job["seed"]
    torch.cuda.set_device(device_index)
    gpu_name = torch.cuda.get_device_name(device_index)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timedelta(seconds=job["nccl_timeout_s"]),
                            device_id=torch.device("cuda", device_index))

    from megatron.core import parallel_state, tensor_parallel
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp, create_gloo_process_groups=False)
    # As megatron's training does: the CPU generator (router weights; all weights under CPU
    # initialisation) seeded alike on every rank, then the per-TP/EP-rank CUDA generators.
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    tnb.set_sdpa_backend(job.get("sdpa_backend", "auto"))
    return gpu_name


def _build_model(job: dict, config, backend: str):
    """(DDP-wrapped model chunks, one per virtual pipeline stage; the backend's metainfo; local
    parameter count), parameters broadcast across data-parallel ranks."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    from experiments.megatron import torch_native as tnb

    model, layout, workload = job["model"], job["layout"], job["workload"]
    vocab = padded_vocab(model.vocab_size, layout.tp)
    chunks, info = [], {}
    for v in range(layout.vpp):
        vp_stage = v if layout.vpp > 1 else None
        spec, info = tnb.block_spec(model, config, backend, vp_stage=vp_stage,
                                    init_seed=job["seed"] if job.get("cpu_init") else None)
        m = GPTModel(config, spec, vocab_size=vocab, max_sequence_length=workload.seq_len,
                     pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                     post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                     share_embeddings_and_output_weights=model.tie_word_embeddings,
                     position_embedding_type="rope", rotary_percent=model.partial_rotary_factor,
                     rotary_base=10000, vp_stage=vp_stage)
        chunks.append(Float16Module(config, m))
    n_params = sum(p.numel() for c in chunks for p in c.parameters())
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               overlap_param_gather=False, use_distributed_optimizer=True)
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0)
              for i, c in enumerate(chunks)]
    for c in chunks:
        c.broadcast_params()
    return chunks, info, n_params


def build_optimizer(chunks, layout, lr: float):
    """megatron's distributed optimizer with Adam; precision-aware (exp_avg_dtype) when this
    megatron accepts it (it needs TE's FusedAdam unless the optimizer is CPU-offloaded)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[layout.exp_avg_dtype]
    base = dict(optimizer="adam", lr=lr, min_lr=lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95,
                adam_eps=1e-8, clip_grad=1.0, bf16=True, params_dtype=torch.bfloat16, use_distributed_optimizer=True)
    if layout.offloaded:
        base.update(optimizer_cpu_offload=True, optimizer_offload_fraction=layout.optimizer_offload_fraction,
                    overlap_cpu_optimizer_d2h_h2d=layout.overlap_d2h_h2d)
    try:
        cfg = OptimizerConfig(**base, use_precision_aware_optimizer=True, exp_avg_dtype=dtype, exp_avg_sq_dtype=dtype)
        note = f"precision-aware distributed optimizer (Adam, moments {layout.exp_avg_dtype})"
    except (RuntimeError, AssertionError, ImportError) as e:
        if layout.offloaded:
            raise
        cfg = OptimizerConfig(**base)
        note = (f"standard distributed optimizer (torch Adam, fp32 master weights and moments); precision-aware "
                f"not available here: {' '.join(str(e).split())[:200]}")
        if layout.exp_avg_dtype != "fp32":
            note += f"; requested {layout.exp_avg_dtype} moments NOT applied"
    optimizer = get_megatron_optimizer(cfg, chunks, use_gloo_process_groups=False)
    if layout.offloaded:
        # megatron-core builds the CPU-offload optimizer twice; the first build's fp32 copies are held by reference
        # cycles until the cyclic collector happens to run (before, during or after the first step: v1-v11 saw
        # all three). Collected here, every run's peak is the same one (cost_model.nouns.runtime
        # offload_first_build_collected) and the memory is the user's.
        import gc
        gc.collect()
        note += "; first offload build collected before the first step"
    return optimizer, note


def _step_batches(job: dict) -> StepBatches:
    """This rank's data (read in the optimizer phase, as the rows file always was)."""
    from megatron.core import parallel_state

    return StepBatches(global_batch=job["global_batch"], dp=parallel_state.get_data_parallel_world_size(),
                       dp_rank=parallel_state.get_data_parallel_rank(),
                       rows_per_microbatch=job["layout"].rows_per_microbatch, seq_len=job["workload"].seq_len,
                       vocab=job["model"].vocab_size, seed=job["seed"],
                       rows=load_rows(job["rows_file"]) if job.get("rows_file") else None)


def _run_steps(chunks, optimizer, batches: StepBatches, job: dict, send,
               memory: MemoryTracker | None = None) -> tuple[list, list, list]:
    """The timed steps: (step times, losses, gradient norms); `memory` samples the device after each
    step (outside the timed span). Stops early, all ranks together, when the next step would overrun
    the trial's deadline."""
    import torch
    import torch.distributed as dist
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fwd_bwd = get_forward_backward_func()
    steps, deadline, seq = job["steps"], job["deadline"], batches.seq
    step_times, losses, grad_norms = [], [], []
    stop_flag = torch.zeros(1, device="cuda")
    for step in range(steps):
        micro_batches = batches(step)
        its = [iter(micro_batches) for _ in chunks]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = fwd_bwd(forward_step_func=forward_step, data_iterator=its if len(chunks) > 1 else its[0],
                          model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=batches.num_microbatches,
                          seq_length=seq, micro_batch_size=batches.mbs, decoder_seq_length=seq, forward_only=False)
        _ok, grad_norm, _zeros = optimizer.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        if memory is not None:
            memory.sample("after_optimizer_first_step" if step == 0 else None)
        loss = step_loss(reduced)
        losses.append(loss)
        grad_norms.append(None if grad_norm is None else float(grad_norm))
        send("hb", phase="train", step=step, step_time_s=dt, loss=loss)
        # The first step's time (kernel compilation, autotuning, the allocator's first segments) says nothing of
        # the next one's: a first Gated DeltaNet step compiled for 140 s and stopped a trial whose steps took 2.5 s.
        stop_flag.fill_(1.0 if step > 0 and time.time() + 1.2 * dt > deadline and step < steps - 1 else 0.0)
        dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        if stop_flag.item() > 0:
            break
    return step_times, losses, grad_norms


def _allocated_gib() -> float:
    import torch

    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / GIB


def loss_func(loss_mask, output_tensor):
    """Masked mean cross-entropy of one micro-batch, as megatron's 3-tuple contract: (loss sum,
    token count, logged values); the schedule divides by the count and the micro-batch count."""
    import torch
    losses = output_tensor.float()
    mask = loss_mask.float()
    total = torch.sum(losses.view(-1) * mask.view(-1))
    count = mask.sum()
    return total, count.to(torch.int), {"lm loss": torch.stack([total.detach(), count.detach()])}


def forward_step(data_iterator, model_chunk):
    """megatron's forward_step_func: GPTModel returns per-token losses when given labels."""
    from functools import partial
    batch = next(data_iterator)
    out = model_chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(loss_func, batch["loss_mask"])


def step_loss(reduced: list) -> float | None:
    """The step's masked mean loss from the schedule's per-micro-batch logged values."""
    if not reduced:
        return None
    import torch
    tot = torch.stack([r["lm loss"] for r in reduced]).sum(0)
    return float(tot[0] / tot[1].clamp(min=1))
