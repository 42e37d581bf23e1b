"""The `megatron` trial runner: N real training steps of a layout with megatron-core on local GPUs.

One process per GPU (torch.multiprocessing spawn, or a Ray placement group with one actor per GPU
when `ray` is importable and asked for; both run the same `_worker`), NCCL (NVLS off),
`parallel_state.initialize_model_parallel(tp, pp, vpp, cp, ep, etp)`, a GPTModel built from the
catalog ModelSpec through TransformerConfig, megatron's DDP + distributed optimizer (Adam,
lr 1e-5), fixed seeds, synthetic (or given) token rows. Step times are measured with
torch.cuda.synchronize + perf_counter; failures are classified (cuda_oom, host_oom, nccl_timeout,
hang, crash, invalid_config) and are results, not exceptions.

What runs is recorded, never silently changed:
- the model actually trained (`trial_model`): truncated to `layers` layers (explicit, or the largest
  count the cost model predicts to fit the local GPUs) and, for Qwen3.5/3.6/Next, with every Gated
  DeltaNet layer replaced by a full-attention layer (megatron's GDN needs fla, not importable on the
  measurement machine); MTP layers are not built. Predictions for comparison must use this model.
- the initial weights: by default each rank draws its own (megatron's GPU initialisation); with
  `cpu_init` every layout starts from the same full model (dense weights drawn whole and sliced, as
  megatron's CPU initialisation does; experts drawn by global expert index, see
  same_weights.init_experts_cpu; the generator reseeded per global layer, so PP and VPP
  splits agree, see same_weights.seeded_layer), which convergence arms need;
- the backend (te / torch-native / local, see experiments/torch_native_backend.py) and the kernels
  that ran; the optimizer actually built (precision-aware needs TE's FusedAdam); a global batch
  scaled down to fit the trial's time budget.

Standalone (GPU machine):
    python -m experiments.megatron_runner --model qwen3.6-35b-a3b --gpus 2 --layers 4 \
        --layout tp=1 ep=2 --steps 8 --seq-len 4096 --global-batch 16 --json
    python -m experiments.megatron_runner --suite benchmarks/megatron_h200_suite.json --out results.jsonl

Nothing heavy is imported at module level (no torch, megatron, ray or optuna): the parent imports
torch only to count GPUs and to spawn; megatron is imported in the workers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue as queue_mod
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from cost_model.hardware import GpuSpec, HardwareError, load_gpu
from cost_model.model_spec import FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, ModelError, ModelSpec, load_model
from cost_model.workload import Workload
from experiments.runner import TrialResult, TrialRunner, TrialSpec
from cost_model.case import Case
from cost_model.layout import InvalidLayout, Layout
from cost_model.layout_codec import layout_from_stored, parse_pairs
from cost_model.batching import rows_per_microbatch

RUNNER_NAME = "megatron"
DEFAULT_LR = 1e-5
DEFAULT_SEED = 1234
GDN_NOTE = "gdn: replaced by full attention (fla not importable)"
# How much slower than the cost model's (tuned Megatron + TE) step a torch-native run is assumed to be
# when sizing the global batch to the time budget (a guess; the measured step time is what counts).
BUDGET_SLOWDOWN = {"te": 1.5, "torch-native": 3.0, "local": 8.0, "auto": 3.0}
STARTUP_ALLOWANCE_S = 35.0  # torch + megatron import, NCCL init, model build, first step warm-up


# ================================================================================ the model run
def trial_model(model: ModelSpec, layers: int | None = None, replace_gdn: bool = True) -> ModelSpec:
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
    if model.num_nextn_predict_layers:
        notes.append(f"mtp: {model.num_nextn_predict_layers} MTP layer(s) not built")
    return notes


def _fits(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout):
    """The prediction for what this runner runs: without Transformer Engine there is no precision-aware
    optimizer, so the optimizer shard holds fp32 master weights and moments."""
    import importlib.util

    from cost_model.predict import predict
    te = importlib.util.find_spec("transformer_engine") is not None
    return predict(model, gpu, workload, layout, precision_aware_optimizer=te)


def auto_layers(model: ModelSpec, gpu: GpuSpec, workload: Workload, layout: Layout,
                replace_gdn: bool = True) -> tuple[int, str]:
    """The largest layer count (a multiple of PP x VPP) the cost model predicts to fit `layout` on
    `gpu`; raises ValueError when not even the smallest does."""
    step = layout.pp * layout.vpp
    best = None
    for n in range(step, model.num_hidden_layers + 1, step):
        p = _fits(trial_model(model, n, replace_gdn), gpu, workload, layout)
        if not p.fits:
            break  # memory grows with layers
        best = (n, p.peak_memory_gib, p.gpu_memory_gib)
    if best is None:
        raise ValueError(f"the cost model predicts that not even {step} layer(s) of {model.display_name} fit "
                         f"{layout.long_label} on {gpu.display_name}")
    n, peak, cap = best
    return n, f"auto: largest layer count predicted to fit ({peak:.1f} of {cap:.1f} GiB)"


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron's --make-vocab-size-divisible-by 128 padding, times TP."""
    m = multiple * tp
    return -(-vocab // m) * m


# ================================================================================ TransformerConfig
def transformer_config_kwargs(model: ModelSpec, layout: Layout, workload: Workload, *,
                              backend: str = "torch-native", use_cpu_initialization: bool = False) -> dict:
    """TransformerConfig keyword arguments for `model` under `layout` (the equivalents of
    search_space.megatron_args.model_args + parallel/recompute/dispatcher args)."""
    import torch
    import torch.nn.functional as F

    if model.count(MLA):
        raise NotImplementedError(f"{model.display_name}: MLA models are not supported by the megatron runner")
    if model.model_type == "gpt_oss":
        raise NotImplementedError("GPT-OSS (clamped SwiGLU, sinks, sliding window) is not wired into the megatron runner")
    if workload.precision != "bf16":
        raise NotImplementedError(f"precision {workload.precision} needs Transformer Engine; the runner trains bf16")
    kw = dict(
        num_layers=model.num_hidden_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.intermediate_size or model.moe_intermediate_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_key_value_heads,
        kv_channels=model.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=bool(model.mlp_bias or model.expert_bias),
        add_qkv_bias=bool(model.attention_bias),
        qk_layernorm=bool(model.qk_norm),
        attention_output_gate=bool(model.attn_output_gate),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=use_cpu_initialization,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        sequence_parallel=layout.sequence_parallel,
        # No fused kernels that need TE/Apex (the torch-native and local backends).
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    if layout.vpp > 1:
        # Megatron-LM training's default for the interleaved schedule (--no-overlap-p2p-communication
        # unset). ModelParallelConfig's own default, batched p2p, mixes activations and gradients at
        # PP 2, where the previous and next stage are the same rank: Megatron-LM then asks for PP > 2.
        kw.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if backend == "te":
        kw.update(apply_rope_fusion=True, bias_activation_fusion=True)
    if layout.recompute_granularity is not None:
        kw["recompute_granularity"] = layout.recompute_granularity
        if layout.recompute_granularity == "full":
            kw["recompute_method"] = layout.recompute_method
            kw["recompute_num_layers"] = layout.recompute_num_layers
        else:
            kw["recompute_modules"] = list(layout.selective_modules)
    if model.is_moe:
        kw.update(
            num_moe_experts=model.num_experts,
            moe_router_topk=model.num_experts_per_tok,
            moe_ffn_hidden_size=model.moe_intermediate_size,
            moe_grouped_gemm=True,  # slime's --moe-grouped-gemm; the local backend ignores it (SequentialMLP)
            moe_token_dispatcher_type=layout.dispatcher,
            moe_layer_freq=[1 if t == MOE else 0 for t in model.mlp_types],
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_dtype="fp32",  # megatron warns against bf16 routing with >= 32 experts
            moe_router_force_load_balancing=workload.routing == "balanced",
        )
        if layout.dispatcher == "flex":
            kw["moe_flex_dispatcher_backend"] = "deepep"
        if backend == "te":
            kw["moe_permute_fusion"] = True
        if model.shared_expert_intermediate_size:
            kw["moe_shared_expert_intermediate_size"] = model.shared_expert_intermediate_size
            kw["moe_shared_expert_gate"] = bool(model.shared_expert_gate)
    return kw


def build_transformer_config(model: ModelSpec, layout: Layout, workload: Workload, **options):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(**transformer_config_kwargs(model, layout, workload, **options))


# ================================================================================ failures
def classify_exception(exc: BaseException, phase: str = "train") -> str:
    """A failure class for an exception raised in a worker during `phase` ("init", "config",
    "build", "optimizer", "train")."""
    text = f"{type(exc).__name__}: {exc}"
    try:
        import torch
        oom_types = tuple(t for t in (getattr(torch.cuda, "OutOfMemoryError", None),
                                      getattr(torch, "OutOfMemoryError", None)) if t is not None)
        dist_types = tuple(t for t in (getattr(torch.distributed, "DistBackendError", None),
                                       getattr(torch.distributed, "DistError", None)) if t is not None)
    except Exception:  # noqa: BLE001 - classification must work without torch
        oom_types, dist_types = (), ()
    if (oom_types and isinstance(exc, oom_types)) or "CUDA out of memory" in text or "CUDA error: out of memory" in text:
        return "cuda_oom"
    if isinstance(exc, MemoryError):
        return "host_oom"
    lowered = text.lower()
    if ("watchdog caught collective operation timeout" in lowered
            or (dist_types and isinstance(exc, dist_types) and ("timeout" in lowered or "timed out" in lowered))
            or ("nccl" in lowered and ("timeout" in lowered or "timed out" in lowered))):
        return "nccl_timeout"
    if isinstance(exc, (InvalidLayout, ModelError)):
        return "invalid_config"
    if phase in ("config", "build", "optimizer") and isinstance(
            exc, (ValueError, AssertionError, ImportError, NotImplementedError, TypeError, KeyError)):
        return "invalid_config"
    return "crash"


def classify_exit(exitcode: int | None, log_tail: str = "") -> str:
    """A failure class for a worker that died without reporting an exception."""
    lowered = log_tail.lower()
    if "watchdog caught collective operation timeout" in lowered or ("nccl" in lowered and "timeout" in lowered):
        return "nccl_timeout"
    if "out of memory" in lowered and "cuda" in lowered:
        return "cuda_oom"
    if exitcode == -9:
        return "host_oom"  # SIGKILL we did not send: the kernel's OOM killer
    return "crash"


_CLASS_PRIORITY = ("invalid_config", "cuda_oom", "host_oom", "crash", "nccl_timeout", "hang")


# ================================================================================ data
def load_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file: {"tokens": [int, ...], "loss_mask": [0/1, ...]} (loss_mask optional)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: malformed JSON: {e.msg}") from None
            toks = obj.get("tokens") if isinstance(obj, dict) else None
            if not isinstance(toks, list) or not toks or not all(isinstance(t, int) for t in toks):
                raise ValueError(f"{path}:{i}: 'tokens' must be a non-empty list of integers")
            mask = obj.get("loss_mask", [1] * len(toks))
            if not isinstance(mask, list) or len(mask) != len(toks):
                raise ValueError(f"{path}:{i}: 'loss_mask' must be a list as long as 'tokens'")
            rows.append({"tokens": toks, "loss_mask": [1 if m else 0 for m in mask]})
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def row_arrays(row: dict, seq_len: int, vocab: int) -> tuple[list[int], list[int], list[int]]:
    """(input ids, labels, loss mask) of one row: inputs are tokens[:s], labels tokens[1:s+1];
    short rows are padded (mask 0), ids are taken modulo the vocabulary."""
    toks = [t % vocab for t in row["tokens"][:seq_len + 1]]
    mask = list(row["loss_mask"][:seq_len + 1])
    pad = seq_len + 1 - len(toks)
    toks += [0] * pad
    mask += [0] * pad
    return toks[:seq_len], toks[1:], mask[1:]


# ================================================================================ the worker
def _worker(rank: int, world_size: int, job: dict, report, device_index: int | None = None) -> None:
    """One rank of a trial. Reports to `report` (a queue: .put(dict)) — heartbeats, then one
    result or one error. Shared by the torch.multiprocessing and Ray launchers."""
    os.environ.update(job["env"])
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_RANK": str(rank if device_index is None else device_index)})
    log_path = job.get("log_dir") and os.path.join(job["log_dir"], f"rank{rank}.log")
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    state = {"phase": "init"}

    def send(kind: str, **kw):
        try:
            report.put({"kind": kind, "rank": rank, "t": time.time(), **kw})
        except Exception:  # noqa: BLE001 - the parent is gone; nothing to report to
            pass

    try:
        send("hb", phase="init")
        result = _train(rank, world_size, job, send, state, rank if device_index is None else device_index)
        send("result", **result)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        send("error", phase=state["phase"], failure_class=classify_exception(exc, state["phase"]),
             type=type(exc).__name__, message=" ".join(str(exc).split())[:2000], traceback=tb[-4000:])
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        sys.stdout.flush()
        sys.stderr.flush()


def _selftest_worker(rank: int, world_size: int, job: dict, report, device_index: int | None = None) -> None:
    """A stand-in worker for the CPU tests of the launcher/monitor (job["selftest"]: ok, hang, exit,
    error): no torch, no GPU."""
    mode = job["selftest"]
    report.put({"kind": "hb", "rank": rank, "t": time.time(), "phase": "init"})
    if mode == "hang":
        time.sleep(3600)
    elif mode == "exit":
        os._exit(3)
    elif mode == "error":
        exc = NotImplementedError("selftest: a construction error")
        report.put({"kind": "error", "rank": rank, "t": time.time(), "phase": "build", "type": "NotImplementedError",
                    "failure_class": classify_exception(exc, "build"), "message": str(exc)})
    else:
        report.put({"kind": "result", "rank": rank, "t": time.time(), "step_times_s": [0.1] * 3})


def _train(rank: int, world: int, job: dict, send, state: dict, device_index: int) -> dict:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    layout: Layout = job["layout"]
    workload: Workload = job["workload"]
    model: ModelSpec = job["model"]
    seed = job["seed"]
    torch.cuda.set_device(device_index)
    gpu_name = torch.cuda.get_device_name(device_index)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timedelta(seconds=job["nccl_timeout_s"]),
                            device_id=torch.device("cuda", device_index))

    import megatron.core
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module

    from experiments import torch_native_backend as tnb

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
    send("hb", phase="config")

    state["phase"] = "config"
    backend, why = tnb.resolve_backend(job["backend"])
    # CPU initialisation draws each full weight once and slices it, so layouts start from the same weights.
    config = build_transformer_config(model, layout, workload, backend=backend,
                                      use_cpu_initialization=bool(job.get("cpu_init")))
    tnb.reset_kernel_report()

    state["phase"] = "build"
    vocab = padded_vocab(model.vocab_size, layout.tp)
    chunks, info = [], {}
    vpp = layout.vpp
    for v in range(vpp):
        vp_stage = v if vpp > 1 else None
        spec, info = tnb.block_spec(model, config, backend, vp_stage=vp_stage,
                                    init_seed=seed if job.get("cpu_init") else None)
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
    torch.cuda.synchronize()
    mem_built = torch.cuda.memory_allocated() / 2**30
    send("hb", phase="optimizer")

    state["phase"] = "optimizer"
    optimizer, optimizer_note = _build_optimizer(chunks, layout, job["lr"])
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    torch.cuda.synchronize()
    mem_opt = torch.cuda.memory_allocated() / 2**30

    # Data: this rank's DP shard of each step's global batch, identical on TP/PP/EP peers.
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    mbs = layout.rows_per_microbatch
    rows_per_dp = job["global_batch"] // dp
    n_mb = rows_per_dp // mbs
    seq = workload.seq_len
    given = load_rows(job["rows_file"]) if job.get("rows_file") else None

    def step_batches(step: int) -> list[dict]:
        if given is None:
            g = torch.Generator().manual_seed(seed * 1_000_003 + step)
            toks = torch.randint(0, model.vocab_size, (job["global_batch"], seq + 1), generator=g)
            toks = toks[dp_rank * rows_per_dp:(dp_rank + 1) * rows_per_dp]
            ids, labels = toks[:, :-1], toks[:, 1:]
            mask = torch.ones(rows_per_dp, seq, dtype=torch.float32)
        else:
            start = (step * job["global_batch"] + dp_rank * rows_per_dp)
            arr = [row_arrays(given[(start + i) % len(given)], seq, model.vocab_size) for i in range(rows_per_dp)]
            ids = torch.tensor([a[0] for a in arr])
            labels = torch.tensor([a[1] for a in arr])
            mask = torch.tensor([a[2] for a in arr], dtype=torch.float32)
        pos = torch.arange(seq).unsqueeze(0).expand(mbs, seq)
        out = []
        for i in range(n_mb):
            sl = slice(i * mbs, (i + 1) * mbs)
            out.append({"tokens": ids[sl].cuda(non_blocking=True), "labels": labels[sl].cuda(non_blocking=True),
                        "loss_mask": mask[sl].cuda(non_blocking=True), "position_ids": pos.cuda(non_blocking=True)})
        return out

    fwd_bwd = get_forward_backward_func()
    steps = job["steps"]
    deadline = job["deadline"]
    step_times, losses, grad_norms = [], [], []
    stop_flag = torch.zeros(1, device="cuda")
    state["phase"] = "train"
    send("hb", phase="train", params=n_params)
    for step in range(steps):
        batches = step_batches(step)
        its = [iter(batches) for _ in chunks]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = fwd_bwd(forward_step_func=forward_step, data_iterator=its if len(chunks) > 1 else its[0],
                          model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=n_mb,
                          seq_length=seq, micro_batch_size=mbs, decoder_seq_length=seq, forward_only=False)
        _ok, grad_norm, _zeros = optimizer.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        step_times.append(dt)
        loss = step_loss(reduced)
        losses.append(loss)
        grad_norms.append(None if grad_norm is None else float(grad_norm))
        send("hb", phase="train", step=step, step_time_s=dt, loss=loss)
        # Stop early, all ranks together, when the next step would overrun the trial's deadline.
        stop_flag.fill_(1.0 if time.time() + 1.2 * dt > deadline and step < steps - 1 else 0.0)
        dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
        if stop_flag.item() > 0:
            break

    return {
        "gpu_name": gpu_name,
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
        "num_microbatches": n_mb,
        "params_local": n_params,
        "memory_gib": {"after_build": mem_built, "after_optimizer": mem_opt,
                       "peak_allocated": torch.cuda.max_memory_allocated() / 2**30,
                       "peak_reserved": torch.cuda.max_memory_reserved() / 2**30},
    }


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


def _build_optimizer(chunks, layout: Layout, lr: float):
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
    return get_megatron_optimizer(cfg, chunks, use_gloo_process_groups=False), note


# ================================================================================ launchers
class _MpHandle:
    """One spawned process per GPU (torch.multiprocessing, spawn)."""

    def __init__(self, job: dict, world: int, target=None):
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        self.queue = ctx.Queue()
        self.procs = [ctx.Process(target=target or _worker, args=(r, world, job, self.queue, r), daemon=False)
                      for r in range(world)]
        saved = {k: os.environ.get(k) for k in job["env"]}
        os.environ.update(job["env"])  # set before the children import torch
        try:
            for p in self.procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def get(self, timeout: float):
        try:
            return self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            return None

    def exited(self) -> dict[int, int]:
        return {r: p.exitcode for r, p in enumerate(self.procs) if p.exitcode is not None}

    def stop(self, grace_s: float = 5.0) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        end = time.time() + grace_s
        for p in self.procs:
            p.join(max(0.0, end - time.time()))
            if p.is_alive():
                p.kill()
                p.join(2.0)
        self.queue.close()


class _RayHandle:
    """A Ray placement group with one single-GPU actor per rank (STRICT_PACK, one node)."""

    def __init__(self, job: dict, world: int, target=None, gpus_per_worker: int = 1):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.ray = ray
        bundle = {"CPU": 1, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.pg = placement_group([bundle] * world, strategy="STRICT_PACK")
        ray.get(self.pg.ready(), timeout=120)
        self.queue = Queue()
        actor_cls = ray.remote(num_gpus=gpus_per_worker, num_cpus=1)(_RayWorker)
        self.actors = [actor_cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                                 placement_group_bundle_index=r),
            runtime_env={"env_vars": dict(job["env"])}).remote() for r in range(world)]
        self.refs = [a.run.remote(r, world, job, self.queue, target) for r, a in enumerate(self.actors)]

    def get(self, timeout: float):
        from ray.util.queue import Empty
        try:
            return self.queue.get(timeout=timeout)
        except Empty:
            return None

    def exited(self) -> dict[int, int]:
        done, _ = self.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        out = {}
        for r, ref in enumerate(self.refs):
            if ref in done:
                try:
                    self.ray.get(ref)
                    out[r] = 0
                except Exception:  # noqa: BLE001 - the actor died
                    out[r] = 1
        return out

    def stop(self, grace_s: float = 5.0) -> None:
        from ray.util.placement_group import remove_placement_group
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        try:
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.queue.shutdown()
        except Exception:  # noqa: BLE001
            pass


