"""Hardware profiler behind `tune profile`: measure a GPU machine's real rates, write a profile YAML.

The cost model executes FLOPs and bytes at rates measured here, on the GPU type it predicts for.
Run on a machine with NVIDIA GPUs (only torch, numpy, pyyaml and the standard library needed):

    PYTHONPATH=<repo root> python -m experiments.hardware_profile [--model M] [--out FILE] [--quick]

What is measured (GPU 0 in this process unless said otherwise; random normal data; timing with CUDA
events after warm-up; each figure is the median of `repeats` samples, a sample timing `inner`
back-to-back calls, `inner` chosen so a sample lasts >= ~1 ms; the L2 cache is not flushed):

- gemm_bf16: torch.mm(A[m,k], W[n,k].T) (nn.Linear's forward layout), bf16 in and out, on the full
  grid m x n x k (`GEMM_M` x `GEMM_NK` x `GEMM_NK`, 343 points; the cost model interpolates
  multilinearly in log2 space on exactly this grid) plus the model's own forward GEMM shapes.
  TFLOP/s = 2 m n k / time.
- gemm_fp8: torch._scaled_mm, float8_e4m3fn operands, per-tensor fp32 scales, bf16 out,
  use_fast_accum=False, on a few large shapes (compute capability >= 8.9 only).
- grouped_gemm_bf16: torch._grouped_mm(X[E*rows,k], W[E,n,k].transpose(-2,-1), offs), equal rows
  per expert. fwd FLOPs = 2 E rows k n; fwd_bwd_tflops = 3 x fwd FLOPs / time(forward + autograd
  backward producing both input and weight gradients).
- attention_bf16: F.scaled_dot_product_attention(is_causal=True), batch 1, q/k/v [1,heads,seq,head_dim]
  (kv heads = heads: GQA changes the bytes, not the FLOPs), default SDPA backend.
  Causal fwd FLOPs = 2 * 2 * heads * seq^2 * head_dim / 2 (QK^T and PV, half the square).
  fwd_bwd_tflops = 3 x fwd FLOPs / time(fwd + bwd): the cost model's "training = 3 x forward"
  convention. Flash-style kernels execute ~3.5 x forward (the backward recomputes QK^T), so this is
  a model-FLOP rate, ~14% below the executed-FLOP rate.
- linear_attention: fla's chunk_gated_delta_rule fwd+bwd (Gated DeltaNet) at seq 8192 when fla is
  importable (in a subprocess with a time limit: Triton autotuning can be slow, and fla refuses the
  backward on Hopper with Triton < 3.7.1); FLOPs per token fwd = 8 * heads * key_dim * value_dim
  (the cost model's recurrence term without the conv), fwd_bwd = 3 x fwd; efficiency = fwd_bwd
  TFLOP/s / the catalog's dense bf16 peak. Otherwise a documented estimate (efficiency 0.15).
- memory: pinned host->device and device->host copies of 2 GiB and 256 MiB (GB/s = 1e9 B/s), and a
  device-to-device copy of 2 GiB counting read + write (TB/s = 1e12 B/s).
- cpu_adam: torch.optim.Adam(foreach=True) step on 64 Mi fp32 CPU parameters (16 tensors), params/s.
- collectives: one process per GPU (NCCL, NVLink multicast forced off), all_reduce, all_gather
  (all_gather_into_tensor), reduce_scatter (reduce_scatter_tensor), all_to_all (all_to_all_single)
  and p2p (send/recv, rank 2i -> 2i+1, all pairs at once), bf16 buffers of 64 KiB .. 1 GiB in powers
  of 4 (`bytes` = the full buffer: all_gather's output, reduce_scatter's input). Every call is timed
  with CUDA events; time = the max over ranks of each rank's median. NCCL-tests bus bandwidth:
  algbw = bytes / time, busbw = algbw x factor (`bus_factor`).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import yaml

from cost_model.model_spec import (DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MLA, SLIDING_ATTENTION,
                                   ModelSpec, load_model)
from cost_model.errors import AttuneError

SCHEMA_VERSION = 1
NO_GPU_MESSAGE = "no CUDA GPU found: tune profile must run on a machine with NVIDIA GPUs"

GEMM_M = (512, 1024, 2048, 4096, 8192, 16384, 32768)
GEMM_NK = (256, 512, 1024, 2048, 4096, 8192, 16384)
MODEL_TOKENS = (4096, 8192, 16384)          # micro-batch token counts for the model's own GEMMs
FP8_M = (4096, 8192, 16384)
FP8_NK = (4096, 8192, 16384)                # square n = k
GROUPED_EXPERTS = (8, 32, 128, 256)
GROUPED_ROWS = (16, 64, 256, 1024, 4096)
GROUPED_MAX_ROWS = 262_144
DEFAULT_HIDDEN, DEFAULT_MOE_FFN = 2048, 512
ATTENTION_SEQS = (2048, 4096, 8192, 16384, 32768)
ATTENTION_DEFAULT_HEADS = ((32, 128), (16, 256))
LINEAR_ATTENTION_SEQ = 8192
LINEAR_ATTENTION_DEFAULT = dict(heads=32, key_head_dim=128, value_head_dim=128)  # Qwen3.5/3.6 GDN
LINEAR_ATTENTION_ESTIMATE = 0.15
LINEAR_ATTENTION_TIMEOUT_S = 150
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
COLLECTIVE_BYTES = tuple(64 * 1024 * 4 ** i for i in range(8))   # 64 KiB .. 1 GiB
COLLECTIVE_WARMUP = 5
COLLECTIVE_TIMEOUT_S = 240
MEMORY_BYTES = (2 * 2 ** 30, 256 * 2 ** 20)
ADAM_NUMEL = 64 * 2 ** 20
ADAM_TENSORS = 16

# NVLink multicast (NVLS) must be off on the profiling machines: force it, whatever is inherited.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_LINEAR_ESTIMATE_NOTE = "fla not importable on the profiling machine; documented estimate"


class NoGpuError(AttuneError, RuntimeError):
    """No CUDA GPU (or no torch) on this machine."""


# ---------------------------------------------------------------------- shapes (pure)
def _model_gemms(model: ModelSpec) -> list[tuple[str, int, int]]:
    """(label, n, k) of the model's forward GEMMs (x[tokens,k] @ W[k,n]), before any TP split."""
    h = model.hidden_size
    kinds = set(model.layer_types)
    out: list[tuple[str, int, int]] = []
    if kinds & {FULL_ATTENTION, SLIDING_ATTENTION}:
        q = model.num_attention_heads * model.head_dim
        gate = q if model.attn_output_gate else 0
        out += [("attn_qkv", q + gate + 2 * model.num_key_value_heads * model.head_dim, h),
                ("attn_out", h, q)]
    if MLA in kinds:
        heads, qk = model.num_attention_heads, model.qk_nope_head_dim + model.qk_rope_head_dim
        out += [("mla_q", heads * qk, model.q_lora_rank or h),
                ("mla_kv_a", model.kv_lora_rank + model.qk_rope_head_dim, h),
                ("mla_kv_b", heads * (model.qk_nope_head_dim + model.v_head_dim), model.kv_lora_rank),
                ("attn_out", h, heads * model.v_head_dim)]
        if model.q_lora_rank:
            out.append(("mla_q_a", model.q_lora_rank, h))
    if LINEAR_ATTENTION in kinds:
        qk = model.linear_num_key_heads * model.linear_key_head_dim
        v = model.linear_num_value_heads * model.linear_value_head_dim
        out += [("gdn_in", 2 * qk + 2 * v, h), ("gdn_out", h, v)]
    if DENSE in model.mlp_types and model.intermediate_size:
        f = model.intermediate_size
        out += [("mlp_up", 2 * f, h), ("mlp_down", h, f)]
    if model.is_moe:
        if model.shared_expert_intermediate_size:
            fs = model.shared_expert_intermediate_size
            out += [("shared_up", 2 * fs, h), ("shared_down", h, fs)]
        out.append(("router", model.num_experts, h))
    out.append(("lm_head_slice", model.vocab_size // 8, h))
    return [(label, n, k) for label, n, k in out if n > 0 and k > 0]


def _attention_heads(model: ModelSpec | None) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    if model is not None:
        if MLA in model.layer_types:
            pairs.append((model.num_attention_heads, model.qk_nope_head_dim + model.qk_rope_head_dim))
        elif set(model.layer_types) & {FULL_ATTENTION, SLIDING_ATTENTION}:
            pairs.append((model.num_attention_heads, model.head_dim))
    return pairs + [p for p in ATTENTION_DEFAULT_HEADS if p not in pairs]


def _linear_attention_shape(model: ModelSpec | None) -> dict:
    if model is not None and LINEAR_ATTENTION in model.layer_types:
        return dict(heads=model.linear_num_value_heads, key_head_dim=model.linear_key_head_dim,
                    value_head_dim=model.linear_value_head_dim, seq=LINEAR_ATTENTION_SEQ)
    return dict(LINEAR_ATTENTION_DEFAULT, seq=LINEAR_ATTENTION_SEQ)


def profile_shapes(model: ModelSpec | None) -> dict:
    """The measurement grid. Pure: no torch, no GPU.

    gemm: the full m x n x k grid (dicts m, n, k), then the model's own shapes at MODEL_TOKENS
    (dicts with a `label` too; points already on the grid are not repeated).
    """
    grid = [dict(m=m, n=n, k=k) for m, n, k in itertools.product(GEMM_M, GEMM_NK, GEMM_NK)]
    seen = {(p["m"], p["n"], p["k"]) for p in grid}
    extras = []
    if model is not None:
        for tokens in MODEL_TOKENS:
            for label, n, k in _model_gemms(model):
                if (tokens, n, k) not in seen:
                    seen.add((tokens, n, k))
                    extras.append(dict(m=tokens, n=n, k=k, label=label))
    if model is not None and model.is_moe:
        hidden, ffn = model.hidden_size, model.moe_intermediate_size
    else:
        hidden, ffn = DEFAULT_HIDDEN, DEFAULT_MOE_FFN
    grouped = [dict(experts=e, rows_per_expert=r, k=k, n=n)
               for k, n in ((hidden, 2 * ffn), (ffn, hidden))
               for e in GROUPED_EXPERTS for r in GROUPED_ROWS if e * r <= GROUPED_MAX_ROWS]
    attention = [dict(seq=s, heads=h, head_dim=d) for h, d in _attention_heads(model) for s in ATTENTION_SEQS]
    return dict(
        gemm=grid + extras,
        gemm_fp8=[dict(m=m, n=nk, k=nk) for m in FP8_M for nk in FP8_NK],
        grouped_gemm=grouped,
        attention=attention,
        linear_attention=_linear_attention_shape(model),
        collectives=dict(ops=list(COLLECTIVE_OPS), bytes=list(COLLECTIVE_BYTES)),
    )


def quick_shapes(shapes: dict) -> dict:
    """A small subset of `profile_shapes` for a smoke run (`--quick`)."""
    keep = dict(shapes)
    keep["gemm"] = [p for p in shapes["gemm"]
                    if (p["m"] == 8192 and "label" in p)
                    or (p["m"] in (1024, 8192) and p["n"] in (1024, 8192) and p["k"] in (1024, 8192))]
    keep["gemm_fp8"] = shapes["gemm_fp8"][:2]
    keep["grouped_gemm"] = [p for p in shapes["grouped_gemm"]
                            if p["experts"] in (8, 128) and p["rows_per_expert"] in (64, 1024)]
    keep["attention"] = [p for p in shapes["attention"] if p["seq"] in (2048, 8192)]
    keep["collectives"] = dict(ops=shapes["collectives"]["ops"], bytes=[2 ** 20, 256 * 2 ** 20])
    return keep


def bus_factor(op: str, n: int) -> float:
    """NCCL-tests busbw / algbw for `op` over n ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def gpu_type_from_name(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; unknown GPUs -> the sanitized device name."""
    low = name.lower()
    for key in ("gb200", "b200", "h200", "h100"):
        if re.search(rf"(?<![a-z0-9]){key}(?![0-9])", low):
            return key
    return re.sub(r"^nvidia-", "", re.sub(r"[^a-z0-9]+", "-", low).strip("-")) or "unknown"


def _sig(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


# ---------------------------------------------------------------------- timing
def _torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
    return torch


def _sync(device) -> None:
    if device.type == "cuda":
        _torch().cuda.synchronize(device)


def _mark(device):
    """A point in time on `device`'s current stream (a recorded CUDA event; perf_counter on CPU)."""
    if device.type == "cuda":
        event = _torch().cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _seconds(start, end) -> float:
    """Seconds between two marks (CUDA marks need a synchronize first)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def _median_time(fn, device, repeats: int, warmup: int = 3, target_s: float = 1e-3,
                 max_inner: int = 32) -> float:
    """Median seconds per call of fn: warm-up, then `repeats` samples of `inner` back-to-back calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = _mark(device)
    fn()
    end = _mark(device)
    _sync(device)
    inner = max(1, min(max_inner, math.ceil(target_s / max(_seconds(start, end), 1e-7))))
    return statistics.median(_batch_times(fn, device, 0, inner, repeats))


def _batch_times(fn, device, warmup: int, iters: int, samples: int) -> list[float]:
    """Seconds per call, one figure per sample of `iters` back-to-back calls (as nccl-tests times them).

    Timing calls in batches keeps the host's launch gaps out of the figure; every rank makes the
    same fixed number of calls, as collectives require.
    """
    for _ in range(warmup):
        fn()
    marks = []
    for _ in range(samples):
        start = _mark(device)
        for _ in range(iters):
            fn()
        marks.append((start, _mark(device)))
    _sync(device)
    return [_seconds(s, e) / iters for s, e in marks]


def _synced_times(fn, device, samples: int) -> list[float]:
    """Wall-clock seconds of single calls, each between two device synchronisations.

    Not what training sees (it launches back to back) but what a simple probe measures; kept
    beside the batched figure so the two can be compared.
    """
    out = []
    for _ in range(samples):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def _collapse_notes(notes: list[str]) -> list[str]:
    """Keep the first of notes that repeat one section's error (same first word, same error text)."""
    out: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    extra: dict[int, int] = {}
    for note in notes:
        head, _, err = note.partition(": ")
        key = (head.split(" ")[0], err)
        if err and key in seen:
            extra[seen[key]] = extra.get(seen[key], 0) + 1
            continue
        seen[key] = len(out)
        out.append(note)
    return [n + (f" (and {extra[i]} more points with the same error)" if i in extra else "")
            for i, n in enumerate(out)]


def _fail(notes: list, what: str, err: BaseException) -> None:
    """Record a failure as one note line and release cached GPU memory."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # a spawned rank's failure carries its traceback: its last line names the error
    text = (lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]) if lines else ""
    notes.append(f"{what}: {type(err).__name__}: {text[:300]}")
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------- compute measurements
def measure_gemm(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """bf16 torch.mm(A[m,k], W[n,k].T) TFLOP/s at each point (views of one random buffer each)."""
    torch = _torch()
    gen = dict(device=device, dtype=torch.bfloat16)
    a_buf = torch.randn(max(p["m"] * p["k"] for p in points), **gen)
    w_buf = torch.randn(max(p["n"] * p["k"] for p in points), **gen)
    c_buf = torch.empty(max(p["m"] * p["n"] for p in points), **gen)
    rows = []
    for p in points:
        m, n, k = p["m"], p["n"], p["k"]
        a, w, c = a_buf[:m * k].view(m, k), w_buf[:n * k].view(n, k), c_buf[:m * n].view(m, n)
        try:
            t = _median_time(lambda: torch.mm(a, w.t(), out=c), device, repeats)
        except Exception as e:  # noqa: BLE001 - one failed shape must not lose the profile
            _fail(notes, f"gemm_bf16 {m}x{n}x{k}", e)
            continue
        row = dict(m=m, n=n, k=k, tflops=_sig(2 * m * n * k / t / 1e12))
        if "label" in p:  # a model shape off the grid: say so, loaders keep the grid apart
            row["label"] = p["label"]
        rows.append(row)
    return rows


def measure_gemm_fp8(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """torch._scaled_mm TFLOP/s, e4m3 operands with per-tensor scales, bf16 out."""
    torch = _torch()
    rows = []
    for p in points:
        m, n, k = p["m"], p["n"], p["k"]
        try:
            a = w = fn = None
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
            one = torch.tensor(1.0, device=device)
            fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            t = _median_time(fn, device, repeats)
        except Exception as e:  # noqa: BLE001
            _fail(notes, f"gemm_fp8 {m}x{n}x{k}", e)
            continue
        finally:
            a = w = fn = None
        rows.append(dict(m=m, n=n, k=k, tflops=_sig(2 * m * n * k / t / 1e12)))
    return rows


def measure_grouped_gemm(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """torch._grouped_mm forward and forward+backward TFLOP/s (fwd_bwd = 3 x fwd FLOPs)."""
    torch = _torch()
    rows = []
    for p in points:
        e, r, k, n = p["experts"], p["rows_per_expert"], p["k"], p["n"]
        try:
            x = torch.randn(e * r, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(e, n, k, device=device, dtype=torch.bfloat16)
            offs = torch.arange(1, e + 1, device=device, dtype=torch.int32) * r
            t_fwd = _median_time(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), device, repeats)
        except Exception as err:  # noqa: BLE001
            _fail(notes, f"grouped_gemm_bf16 E={e} rows={r} k={k} n={n}", err)
            x = w = None
            continue
        try:
            x.requires_grad_(True)
            w.requires_grad_(True)
            grad = torch.randn(e * r, n, device=device, dtype=torch.bfloat16)

            def fwd_bwd():
                out = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
                return torch.autograd.grad(out, (x, w), grad)

            t_fb = _median_time(fwd_bwd, device, repeats)
        except Exception as err:  # noqa: BLE001 - no row (its fields are all required), the fwd figure in the note
            x = w = grad = None
            _fail(notes, f"grouped_gemm_bf16 fwd_bwd E={e} rows={r} k={k} n={n} "
                         f"(fwd {_sig(2 * e * r * k * n / t_fwd / 1e12)} TFLOP/s)", err)
            continue
        x = w = grad = None
        flops = 2 * e * r * k * n
        rows.append(dict(experts=e, rows_per_expert=r, k=k, n=n, fwd_tflops=_sig(flops / t_fwd / 1e12),
                         fwd_bwd_tflops=_sig(3 * flops / t_fb / 1e12)))
    return rows


def measure_attention(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """Causal SDPA fwd and fwd+bwd TFLOP/s (fwd = 2*2*heads*seq^2*head_dim/2; fwd_bwd = 3 x fwd)."""
    torch = _torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    for p in points:
        s, h, d = p["seq"], p["heads"], p["head_dim"]
        try:
            q, k, v = (torch.randn(1, h, s, d, device=device, dtype=torch.bfloat16) for _ in range(3))
            with torch.no_grad():
                t_fwd = _median_time(lambda: sdpa(q, k, v, is_causal=True), device, repeats)
        except Exception as err:  # noqa: BLE001
            _fail(notes, f"attention_bf16 seq={s} heads={h} head_dim={d}", err)
            q = k = v = None
            continue
        try:
            for t in (q, k, v):
                t.requires_grad_(True)
            grad = torch.randn_like(q)

            def fwd_bwd():
                return torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), grad)

            t_fb = _median_time(fwd_bwd, device, repeats)
        except Exception as err:  # noqa: BLE001 - no row (its fields are all required), the fwd figure in the note
            q = k = v = grad = None
            _fail(notes, f"attention_bf16 fwd_bwd seq={s} heads={h} head_dim={d} "
                         f"(fwd {_sig(2 * h * s * s * d / t_fwd / 1e12)} TFLOP/s)", err)
            continue
        q = k = v = grad = None
        flops = 2 * 2 * h * s * s * d / 2
        rows.append(dict(seq=s, heads=h, head_dim=d, fwd_tflops=_sig(flops / t_fwd / 1e12),
                         fwd_bwd_tflops=_sig(3 * flops / t_fb / 1e12)))
    return rows


def _linear_attention_worker(shape: dict, repeats: int, queue) -> None:
    """Subprocess body: time fla's chunk_gated_delta_rule fwd and fwd+bwd on GPU 0."""
    try:
        torch = _torch()
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        b, s, h, dk, dv = 1, shape["seq"], shape["heads"], shape["key_head_dim"], shape["value_head_dim"]
        bf = dict(device=device, dtype=torch.bfloat16)
        q, k = torch.randn(b, s, h, dk, **bf), torch.randn(b, s, h, dk, **bf)
        v = torch.randn(b, s, h, dv, **bf)
        g = torch.nn.functional.logsigmoid(torch.randn(b, s, h, device=device, dtype=torch.float32))
        beta = torch.randn(b, s, h, **bf).sigmoid()
        kw = {"use_qk_l2norm_in_kernel": True}
        try:
            chunk_gated_delta_rule(q, k, v, g, beta, **kw)
        except TypeError:
            kw = {}
        with torch.no_grad():
            t_fwd = _median_time(lambda: chunk_gated_delta_rule(q, k, v, g, beta, **kw), device, repeats)
        leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
        grad = torch.randn(b, s, h, dv, **bf)

        def fwd_bwd():
            return torch.autograd.grad(chunk_gated_delta_rule(q, k, v, g, beta, **kw)[0], leaves, grad)

        t_fb = _median_time(fwd_bwd, device, repeats)
        queue.put(dict(t_fwd=t_fwd, t_fwd_bwd=t_fb))
    except BaseException as e:  # noqa: BLE001 - report anything, the parent decides
        queue.put(dict(error=f"{type(e).__name__}: {str(e).strip()[:300]}"))


def measure_linear_attention(shape: dict, repeats: int, gpu_type: str,
                             timeout_s: float = LINEAR_ATTENTION_TIMEOUT_S) -> dict:
    """Gated DeltaNet (fla) timing in a time-limited subprocess, or the documented estimate."""
    estimate = dict(kind="estimate", efficiency=LINEAR_ATTENTION_ESTIMATE, note=_LINEAR_ESTIMATE_NOTE)
    if importlib.util.find_spec("fla") is None:
        return estimate
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_linear_attention_worker, args=(shape, repeats, queue), daemon=True)
    proc.start()
    try:
        result = queue.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: the worker hung or died
        result = dict(error=f"no result within {timeout_s:.0f} s (exit code {proc.exitcode})")
    proc.join(timeout=10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=10)
    if "error" in result:
        return dict(estimate, note="fla chunk_gated_delta_rule failed on the profiling machine; "
                    "documented estimate", error=result["error"])
    s, h, dk, dv = shape["seq"], shape["heads"], shape["key_head_dim"], shape["value_head_dim"]
    flops = 8 * h * dk * dv * s
    fb_tflops = 3 * flops / result["t_fwd_bwd"] / 1e12
    try:
        from cost_model.hardware import load_gpu
        efficiency = _sig(fb_tflops / load_gpu(gpu_type).bf16_tflops, 3)
    except Exception:  # noqa: BLE001 - a GPU type outside the catalog has no peak to compare with
        efficiency = None
    return dict(kind="measured", op="fla.ops.gated_delta_rule.chunk_gated_delta_rule", **shape,
                fwd_ms=_sig(result["t_fwd"] * 1e3), fwd_bwd_ms=_sig(result["t_fwd_bwd"] * 1e3),
                fwd_tflops=_sig(flops / result["t_fwd"] / 1e12), fwd_bwd_tflops=_sig(fb_tflops),
                efficiency=efficiency,
                note="FLOPs/token fwd = 8*heads*key_head_dim*value_head_dim, fwd_bwd = 3 x fwd; "
                     "efficiency = fwd_bwd_tflops / catalog dense bf16 peak")


# ---------------------------------------------------------------------- memory and host
def measure_memory(device, repeats: int, sizes: tuple[int, int] = MEMORY_BYTES) -> dict:
    """Pinned H2D / D2H GB/s at sizes[0] and sizes[1] bytes; device copy TB/s (read + write) at sizes[0]."""
    torch = _torch()
    big, small = sizes
    pin = device.type == "cuda"
    host = torch.empty(big, dtype=torch.uint8, pin_memory=pin)
    dev = torch.randint(0, 256, (big,), dtype=torch.uint8, device=device)
    dev2 = torch.empty_like(dev)
    host.copy_(dev)

    def gb_s(dst, src, nbytes):
        t = _median_time(lambda: dst[:nbytes].copy_(src[:nbytes], non_blocking=True), device, repeats, warmup=2)
        return _sig(nbytes / t / 1e9)

    out = dict(hbm_copy_tb_s=_sig(gb_s(dev2, dev, big) * 2 / 1e3),
               h2d_gb_s=gb_s(dev, host, big), d2h_gb_s=gb_s(host, dev, big),
               h2d_256mib_gb_s=gb_s(dev, host, small), d2h_256mib_gb_s=gb_s(host, dev, small))
    del host, dev, dev2
    return out


def measure_cpu_adam(repeats: int, numel: int = ADAM_NUMEL, tensors: int = ADAM_TENSORS) -> dict:
    """torch.optim.Adam(foreach=True) steps on `numel` fp32 CPU parameters: params/s."""
    torch = _torch()
    params = [torch.nn.Parameter(torch.randn(numel // tensors)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-4, foreach=True)
    opt.step()  # allocates the moments
    times = []
    for _ in range(max(3, min(repeats, 5))):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    total = tensors * (numel // tensors)
    return dict(params_per_s=_sig(total / statistics.median(times)), threads=torch.get_num_threads())


# ---------------------------------------------------------------------- collectives
def _collective_fn(op: str, nbytes: int, rank: int, world: int, device, dtype):
    """(fn, bytes) for one collective on a buffer of ~nbytes (rounded down to a multiple of world)."""
    torch = _torch()
    import torch.distributed as dist
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = nbytes // elem // world * world
    full = torch.randn(numel, device=device).to(dtype)
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(full)  # noqa: E731
    elif op == "all_gather":
        part = full[:numel // world].clone()
        fn = lambda: dist.all_gather_into_tensor(full, part)  # noqa: E731
    elif op == "reduce_scatter":
        part = torch.empty(numel // world, device=device, dtype=dtype)
        fn = lambda: dist.reduce_scatter_tensor(part, full)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(full)
        fn = lambda: dist.all_to_all_single(out, full)  # noqa: E731
    elif op == "p2p":
        if rank % 2 == 0 and rank + 1 < world:
            fn = lambda: dist.send(full, rank + 1)  # noqa: E731
        elif rank % 2 == 1:
            fn = lambda: dist.recv(full, rank - 1)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731 - the odd rank out of an odd world idles
    else:
        raise ValueError(f"unknown collective {op!r}")
    return fn, numel * elem


def _collective_worker(rank: int, world: int, port: int, plan: dict, result_path: str) -> None:
    """One rank of the collective sweep; rank 0 writes [bytes, max-over-ranks median seconds] per point."""
    os.environ.update(NCCL_ENV)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor collectives renamed in new torch
    torch = _torch()
    import torch.distributed as dist
    cuda = plan["backend"] == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    kw = {"device_id": device} if cuda else {}
    dist.init_process_group(plan["backend"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=plan["timeout_s"]), **kw)
    try:
        dtype = getattr(torch, plan["dtype"])
        sizes, medians, synced = [], [], []
        for op in plan["ops"]:
            for nbytes in plan["bytes"]:
                fn, actual = _collective_fn(op, nbytes, rank, world, device, dtype)
                dist.barrier()
                warmup = plan["warmup"] if nbytes < 2 ** 28 else 2
                iters = 20 if nbytes <= 2 ** 24 else 5
                medians.append(statistics.median(_batch_times(fn, device, warmup, iters, plan["iters"])))
                synced.append(statistics.median(_synced_times(fn, device, plan["iters"])))
                sizes.append(actual)
                fn = None
        worst = torch.tensor([medians, synced], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(result_path, "w") as fh:
                json.dump(dict(bytes=sizes, seconds=worst[0].tolist(), synced_seconds=worst[1].tolist()), fh)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_collectives(ops: list[str], sizes: list[int], world: int, repeats: int,
                        backend: str = "nccl", timeout_s: float = COLLECTIVE_TIMEOUT_S) -> list[dict]:
    """Spawn one process per GPU (or CPU rank with gloo) and sweep ops x sizes; NCCL-tests busbw."""
    import torch.multiprocessing as tmp
    os.environ.update(NCCL_ENV)
    plan = dict(ops=list(ops), bytes=list(sizes), backend=backend, warmup=COLLECTIVE_WARMUP,
                iters=max(repeats, 5), dtype="bfloat16", timeout_s=max(30, int(timeout_s / 2)))
    with tempfile.TemporaryDirectory(prefix="attune-collectives-") as tmpdir:
        path = os.path.join(tmpdir, "result.json")
        ctx = tmp.spawn(_collective_worker, args=(world, _free_port(), plan, path), nprocs=world,
                        join=False)
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"collective sweep did not finish within {timeout_s:.0f} s")
        with open(path) as fh:
            result = json.load(fh)
    rows = []
    points = [(op, n) for op in ops for n in sizes]
    for (op, _), nbytes, t, ts in zip(points, result["bytes"], result["seconds"], result["synced_seconds"]):
        algbw = nbytes / t / 1e9
        rows.append(dict(op=op, gpus=world, bytes=nbytes, time_us=_sig(t * 1e6),
                         algbw_gb_s=_sig(algbw), busbw_gb_s=_sig(algbw * bus_factor(op, world)),
                         synced_busbw_gb_s=_sig(nbytes / ts / 1e9 * bus_factor(op, world))))
    return rows


# ---------------------------------------------------------------------- the whole profile
def _progress(t0: float, text: str) -> None:
    print(f"[profile {time.perf_counter() - t0:7.1f} s] {text}", file=sys.stderr, flush=True)


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0].strip() or None
    except Exception:  # noqa: BLE001 - no nvidia-smi: the driver is simply unknown
        return None


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(v, int):  # older encoding: 21803 -> 2.18.3 (2.9+), 2708 -> 2.7.8
        base = 10000 if v >= 10000 else 1000
        return f"{v // base}.{v % base // 100}.{v % 100}"
    return ".".join(str(x) for x in tuple(v)[:3])


def _warm_up_clocks(device, seconds: float = 1.0) -> None:
    """Busy the GPU for ~a second so clocks ramp up before the first measurement."""
    torch = _torch()
    n = 4096 if device.type == "cuda" else 64
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.mm(a, a)
        _sync(device)


def _conventions() -> list[str]:
    return [
        "timing: median of `repeats` samples (each >= ~1 ms of back-to-back calls) timed with CUDA events "
        "after warm-up; random normal data; L2 not flushed",
        "gemm_bf16: torch.mm(A[m,k], W[n,k].T), bf16; TFLOP/s = 2*m*n*k/time; the full grid m in "
        f"{list(GEMM_M)} x n, k in {list(GEMM_NK)}, then the model's forward GEMMs (m = tokens "
        f"{list(MODEL_TOKENS)}, n = output width, k = input width) off the grid, each with a `label`",
        "gemm_fp8: torch._scaled_mm e4m3 x e4m3, per-tensor fp32 scales, bf16 out, use_fast_accum=False",
        "grouped_gemm_bf16: torch._grouped_mm(X[E*rows,k], W[E,n,k].transpose(-2,-1), offs), equal rows per "
        "expert; fwd FLOPs = 2*E*rows*k*n; fwd_bwd_tflops = 3 x fwd FLOPs / time(fwd + bwd for X and W)",
        "attention_bf16: SDPA is_causal=True, batch 1, kv heads = heads; fwd FLOPs = 2*2*heads*seq^2*head_dim/2; "
        "fwd_bwd_tflops = 3 x fwd FLOPs / time(fwd+bwd) (the cost model's training = 3 x forward; kernels "
        "execute ~3.5 x forward)",
        "memory: GB/s = 1e9 B/s, pinned host buffers, 2 GiB (and 256 MiB) copies; hbm_copy_tb_s counts read + "
        "write of a 2 GiB device-to-device copy",
        "collectives: busbw_gb_s from batches of back-to-back calls between CUDA events (as nccl-tests); "
        "synced_busbw_gb_s from single calls timed by wall clock between device synchronisations; "
        "bf16 buffers, bytes = full buffer (all_gather output, reduce_scatter input); "
        "time = max over ranks of the per-rank median; algbw = bytes/time; busbw = algbw x factor "
        "(all_reduce 2(n-1)/n, all_gather/reduce_scatter/all_to_all (n-1)/n, p2p 1; p2p = rank 2i -> 2i+1); "
        "NCCL_NVLS_ENABLE=0",
    ]


def _profile(device, shapes: dict, repeats: int, world: int, *, backend: str = "nccl",
             memory_bytes: tuple[int, int] = MEMORY_BYTES, adam_numel: int = ADAM_NUMEL,
             model_name: str | None = None, fp8: bool | None = None, t0: float | None = None) -> dict:
    """Measure everything on `device` (and `world` ranks for collectives); the profile dict."""
    torch = _torch()
    t0 = time.perf_counter() if t0 is None else t0
    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    gpu_type = gpu_type_from_name(device_name)
    notes = _conventions()

    def section(name, fn, default):
        _progress(t0, f"{name} ...")
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - one section failing must not lose the others
            _fail(notes, f"{name} failed", e)
            result = default
        if cuda:
            torch.cuda.empty_cache()
        _progress(t0, f"{name} done in {time.perf_counter() - start:.1f} s")
        return result

    section("clock warm-up", lambda: _warm_up_clocks(device), None)
    gemm = section(f"gemm_bf16 ({len(shapes['gemm'])} shapes)",
                   lambda: measure_gemm(shapes["gemm"], device, repeats, notes), [])
    if fp8 is None:
        fp8 = cuda and torch.cuda.get_device_capability(device) >= (8, 9)
    if fp8:
        gemm_fp8 = section(f"gemm_fp8 ({len(shapes['gemm_fp8'])} shapes)",
                           lambda: measure_gemm_fp8(shapes["gemm_fp8"], device, repeats, notes), [])
    else:
        gemm_fp8 = []
        notes.append("fp8_note: gemm_fp8 skipped: compute capability below 8.9 (no fp8 tensor cores)")
    grouped = section(f"grouped_gemm_bf16 ({len(shapes['grouped_gemm'])} points)",
                      lambda: measure_grouped_gemm(shapes["grouped_gemm"], device, repeats, notes), [])
    attention = section(f"attention_bf16 ({len(shapes['attention'])} points)",
                        lambda: measure_attention(shapes["attention"], device, repeats, notes), [])
    linear = section("linear_attention",
                     lambda: measure_linear_attention(shapes["linear_attention"], repeats, gpu_type),
                     dict(kind="estimate", efficiency=LINEAR_ATTENTION_ESTIMATE, note=_LINEAR_ESTIMATE_NOTE))
    memory = section("memory", lambda: measure_memory(device, repeats, memory_bytes), {})
    cpu_adam = section("cpu_adam", lambda: measure_cpu_adam(repeats, adam_numel), {})
    if world >= 2:
        ops, sizes = shapes["collectives"]["ops"], shapes["collectives"]["bytes"]
        collectives = section(f"collectives ({world} ranks, {len(ops) * len(sizes)} points)",
                              lambda: measure_collectives(ops, sizes, world, repeats, backend), [])
    else:
        collectives = []
        notes.append("collectives skipped: only 1 GPU visible")

    return dict(
        schema_version=SCHEMA_VERSION,
        gpu_type=gpu_type,
        provenance="measured",
        device=device_name,
        count=max(world, 1),
        driver=_driver_version() if cuda else None,
        cuda=str(torch.version.cuda) if torch.version.cuda else None,
        torch=str(torch.__version__),  # TorchVersion, a str subclass yaml.safe_dump refuses
        nccl=_nccl_version(torch) if cuda else None,
        date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        wall_time_s=_sig(time.perf_counter() - t0),
        model=model_name,
        source=f"tune profile (experiments/hardware_profile.py) on {socket.gethostname()}",
        gemm_bf16=gemm,
        gemm_fp8=gemm_fp8,
        grouped_gemm_bf16=grouped,
        attention_bf16=attention,
        linear_attention=linear,
        memory=memory,
        cpu_adam=cpu_adam,
        collectives=collectives,
        notes=_collapse_notes(notes),
    )


def run_profile(model: ModelSpec | None = None, repeats: int = 10, quick: bool = False) -> dict:
    """Profile the local GPUs (compute on GPU 0, collectives over all of them); the profile dict.

    Raises NoGpuError when torch or a CUDA GPU is missing. quick=True shrinks the grids (smoke run).
    """
    t0 = time.perf_counter()
    for key, value in NCCL_ENV.items():  # forced, not setdefault: an inherited NCCL_NVLS_ENABLE=1 is wrong here
        os.environ[key] = value
    try:
        torch = _torch()
    except ImportError:
        raise NoGpuError(NO_GPU_MESSAGE) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not available:
        raise NoGpuError(NO_GPU_MESSAGE)
    shapes = profile_shapes(model)
    if quick:
        shapes = quick_shapes(shapes)
        repeats = min(repeats, 5)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    return _profile(device, shapes, max(1, repeats), torch.cuda.device_count(),
                    adam_numel=ADAM_NUMEL // 8 if quick else ADAM_NUMEL,
                    model_name=model.name if model is not None else None, t0=t0)


def write_profile(profile: dict, path) -> None:
    """Write the profile as YAML, atomically (a temp file in the same folder, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump(profile, fh, sort_keys=False, default_flow_style=None, width=120)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def summary(profile: dict) -> list[str]:
    """A few headline figures of a profile, one per line."""
    def find(rows, **want):
        return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)

    lines = [f"{profile['device']} x{profile['count']} ({profile['gpu_type']}), "
             f"torch {profile['torch']}, CUDA {profile['cuda']}, NCCL {profile['nccl']}"]
    gemm = profile["gemm_bf16"]
    if gemm:
        big = find(gemm, m=8192, n=8192, k=8192)
        best = max(gemm, key=lambda r: r["tflops"])
        lines.append(f"bf16 GEMM: {big['tflops'] if big else 'n/a'} TFLOP/s at 8192^3, best {best['tflops']} "
                     f"at {best['m']}x{best['n']}x{best['k']}")
    if profile["gemm_fp8"]:
        best = max(profile["gemm_fp8"], key=lambda r: r["tflops"])
        lines.append(f"fp8 GEMM: best {best['tflops']} TFLOP/s at {best['m']}x{best['n']}x{best['k']}")
    if profile["grouped_gemm_bf16"]:
        best = max(profile["grouped_gemm_bf16"], key=lambda r: r["fwd_tflops"])
        best_fb = max(profile["grouped_gemm_bf16"], key=lambda r: r["fwd_bwd_tflops"] or 0)
        lines.append(f"grouped GEMM: best fwd {best['fwd_tflops']} TFLOP/s (E={best['experts']}, "
                     f"rows={best['rows_per_expert']}), best fwd+bwd {best_fb['fwd_bwd_tflops']}")
    if profile["attention_bf16"]:
        best = max(profile["attention_bf16"], key=lambda r: r["fwd_bwd_tflops"] or 0)
        lines.append(f"attention: best fwd+bwd {best['fwd_bwd_tflops']} TFLOP/s (seq {best['seq']}, "
                     f"{best['heads']}x{best['head_dim']})")
    la = profile["linear_attention"]
    lines.append(f"linear attention: {la.get('kind')}, efficiency {la.get('efficiency')}")
    for op in ("all_reduce", "all_to_all"):
        row = find(profile["collectives"], op=op, bytes=256 * 2 ** 20)
        if row:
            lines.append(f"{op} busbw at 256 MiB: {row['busbw_gb_s']} GB/s batched "
                         f"({row.get('synced_busbw_gb_s')} GB/s single synchronised calls)")
    mem = profile["memory"]
    if mem:
        lines.append(f"H2D {mem.get('h2d_gb_s')} GB/s, D2H {mem.get('d2h_gb_s')} GB/s, "
                     f"HBM copy {mem.get('hbm_copy_tb_s')} TB/s")
    if profile["cpu_adam"]:
        lines.append(f"CPU Adam: {profile['cpu_adam']['params_per_s']:.4g} params/s "
                     f"({profile['cpu_adam']['threads']} threads)")
    failures = [n for n in profile["notes"] if "Error" in n or "failed" in n]
    if failures:
        lines.append(f"{len(failures)} failure note(s); see notes")
    lines.append(f"wall time: {profile['wall_time_s']} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.hardware_profile",
        description="Measure this machine's GPUs (GEMM, grouped GEMM, attention, memory, collectives) "
                    "and write a hardware profile YAML for the cost model.")
    parser.add_argument("--model", help="catalog name or config.json path: adds the model's own shapes")
    parser.add_argument("--out", help="output YAML (default: profile-<gpu_type>.yaml)")
    parser.add_argument("--quick", action="store_true", help="small grids: a smoke run")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per point (median)")
    args = parser.parse_args(argv)
    try:
        model = load_model(args.model) if args.model else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        profile = run_profile(model, repeats=args.repeats, quick=args.quick)
    except NoGpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report_written(profile, args.out)
    return 0


def report_written(profile: dict, out: str | None) -> Path:
    """Write the profile (default profile-<gpu>.yaml) and print its headline figures."""
    path = Path(out or f"profile-{profile['gpu_type']}.yaml")
    write_profile(profile, path)
    for line in summary(profile):
        print(line)
    print(f"profile written to {path}")
    return path


if __name__ == "__main__":
    sys.exit(main())
