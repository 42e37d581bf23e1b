"""The profile's compute sections: bf16 and fp8 GEMM, grouped GEMM, causal attention (SDPA) and Gated DeltaNet
linear attention (fla, in a time-limited subprocess).

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
- linear_attention: fla's chunk_gated_delta_rule (Gated DeltaNet) forward and forward+backward at
  4,096, 8,192, 16,384 and 32,768 tokens (batch 1), with the model's q/k and value heads and with q/k
  repeated to the value heads (how megatron-core's GatedDeltaNet calls it), in a subprocess with a time
  limit (fla's TileLang backend compiles with nvcc on first use; points already measured are kept). On
  Hopper it sets FLA_TILELANG=1 unless set (fla 0.6.0's Triton backward is wrong there with Triton 3.4 to
  3.7.0, fla #640, and its TileLang backend replaces it), records fla's, Triton's and TileLang's versions
  and the backends fla dispatched to (its '[FLA Backend]' log lines), and says so when TileLang did not
  run. efficiency = fwd_bwd TFLOP/s near 8,192 tokens / the catalog's dense bf16 peak. The cost model
  uses the times (cost_model.profile.GdnKernel). Without fla: a documented estimate (efficiency 0.15).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from experiments.checks.measure import load_torch, median_time, note_failure, sig

LINEAR_ATTENTION_ESTIMATE = 0.15
LINEAR_ATTENTION_TIMEOUT_S = 420  # fla's TileLang backend compiles its kernels with nvcc on first use
LINEAR_ESTIMATE_NOTE = "fla not importable on the profiling machine; documented estimate"


def linear_attention_estimate() -> dict:
    """The documented estimate that stands in when fla cannot be measured."""
    return dict(kind="estimate", efficiency=LINEAR_ATTENTION_ESTIMATE, note=LINEAR_ESTIMATE_NOTE)


def measure_gemm(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """bf16 torch.mm(A[m,k], W[n,k].T) TFLOP/s at each point (views of one random buffer each)."""
    torch = load_torch()
    gen = dict(device=device, dtype=torch.bfloat16)
    a_buf = torch.randn(max(p["m"] * p["k"] for p in points), **gen)
    w_buf = torch.randn(max(p["n"] * p["k"] for p in points), **gen)
    c_buf = torch.empty(max(p["m"] * p["n"] for p in points), **gen)
    rows = []
    for p in points:
        m, n, k = p["m"], p["n"], p["k"]
        a, w, c = a_buf[:m * k].view(m, k), w_buf[:n * k].view(n, k), c_buf[:m * n].view(m, n)
        try:
            t = median_time(lambda: torch.mm(a, w.t(), out=c), device, repeats)
        except Exception as e:  # noqa: BLE001 - one failed shape must not lose the profile
            note_failure(notes, f"gemm_bf16 {m}x{n}x{k}", e)
            continue
        row = dict(m=m, n=n, k=k, tflops=sig(2 * m * n * k / t / 1e12))
        if "label" in p:  # a model shape off the grid: say so, loaders keep the grid apart
            row["label"] = p["label"]
        rows.append(row)
    return rows


def measure_gemm_fp8(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """torch._scaled_mm TFLOP/s, e4m3 operands with per-tensor scales, bf16 out."""
    torch = load_torch()
    rows = []
    for p in points:
        m, n, k = p["m"], p["n"], p["k"]
        try:
            a = w = fn = None
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
            one = torch.tensor(1.0, device=device)
            fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            t = median_time(fn, device, repeats)
        except Exception as e:  # noqa: BLE001
            note_failure(notes, f"gemm_fp8 {m}x{n}x{k}", e)
            continue
        finally:
            a = w = fn = None
        rows.append(dict(m=m, n=n, k=k, tflops=sig(2 * m * n * k / t / 1e12)))
    return rows


def measure_grouped_gemm(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """torch._grouped_mm forward and forward+backward TFLOP/s (fwd_bwd = 3 x fwd FLOPs)."""
    torch = load_torch()
    rows = []
    for p in points:
        e, r, k, n = p["experts"], p["rows_per_expert"], p["k"], p["n"]
        try:
            x = torch.randn(e * r, k, device=device, dtype=torch.bfloat16)
            w = torch.randn(e, n, k, device=device, dtype=torch.bfloat16)
            offs = torch.arange(1, e + 1, device=device, dtype=torch.int32) * r
            t_fwd = median_time(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), device, repeats)
        except Exception as err:  # noqa: BLE001
            note_failure(notes, f"grouped_gemm_bf16 E={e} rows={r} k={k} n={n}", err)
            x = w = None
            continue
        try:
            x.requires_grad_(True)
            w.requires_grad_(True)
            grad = torch.randn(e * r, n, device=device, dtype=torch.bfloat16)

            def fwd_bwd():
                out = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
                return torch.autograd.grad(out, (x, w), grad)

            t_fb = median_time(fwd_bwd, device, repeats)
        except Exception as err:  # noqa: BLE001 - no row (its fields are all required), the fwd figure in the note
            x = w = grad = None
            note_failure(notes, f"grouped_gemm_bf16 fwd_bwd E={e} rows={r} k={k} n={n} "
                                f"(fwd {sig(2 * e * r * k * n / t_fwd / 1e12)} TFLOP/s)", err)
            continue
        x = w = grad = None
        flops = 2 * e * r * k * n
        rows.append(dict(experts=e, rows_per_expert=r, k=k, n=n, fwd_tflops=sig(flops / t_fwd / 1e12),
                         fwd_bwd_tflops=sig(3 * flops / t_fb / 1e12)))
    return rows


def measure_attention(points: list[dict], device, repeats: int, notes: list) -> list[dict]:
    """Causal SDPA fwd and fwd+bwd TFLOP/s (fwd = 2*2*heads*seq^2*head_dim/2; fwd_bwd = 3 x fwd)."""
    torch = load_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    for p in points:
        s, h, d = p["seq"], p["heads"], p["head_dim"]
        try:
            q, k, v = (torch.randn(1, h, s, d, device=device, dtype=torch.bfloat16) for _ in range(3))
            with torch.no_grad():
                t_fwd = median_time(lambda: sdpa(q, k, v, is_causal=True), device, repeats)
        except Exception as err:  # noqa: BLE001
            note_failure(notes, f"attention_bf16 seq={s} heads={h} head_dim={d}", err)
            q = k = v = None
            continue
        try:
            for t in (q, k, v):
                t.requires_grad_(True)
            grad = torch.randn_like(q)

            def fwd_bwd():
                return torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), grad)

            t_fb = median_time(fwd_bwd, device, repeats)
        except Exception as err:  # noqa: BLE001 - no row (its fields are all required), the fwd figure in the note
            q = k = v = grad = None
            note_failure(notes, f"attention_bf16 fwd_bwd seq={s} heads={h} head_dim={d} "
                                f"(fwd {sig(2 * h * s * s * d / t_fwd / 1e12)} TFLOP/s)", err)
            continue
        q = k = v = grad = None
        flops = 2 * 2 * h * s * s * d / 2
        rows.append(dict(seq=s, heads=h, head_dim=d, fwd_tflops=sig(flops / t_fwd / 1e12),
                         fwd_bwd_tflops=sig(3 * flops / t_fb / 1e12)))
    return rows


# Triton keeps a kernel's autotuning result on disk (as it keeps compiled kernels): the profile's Gated DeltaNet
# timings and the runner builds after them run fla's kernels at the same shapes in two processes, and without it the
# second tunes every kernel again.
TRITON_AUTOTUNE_CACHE = {"TRITON_CACHE_AUTOTUNING": "1"}


def configure_fla_env(capability: tuple[int, int]) -> str:
    """Before fla's first call: on Hopper, fla 0.6.0's Triton chunk_bwd_dqkwg is wrong with Triton 3.4 to
    3.7.0 (fla #640) and its TileLang backend replaces it (fla.ops.common.backends.tilelang, enabled by
    env FLA_TILELANG; it needs the tilelang package and an nvcc). Set FLA_TILELANG=1 on Hopper unless set."""
    if "FLA_TILELANG" in os.environ:
        return f"{os.environ['FLA_TILELANG']} (set by the user)"
    if capability[0] == 9:
        os.environ["FLA_TILELANG"] = "1"
        return "1 (set by tune profile: fla's TileLang backend on Hopper)"
    return "unset"


def _fla_info(torch, fla_status: str) -> dict:
    """What fla will run: versions, the optional backends' packages, nvcc, the device."""
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None
    try:
        from fla.utils import has_usable_nvcc
        nvcc = bool(has_usable_nvcc())
    except Exception:  # noqa: BLE001 - an fla without the helper
        nvcc = None
    cap = torch.cuda.get_device_capability(0)
    return dict(fla=version("fla-core") or version("flash-linear-attention"), triton=version("triton"),
                tilelang=version("tilelang"), flash_qla=version("flash-qla") or version("flash_qla"),
                nvcc=nvcc, FLA_TILELANG=fla_status, capability=f"{cap[0]}.{cap[1]}",
                device=torch.cuda.get_device_name(0))