class _RayWorker:
    def run(self, rank: int, world: int, job: dict, report, target=None):
        # Ray sets CUDA_VISIBLE_DEVICES to the actor's one GPU: it is device 0 here.
        (target or _worker)(rank, world, job, report, 0)
        return rank


def ray_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("ray") is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def run_job(job: dict, world: int, launcher: str = "mp", timeout_s: float = 300.0,
            hang_timeout_s: float = 120.0, target=None, gpus_per_worker: int = 1) -> dict:
    """Start `world` workers, collect their reports, and return
    {"status": "ok", "ranks": {rank: result}} or {"status": "failed", "failure_class", "detail", ...}."""
    start = time.time()
    job = dict(job)
    job["deadline"] = start + timeout_s - 10.0
    log_dir = Path(job["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    handle = (_RayHandle(job, world, target, gpus_per_worker) if launcher == "ray"
              else _MpHandle(job, world, target))
    results: dict[int, dict] = {}
    errors: list[dict] = []
    progress: dict[int, dict] = {}
    last_msg = time.time()
    error_wait_until = None
    dead_since: dict[int, float] = {}
    outcome = None
    try:
        while True:
            msg = handle.get(timeout=0.5)
            now = time.time()
            if msg is not None:
                last_msg = now
                r = msg.get("rank")
                if msg["kind"] == "hb":
                    progress[r] = msg
                elif msg["kind"] == "result":
                    results[r] = msg
                elif msg["kind"] == "error":
                    errors.append(msg)
                    if error_wait_until is None:
                        error_wait_until = now + 8.0  # let the peers report their side
            if len(results) == world:
                break
            reported = set(results) | {e["rank"] for e in errors}
            for r, code in handle.exited().items():
                if r in reported:
                    continue
                dead_since.setdefault(r, now)
                if now - dead_since[r] > 3.0:  # its last reports had time to arrive
                    tail = _tail(log_dir / f"rank{r}.log")
                    errors.append({"kind": "error", "rank": r, "phase": progress.get(r, {}).get("phase", "?"),
                                   "failure_class": classify_exit(code, tail), "type": "exit",
                                   "message": f"rank {r} exited with code {code} without a report; log tail: "
                                              + " ".join(tail[-600:].split())})
                    reported.add(r)
                    if error_wait_until is None:
                        error_wait_until = now + 8.0
            if errors and (now >= error_wait_until or len(reported) == world):
                break
            if now - last_msg > hang_timeout_s:
                outcome = ("hang", f"no report from any rank for {hang_timeout_s:.0f} s; last progress: "
                                   + _progress_text(progress))
                break
            if now - start > timeout_s:
                outcome = ("hang", f"trial exceeded its {timeout_s:.0f} s timeout; last progress: "
                                   + _progress_text(progress))
                break
    finally:
        handle.stop()
    wall = time.time() - start
    if errors:
        first = min(errors, key=lambda e: (_CLASS_PRIORITY.index(e["failure_class"])
                                           if e["failure_class"] in _CLASS_PRIORITY else 99, e.get("t", 0)))
        return {"status": "failed", "failure_class": first["failure_class"], "wall_s": wall,
                "detail": f"rank {first['rank']} ({first.get('phase')}): {first.get('type')}: {first.get('message')}",
                "errors": [{k: e.get(k) for k in ("rank", "phase", "failure_class", "type", "message")} for e in errors],
                "progress": {r: {k: v for k, v in p.items() if k != "kind"} for r, p in progress.items()}}
    if outcome is not None:
        return {"status": "failed", "failure_class": outcome[0], "detail": outcome[1], "wall_s": wall,
                "progress": {r: {k: v for k, v in p.items() if k != "kind"} for r, p in progress.items()}}
    return {"status": "ok", "ranks": results, "wall_s": wall}


def _progress_text(progress: dict) -> str:
    if not progress:
        return "none (no worker started)"
    return "; ".join(f"rank {r}: {p.get('phase')}" + (f" step {p['step']}" if "step" in p else "")
                     for r, p in sorted(progress.items()))


# ================================================================================ the runner
def visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


def detect_gpu() -> GpuSpec | None:
    """The catalog GPU matching the first GPU's name: nvidia-smi, else torch in a short-lived
    subprocess (no CUDA context in this process, which spawns the workers)."""
    name = ""
    exe = shutil.which("nvidia-smi")
    try:
        if exe:
            name = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=30).stdout
        if not name.strip():
            name = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                                  capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return gpu_from_name(name)