class _DispatchLog:
    """fla logs each backend it dispatches to ('[FLA Backend] op.fn -> backend') at INFO: keep them."""

    def __init__(self):
        import logging
        self.lines: list[str] = []
        log = self

        class Handler(logging.Handler):
            def emit(self, record):
                text = record.getMessage()
                if "[FLA Backend]" in text and text not in log.lines:
                    log.lines.append(text)

        logger = logging.getLogger("fla")
        logger.setLevel(logging.INFO)
        logger.addHandler(Handler())


@dataclass(frozen=True)
class GdnPoint:
    """One Gated DeltaNet kernel shape: tokens, q/k and value heads, key and value head dims (the names of
    the profile's linear_attention shape)."""
    tokens: int
    qk_heads: int
    v_heads: int
    key_head_dim: int
    value_head_dim: int


def _gdn_inputs(torch, point: GdnPoint, device):
    """q, k (l2-normalised), v, g (fp32 log decay), beta as megatron-core's GatedDeltaNet passes them."""
    tokens, qk, v, dk, dv = point.tokens, point.qk_heads, point.v_heads, point.key_head_dim, point.value_head_dim
    F = torch.nn.functional
    bf = dict(device=device, dtype=torch.bfloat16)
    q = F.normalize(torch.randn(1, tokens, qk, dk, device=device), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(1, tokens, qk, dk, device=device), dim=-1).to(torch.bfloat16)
    vv = torch.randn(1, tokens, v, dv, **bf)
    g = F.logsigmoid(torch.randn(1, tokens, v, device=device, dtype=torch.float32))
    beta = torch.randn(1, tokens, v, **bf).sigmoid()
    return q, k, vv, g, beta


def _time_gdn(torch, kernel, point: GdnPoint, repeats: int, device) -> dict:
    """Forward and forward+backward milliseconds of the kernel at one shape."""
    tokens, qk, v, dv = point.tokens, point.qk_heads, point.v_heads, point.value_head_dim
    q, k, vv, g, beta = _gdn_inputs(torch, point, device)
    kw = dict(use_qk_l2norm_in_kernel=False)
    with torch.no_grad():
        t_fwd = median_time(lambda: kernel(q, k, vv, g, beta, **kw), device, repeats)
    leaves = [t.requires_grad_(True) for t in (q, k, vv, g, beta)]
    grad = torch.randn(1, tokens, v, dv, device=device, dtype=torch.bfloat16)
    t_fb = median_time(lambda: torch.autograd.grad(kernel(q, k, vv, g, beta, **kw)[0], leaves, grad), device, repeats)
    return dict(tokens=tokens, qk_heads=qk, v_heads=v, fwd_ms=sig(t_fwd * 1e3), fwd_bwd_ms=sig(t_fb * 1e3))


def _linear_attention_worker(shape: dict, repeats: int, queue) -> None:
    """Subprocess body: time fla's chunk_gated_delta_rule fwd and fwd+bwd on GPU 0, point by point
    (each point is reported as it is measured, so a timeout keeps the points already done)."""
    try:
        torch = load_torch()
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        status = configure_fla_env(torch.cuda.get_device_capability(0))
        log = _DispatchLog()
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        from experiments.megatron import fla_tuning
        tuning = fla_tuning.seed_for_megatron(torch.cuda.get_device_name(0))
        queue.put(dict(info={**_fla_info(torch, status), "tuning": tuning}))
        dk, dv = shape["key_head_dim"], shape["value_head_dim"]
        for qk, v in gdn_series(shape):
            for tokens in shape["tokens"]:
                point = _time_gdn(torch, chunk_gated_delta_rule, GdnPoint(tokens, qk, v, dk, dv), repeats, device)
                queue.put(dict(point=point, dispatch=list(log.lines)))
        fla_tuning.record()
        queue.put(dict(done=True, dispatch=list(log.lines)))
    except BaseException as e:  # noqa: BLE001 - report anything, the parent decides
        queue.put(dict(error=f"{type(e).__name__}: {str(e).strip()[:300]}"))


def gdn_series(shape: dict) -> list[tuple[int, int]]:
    """(q/k heads, value heads) to measure: q/k repeated to the value heads, which is how megatron-core's
    GatedDeltaNet (and the HF module) call the kernel, and the only series the cost model reads where it is
    measured (cost_model.profile.GdnKernel.series_for). The model's grouped heads are not timed: a series nothing
    reads took about half of the kernel's minute in `tune profile` (each shape's first runs tune its kernels)."""
    return [(shape["v_heads"], shape["v_heads"])]