def gpu_from_name(name: str) -> GpuSpec | None:
    first = (name.strip().splitlines() or [""])[0].upper()
    for key in ("gb200", "b200", "h200", "h100"):
        if key.upper() in first:
            try:
                return load_gpu(key)
            except HardwareError:
                return None
    return None


def _window(steps: int, window: tuple[int, int] | None) -> tuple[int, int]:
    """Inclusive 0-based step window; the default skips two warm-up steps (2..N-1)."""
    if window is not None and 0 <= window[0] <= window[1] < steps:
        return window
    return (min(2, steps - 1), steps - 1)


@dataclass
class MegatronRunner(TrialRunner):
    """Runs a trial on the local GPUs with megatron-core (see the module docstring).

    layers: None -> the largest count the cost model predicts to fit; replace_gdn: Gated DeltaNet
    layers become full attention (the only way to run Qwen3.5/3.6 without fla)."""

    layers: int | None = None
    replace_gdn: bool = True
    backend: str = "auto"
    launcher: str = "auto"          # auto: mp; "ray" only when asked for and importable
    timeout_s: float = 300.0
    hang_timeout_s: float = 120.0
    nccl_timeout_s: float | None = None   # None: hang_timeout_s - 15 (>= 30), so a stuck collective reports first
    seed: int = DEFAULT_SEED
    lr: float = DEFAULT_LR
    rows_file: str | None = None
    cpu_init: bool = False          # same initial weights whatever the layout (for convergence arms)
    sdpa_backend: str = "auto"      # torch-native attention kernel (torch_native_backend.SDPA_BACKENDS)
    log_dir: str | None = None
    torch_compile: bool = False
    scale_batch_to_budget: bool = True
    name: str = field(default=RUNNER_NAME, init=False)

    # ------------------------------------------------------------------ plan (CPU only)
    def plan(self, spec: TrialSpec) -> dict:
        """Everything decided before spawning: the model run, the global batch, the prediction for
        the model run, the notes. Raises InvalidLayout/ValueError for configurations that cannot run."""
        layout, workload = spec.case.layout, spec.case.workload
        notes: list[str] = []
        if self.layers is None:
            n, how = auto_layers(spec.case.model, spec.case.gpu, workload, layout, self.replace_gdn)
        else:
            n, how = self.layers, "--layers"
        run = trial_model(spec.case.model, n, self.replace_gdn)
        notes += trial_model_notes(spec.case.model, run, how)
        if run.num_hidden_layers % (layout.pp * layout.vpp):
            raise InvalidLayout(f"{run.num_hidden_layers} layers are not divisible by PP x VPP = {layout.pp * layout.vpp}")
        expected = rows_per_microbatch(layout.max_tokens_per_gpu, layout.cp, workload.seq_len)
        if layout.rows_per_microbatch != expected:
            notes.append(f"rows_per_microbatch {layout.rows_per_microbatch} differs from slime's max_tokens_per_gpu "
                         f"rule ({expected}); ran {layout.rows_per_microbatch} rows per micro-batch")
        if layout.dispatcher == "flex":
            import importlib.util
            if importlib.util.find_spec("deep_ep") is None:
                raise InvalidLayout("the flex dispatcher needs DeepEP, which is not importable here "
                                    "(megatron: 'DeepEP is not installed', token_dispatcher.py _DeepepManager)")
        unit = layout.dp * layout.rows_per_microbatch
        gb = workload.global_batch
        if gb % unit:
            raise InvalidLayout(f"global batch {gb} rows is not divisible by DP {layout.dp} x "
                                f"{layout.rows_per_microbatch} rows per micro-batch")
        if layout.vpp > 1:
            unit *= layout.pp  # the interleaved schedule wants the micro-batch count a multiple of PP
            if gb % unit:
                raise InvalidLayout(f"the interleaved pipeline schedule needs the micro-batches per step "
                                    f"({gb // (layout.dp * layout.rows_per_microbatch)}) to be a multiple of PP {layout.pp}")

        def predict_for(rows: int) -> dict:
            try:
                p = _fits(run, spec.case.gpu, replace(workload, global_batch=rows, framework="megatron"), layout)
            except Exception as e:  # noqa: BLE001 - a prediction is a courtesy, not a requirement
                return {"error": f"{type(e).__name__}: {e}"}
            return {"fits": p.fits, "reasons": list(p.reasons), "peak_memory_gib": round(p.peak_memory_gib, 2),
                    "step_time_s": round(p.step_time_s, 4), "tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu, 1),
                    "memory_gib": {k: round(v, 2) for k, v in p.memory.as_dict().items()},
                    "global_batch": rows, "framework": "megatron", "source": p.source}

        prediction = predict_for(gb)
        if self.scale_batch_to_budget and "step_time_s" in prediction:
            slow = BUDGET_SLOWDOWN.get(self.backend, 3.0)
            per_row = prediction["step_time_s"] * slow / gb
            budget = max(1.0, self.timeout_s - STARTUP_ALLOWANCE_S)
            fit_rows = int(budget / max(spec.steps, 1) / per_row) if per_row > 0 else gb
            new = max(unit, (fit_rows // unit) * unit)
            if new < gb:
                notes.append(f"global batch scaled down from {gb} to {new} rows to fit the {self.timeout_s:.0f} s "
                             f"budget ({spec.steps} steps, predicted {prediction['step_time_s']:.2f} s/step x {slow})")
                gb = new
                prediction = predict_for(gb)
        return {"model": run, "layers_how": how, "global_batch": gb, "notes": notes, "prediction": prediction}

    # ------------------------------------------------------------------ run
    def run(self, spec: TrialSpec) -> TrialResult:
        layout = spec.case.layout
        t0 = time.time()
        try:
            plan = self.plan(spec)
        except (InvalidLayout, ValueError, NotImplementedError, ModelError) as e:
            return self._failed("invalid_config", str(e), spec)
        visible = visible_gpus()
        if visible < layout.world_size:
            return self._failed("invalid_config", f"needs {layout.world_size} GPU(s), {visible} visible", spec, plan)
        launcher = self.launcher
        if launcher == "auto":
            launcher = "mp"
        if launcher == "ray" and not ray_available():
            launcher = "mp"
            plan["notes"].append("launcher: ray requested but not importable; torch.multiprocessing spawn used")
        log_dir = self.log_dir or tempfile.mkdtemp(prefix="attune-megatron-")
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "NCCL_NVLS_ENABLE": "0",
               "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")}
        if not self.torch_compile:
            env["TORCHDYNAMO_DISABLE"] = "1"  # megatron's jit_fuser (torch.compile) functions run eagerly
        window = _window(spec.steps, spec.window)
        job = {"model": plan["model"], "layout": layout, "workload": spec.case.workload, "steps": spec.steps,
               "global_batch": plan["global_batch"], "seed": self.seed, "lr": self.lr, "backend": self.backend,
               "rows_file": self.rows_file, "cpu_init": self.cpu_init, "sdpa_backend": self.sdpa_backend,
               "log_dir": log_dir, "env": env,
               "nccl_timeout_s": self.nccl_timeout_s or max(30.0, self.hang_timeout_s - 15.0)}
        out = run_job(job, layout.world_size, launcher, self.timeout_s, self.hang_timeout_s)
        wall = time.time() - t0
        if out["status"] != "ok":
            extras = self._extras(spec, plan, launcher, log_dir, window)
            extras["errors"] = out.get("errors", [])
            extras["progress"] = out.get("progress", {})
            return self._result(status="failed", source=self._source(None, spec, launcher), failure_class=out["failure_class"],
                                detail_text=out["detail"], extras=extras,
                                gpu_hours=layout.world_size * wall / 3600)
        return self._summarize(spec, plan, out["ranks"], launcher, log_dir, window, wall)

    # ------------------------------------------------------------------ results
    def _source(self, ranks: dict | None, spec: TrialSpec, launcher: str) -> str:
        if not ranks:
            return f"megatron-core runner ({launcher}) on {spec.case.gpu.display_name} x{spec.case.layout.world_size}, backend {self.backend}"
        r0 = ranks[min(ranks)]
        kern = r0.get("kernels", {})
        kernels = ", ".join(f"{k} {v}" for k, v in kern.items() if k in ("experts", "attention"))
        return (f"megatron-core {r0.get('megatron_core')} runner on {r0.get('gpu_name')} x{spec.case.layout.world_size}, "
                f"backend {r0.get('backend')}, kernels {kernels}")

    def _extras(self, spec: TrialSpec, plan: dict | None, launcher: str, log_dir: str | None, window) -> dict:
        extras = {"runner": RUNNER_NAME, "launcher": launcher, "layout": spec.case.layout.long_label,
                  "steps_requested": spec.steps, "window": list(window), "log_dir": log_dir}
        if plan:
            m = plan["model"]
            extras.update({"model_run": {"name": m.name, "layers": m.num_hidden_layers,
                                         "layer_types": sorted(set(m.layer_types)), "how": plan["layers_how"]},
                           "global_batch_rows": plan["global_batch"], "seq_len": spec.case.workload.seq_len,
                           "notes": plan["notes"], "prediction_for_model_run": plan["prediction"]})
        return extras

    def _failed(self, cls: str, text: str, spec: TrialSpec, plan: dict | None = None) -> TrialResult:
        return self._result(status="failed", source=self._source(None, spec, self.launcher), failure_class=cls,
                            detail_text=text, extras=self._extras(spec, plan, self.launcher, None,
                                                                  _window(spec.steps, spec.window)))

    def _result(self, *, status: str, source: str, detail_text: str = "", extras: dict | None = None, **kw) -> TrialResult:
        details = json.loads(json.dumps(extras or {}, default=str))
        return TrialResult(status=status, kind="measured", source=source, detail=detail_text, runner=RUNNER_NAME,
                           details=details, **kw)

    def _summarize(self, spec: TrialSpec, plan: dict, ranks: dict, launcher: str, log_dir: str, window, wall: float):
        layout, workload = spec.case.layout, spec.case.workload
        n = min(len(r["step_times_s"]) for r in ranks.values())
        step_times = [max(r["step_times_s"][i] for r in ranks.values()) for i in range(n)]
        losses = []
        for i in range(n):
            vals = [r["losses"][i] for r in ranks.values() if r["losses"][i] is not None]
            losses.append(sum(vals) / len(vals) if vals else float("nan"))
        grad_norms = [next((r["grad_norms"][i] for r in ranks.values() if r["grad_norms"][i] is not None), None)
                      for i in range(n)]
        w0, w1 = window
        notes = list(plan["notes"])
        if n < spec.steps:
            notes.append(f"stopped after {n} of {spec.steps} steps (time budget)")
        w1 = min(w1, n - 1)
        w0 = min(w0, w1)
        win = step_times[w0:w1 + 1]
        tokens_per_step = plan["global_batch"] * workload.seq_len
        mean = sum(win) / len(win)
        tps = tokens_per_step * len(win) / sum(win) / layout.world_size
        cv = (statistics.pstdev(win) / mean * 100) if len(win) > 1 else None
        mem = {r: ranks[r]["memory_gib"] for r in sorted(ranks)}
        peak = max(m["peak_allocated"] for m in mem.values())
        run_model = plan["model"]
        mfu = 6 * run_model.params.active_non_embedding * tps / (spec.case.gpu.peak_tflops(workload.precision) * 1e12)
        r0 = ranks[min(ranks)]
        extras = self._extras(spec, plan, launcher, log_dir, (w0, w1))
        extras.update({
            "notes": notes, "backend": r0["backend"], "backend_reason": r0["backend_reason"],
            "kernels": r0["kernels"], "kernels_ran": r0["kernels_ran"], "optimizer": r0["optimizer"],
            "grad_norms": grad_norms, "num_microbatches": r0["num_microbatches"],
            "memory_gib_per_rank": {str(r): {k: round(v, 2) for k, v in m.items()} for r, m in mem.items()},
            "max_memory_allocated_gib_per_rank": [round(mem[r]["peak_allocated"], 2) for r in sorted(mem)],
            "params_per_rank": [ranks[r]["params_local"] for r in sorted(ranks)],
            "torch": r0["torch"], "megatron_core": r0["megatron_core"], "gpu_name": r0["gpu_name"],
            "trial_wall_s": round(wall, 1), "steps_run": n,
        })
        usd = spec.case.gpu.usd_per_gpu_hour / (tps * 3600) * 1e6 if tps > 0 else None
        return self._result(
            status="ok", source=self._source(ranks, spec, launcher), extras=extras,
            tokens_per_s_per_gpu=tps, step_time_s=mean, peak_memory_gib=peak, mfu=mfu,
            usd_per_million_tokens=usd, step_times_s=tuple(step_times),
            losses=tuple(losses), step_time_cv_percent=cv, gpu_hours=layout.world_size * wall / 3600)