def _collect(queue, proc, timeout_s: float) -> tuple[dict, list, list, str | None]:
    """(info, points, dispatch lines, error) from the worker's messages until it is done or the time is up."""
    import queue as queue_mod
    import time
    info, points, dispatch, error = {}, [], [], None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            msg = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue_mod.Empty:
            return info, points, dispatch, f"no result within {timeout_s:.0f} s (exit code {proc.exitcode})"
        if "error" in msg:
            return info, points, dispatch, msg["error"]
        info = msg.get("info", info)
        dispatch = msg.get("dispatch", dispatch)
        if "point" in msg:
            points.append(msg["point"])
        if msg.get("done"):
            return info, points, dispatch, error


def _hopper_backend_problem(info: dict, dispatch: list[str]) -> str | None:
    """On Hopper fla must run its TileLang backward (or FlashQLA): None when it did."""
    if not str(info.get("capability", "")).startswith("9."):
        return None
    if any("-> tilelang" in line or "-> flash_qla" in line for line in dispatch):
        return None
    return ("fla did not dispatch to its TileLang backend (or FlashQLA) on Hopper: install tilelang and make "
            "nvcc findable (CUDA_HOME or PATH), FLA_TILELANG=1")


def measure_linear_attention(shape: dict, repeats: int, gpu_type: str,
                             timeout_s: float = LINEAR_ATTENTION_TIMEOUT_S) -> dict:
    """Gated DeltaNet (fla) timing in a time-limited subprocess, or the documented estimate."""
    estimate = linear_attention_estimate()
    if importlib.util.find_spec("fla") is None:
        return estimate
    import multiprocessing as mp
    for key, value in TRITON_AUTOTUNE_CACHE.items():
        os.environ.setdefault(key, value)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_linear_attention_worker, args=(shape, repeats, queue), daemon=True)
    proc.start()
    info, points, dispatch, error = _collect(queue, proc, timeout_s)
    proc.join(timeout=10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=10)
    if not points:
        return dict(estimate, note="fla chunk_gated_delta_rule failed on the profiling machine; "
                    "documented estimate", error=error or "no point measured", **({"fla_info": info} if info else {}))
    return _linear_section(shape, points, info, dispatch, error, gpu_type)


def _linear_section(shape: dict, points: list, info: dict, dispatch: list, error: str | None, gpu_type: str) -> dict:
    """The profile's linear_attention section from the measured points."""
    dk, dv = shape["key_head_dim"], shape["value_head_dim"]
    best = [p for p in points if p["qk_heads"] == p["v_heads"]] or points
    ref = min(best, key=lambda p: abs(p["tokens"] - 8192))
    fb_tflops = 3 * 8 * ref["v_heads"] * dk * dv * ref["tokens"] / (ref["fwd_bwd_ms"] / 1e3) / 1e12
    try:
        from cost_model.nouns.hardware import load_gpu
        efficiency = sig(fb_tflops / load_gpu(gpu_type).bf16_tflops, 3)
    except Exception:  # noqa: BLE001 - a GPU type outside the catalog has no peak to compare with
        efficiency = None
    out = dict(kind="measured", op="fla.ops.gated_delta_rule.chunk_gated_delta_rule",
               source=f"tune profile on {info.get('device', 'GPU 0')}", **{k: info.get(k) for k in (
                   "fla", "triton", "tilelang", "flash_qla", "nvcc", "FLA_TILELANG", "capability", "tuning")},
               dispatch=dispatch, qk_heads=shape["qk_heads"], v_heads=shape["v_heads"], key_head_dim=dk,
               value_head_dim=dv, dtype="bfloat16", points=points, efficiency=efficiency,
               note="batch 1, bf16 q/k/v (q and k l2-normalised before the call, use_qk_l2norm_in_kernel=False), fp32 "
                    "g, bf16 beta, as megatron-core's GatedDeltaNet calls it; fwd under no_grad, fwd_bwd = forward + "
                    "autograd backward for q, k, v, g, beta; efficiency = fwd_bwd TFLOP/s (3 x 8*v_heads*key_head_dim"
                    "*value_head_dim FLOPs per token) near 8,192 tokens / the catalog's dense bf16 peak")
    problem = _hopper_backend_problem(info, dispatch)
    if problem:
        out["backend_problem"] = problem
    if error:
        out["error"] = f"stopped early: {error}"
    return out