def result_to_dict(result: TrialResult, **extra) -> dict:
    return {**extra, **result.to_dict()}


# ================================================================================ suites
SUITE_TRIAL_KEYS = {"name", "gpus", "layout", "model", "layers", "replace_gdn", "seq_len", "global_batch", "steps",
                    "window", "timeout_s", "hang_timeout_s", "backend", "routing", "expect", "seed", "lr", "rows_file",
                    "cpu_init", "sdpa_backend"}


@dataclass(frozen=True)
class SuiteTrial:
    name: str
    model: str
    gpus: int
    layout: Layout
    layers: int | None
    replace_gdn: bool
    workload: Workload
    steps: int
    window: tuple[int, int] | None
    timeout_s: float
    hang_timeout_s: float
    backend: str
    expect: str = ""
    seed: int | None = None          # model initialisation and synthetic data
    lr: float | None = None
    rows_file: str | None = None     # token rows (JSONL) instead of synthetic data
    cpu_init: bool = False
    sdpa_backend: str = "auto"


def parse_suite(source) -> tuple[list[SuiteTrial], dict]:
    """A suite file (path or parsed dict): {"defaults": {...}, "trials": [{...}, ...]}.

    Each trial: name, gpus, layout (Layout fields; world_size = gpus), and optionally any default
    overridden (model, layers ("auto" or int), replace_gdn, seq_len, global_batch, steps, window
    [a, b], timeout_s, hang_timeout_s, backend, routing, expect)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    else:
        data = source
    if not isinstance(data, dict) or not isinstance(data.get("trials"), list) or not data["trials"]:
        raise ValueError("a suite is an object with a non-empty 'trials' list")
    defaults = data.get("defaults") or {}
    unknown = sorted(set(defaults) - SUITE_TRIAL_KEYS - {"budget_s"})
    if unknown:
        raise ValueError(f"unknown suite defaults {unknown}; known: {sorted(SUITE_TRIAL_KEYS)}")
    trials, names = [], set()
    for i, raw in enumerate(data["trials"]):
        if not isinstance(raw, dict):
            raise ValueError(f"trial {i}: must be an object")
        unknown = sorted(set(raw) - SUITE_TRIAL_KEYS)
        if unknown:
            raise ValueError(f"trial {i}: unknown keys {unknown}; known: {sorted(SUITE_TRIAL_KEYS)}")
        t = {**{k: v for k, v in defaults.items() if k != "budget_s"}, **raw}
        name = str(t.get("name") or f"trial{i}")
        if name in names:
            raise ValueError(f"trial {i}: duplicate name {name!r}")
        names.add(name)
        for key in ("model", "gpus", "layout"):
            if key not in t:
                raise ValueError(f"trial {name}: missing {key!r}")
        gpus = t["gpus"]
        if not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"trial {name}: gpus must be a positive integer, got {gpus!r}")
        try:
            layout = layout_from_stored({**t["layout"], "world_size": gpus})
        except InvalidLayout as e:
            raise ValueError(f"trial {name}: {e}") from None
        layers = t.get("layers", "auto")
        if layers == "auto":
            layers = None
        elif not isinstance(layers, int) or layers < 1:
            raise ValueError(f"trial {name}: layers must be 'auto' or a positive integer, got {layers!r}")
        workload = Workload(seq_len=int(t.get("seq_len", 4096)), global_batch=int(t.get("global_batch", 16)),
                            routing=t.get("routing", "natural"), framework="megatron")
        steps = int(t.get("steps", 8))
        window = tuple(t["window"]) if t.get("window") is not None else None
        backend = t.get("backend", "auto")
        if backend not in ("auto", "te", "torch-native", "local"):
            raise ValueError(f"trial {name}: unknown backend {backend!r}")
        sdpa = str(t.get("sdpa_backend", "auto"))
        from experiments.torch_native_backend import SDPA_BACKENDS
        if sdpa not in SDPA_BACKENDS:
            raise ValueError(f"trial {name}: sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {sdpa!r}")
        trials.append(SuiteTrial(name=name, model=str(t["model"]), gpus=gpus, layout=layout, layers=layers,
                                 replace_gdn=bool(t.get("replace_gdn", True)), workload=workload, steps=steps,
                                 window=window, timeout_s=float(t.get("timeout_s", 150)),
                                 hang_timeout_s=float(t.get("hang_timeout_s", 90)), backend=backend,
                                 expect=str(t.get("expect", "")),
                                 seed=int(t["seed"]) if t.get("seed") is not None else None,
                                 lr=float(t["lr"]) if t.get("lr") is not None else None,
                                 rows_file=t.get("rows_file"), cpu_init=bool(t.get("cpu_init", False)),
                                 sdpa_backend=sdpa))
    return trials, {"budget_s": defaults.get("budget_s")}


def run_suite(path, out_path: str | None, *, gpu: GpuSpec, launcher: str = "auto", budget_s: float | None = None,
              only: list[str] | None = None, log_root: str | None = None, rows_file: str | None = None,
              emit=print) -> list[dict]:
    """Run a suite's trials one after another (fresh worker processes each); one JSON line per
    trial to `emit` and appended to `out_path` as each finishes. A failed trial does not stop the suite."""
    trials, meta = parse_suite(path)
    budget_s = budget_s if budget_s is not None else meta.get("budget_s")
    if only:
        trials = [t for t in trials if t.name in only]
    log_root = log_root or tempfile.mkdtemp(prefix="attune-megatron-suite-")
    start = time.time()
    lines = []
    for t in trials:
        elapsed = time.time() - start
        timeout = t.timeout_s
        if budget_s is not None:
            left = budget_s - elapsed
            if left < 40:
                line = {"trial": t.name, "status": "skipped", "reason": f"suite budget {budget_s:.0f} s exhausted "
                                                                        f"({elapsed:.0f} s elapsed)"}
                _emit(line, out_path, emit)
                lines.append(line)
                continue
            timeout = min(timeout, left)
        extra = {k: v for k, v in (("seed", t.seed), ("lr", t.lr)) if v is not None}
        runner = MegatronRunner(layers=t.layers, replace_gdn=t.replace_gdn, backend=t.backend, launcher=launcher,
                                timeout_s=timeout, hang_timeout_s=min(t.hang_timeout_s, timeout),
                                rows_file=t.rows_file or rows_file, cpu_init=t.cpu_init, sdpa_backend=t.sdpa_backend,
                                log_dir=os.path.join(log_root, t.name), **extra)
        spec = TrialSpec(Case(load_model(t.model), gpu, t.workload, t.layout), steps=t.steps,
                         window=t.window or (min(2, t.steps - 1), t.steps - 1))
        t1 = time.time()
        result = runner.run(spec)
        line = result_to_dict(result, trial=t.name, gpus=t.gpus, expect=t.expect,
                              elapsed_s=round(time.time() - t1, 1))
        _emit(line, out_path, emit)
        lines.append(line)
    return lines


def _emit(line: dict, out_path: str | None, emit) -> None:
    text = json.dumps(line, separators=(",", ":"), default=str)
    if out_path:
        with open(out_path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    emit(text)
    sys.stdout.flush()


# ================================================================================ CLI
def _parse_kv(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ValueError(f"--layout expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        k = k.strip().replace("-", "_")
        v = v.strip()
        if k in ("recompute_modules", "recompute_granularity", "recompute_method", "dispatcher", "exp_avg_dtype"):
            out[k] = None if v.lower() in ("none", "") and k != "recompute_modules" else v
        elif k in ("optimizer_offload_fraction",):
            out[k] = float(v)
        elif k in ("overlap_d2h_h2d",):
            out[k] = v.lower() in ("1", "true", "yes")
        else:
            try:
                out[k] = int(v)
            except ValueError:
                raise ValueError(f"--layout {k}={v}: expected an integer") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.megatron_runner",
                                description="Measure a layout with megatron-core on the local GPUs.")
    p.add_argument("--suite", help="run the trials of a suite JSON file, one JSON line each")
    p.add_argument("--out", help="append each suite result line to this JSONL file")
    p.add_argument("--budget-s", type=float, help="suite: stop starting trials after this many seconds")
    p.add_argument("--only", help="suite: comma-separated trial names to run")
    p.add_argument("--model", help="catalog model name or config.json path")
    p.add_argument("--gpus", type=int, help="GPUs (world size)")
    p.add_argument("--layers", default="auto", help="layers to build ('auto': largest predicted to fit)")
    p.add_argument("--keep-gdn", action="store_true", help="do not replace Gated DeltaNet layers (needs fla)")
    p.add_argument("--layout", nargs="*", default=[], metavar="KEY=VALUE", help="Layout fields, e.g. tp=2 ep=1")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--window", help="inclusive 0-based step window A:B (default 2:N-1)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--routing", default="natural", choices=("natural", "balanced"))
    p.add_argument("--backend", default="auto", choices=("auto", "te", "torch-native", "local"))
    p.add_argument("--launcher", default="auto", choices=("auto", "mp", "ray"))
    p.add_argument("--rows", help="JSONL of {'tokens': [...], 'loss_mask': [...]} rows (default: random tokens)")
    p.add_argument("--gpu", default="auto", help="catalog GPU for predictions (default: from nvidia-smi)")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--hang-timeout-s", type=float, default=120.0)
    p.add_argument("--log-dir", help="worker logs (default: a temporary directory)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--torch-compile", action="store_true", help="let megatron's jit_fuser functions compile")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def _fail(msg: str) -> int:
    print(f"megatron_runner: error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.suite and (not args.model or not args.gpus):
        return _fail("give --suite FILE, or --model and --gpus")
    try:
        if args.suite:
            parse_suite(args.suite)  # validate before looking for GPUs
        else:
            load_model(args.model)
            layout = layout_from_stored({**parse_pairs(args.layout), "world_size": args.gpus})
    except (ValueError, ModelError, InvalidLayout, OSError) as e:
        return _fail(str(e))
    n = visible_gpus()
    if n == 0:
        return _fail("no CUDA GPU visible (torch.cuda.device_count() == 0); the megatron runner measures real "
                     "training steps and needs the GPUs it runs on")
    if args.gpu == "auto":
        gpu = detect_gpu()
        if gpu is None:
            return _fail("cannot map this GPU to the catalog (nvidia-smi); pass --gpu h200|h100|b200|gb200")
    else:
        try:
            gpu = load_gpu(args.gpu)
        except HardwareError as e:
            return _fail(str(e))
    if args.suite:
        only = [s for s in (args.only or "").split(",") if s]
        run_suite(args.suite, args.out, gpu=gpu, launcher=args.launcher, budget_s=args.budget_s, only=only or None,
                  log_root=args.log_dir, rows_file=args.rows)
        return 0
    if args.gpus > n:
        return _fail(f"--gpus {args.gpus} but {n} GPU(s) visible")
    window = None
    if args.window:
        a, _, b = args.window.partition(":")
        window = (int(a), int(b))
    layers = None if args.layers == "auto" else int(args.layers)
    runner = MegatronRunner(layers=layers, replace_gdn=not args.keep_gdn, backend=args.backend, launcher=args.launcher,
                            timeout_s=args.timeout_s, hang_timeout_s=args.hang_timeout_s, seed=args.seed,
                            rows_file=args.rows, log_dir=args.log_dir, torch_compile=args.torch_compile)
    workload = Workload(seq_len=args.seq_len, global_batch=args.global_batch, routing=args.routing, framework="megatron")
    spec = TrialSpec(Case(load_model(args.model), gpu, workload, layout), steps=args.steps,
                     window=window or (min(2, args.steps - 1), args.steps - 1))
    result = runner.run(spec)
    if args.json:
        print(json.dumps(result_to_dict(result), separators=(",", ":"), default=str))
    else:
        print(result.summary())
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
