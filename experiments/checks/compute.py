"""The profile's compute sections: bf16 and fp8 GEMM, grouped GEMM, causal attention (SDPA) and Gated DeltaNet
linear attention (fla, in a time-limited subprocess)."""
from __future__ import annotations

import importlib.util

from experiments.checks.measure import load_torch, median_time, note_failure, sig

LINEAR_ATTENTION_ESTIMATE = 0.15
LINEAR_ATTENTION_TIMEOUT_S = 150
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


def _linear_attention_worker(shape: dict, repeats: int, queue) -> None:
    """Subprocess body: time fla's chunk_gated_delta_rule fwd and fwd+bwd on GPU 0."""
    try:
        torch = load_torch()
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
            t_fwd = median_time(lambda: chunk_gated_delta_rule(q, k, v, g, beta, **kw), device, repeats)
        leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
        grad = torch.randn(b, s, h, dv, **bf)

        def fwd_bwd():
            return torch.autograd.grad(chunk_gated_delta_rule(q, k, v, g, beta, **kw)[0], leaves, grad)

        t_fb = median_time(fwd_bwd, device, repeats)
        queue.put(dict(t_fwd=t_fwd, t_fwd_bwd=t_fb))
    except BaseException as e:  # noqa: BLE001 - report anything, the parent decides
        queue.put(dict(error=f"{type(e).__name__}: {str(e).strip()[:300]}"))


def measure_linear_attention(shape: dict, repeats: int, gpu_type: str,
                             timeout_s: float = LINEAR_ATTENTION_TIMEOUT_S) -> dict:
    """Gated DeltaNet (fla) timing in a time-limited subprocess, or the documented estimate."""
    estimate = linear_attention_estimate()
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
        efficiency = sig(fb_tflops / load_gpu(gpu_type).bf16_tflops, 3)
    except Exception:  # noqa: BLE001 - a GPU type outside the catalog has no peak to compare with
        efficiency = None
    return dict(kind="measured", op="fla.ops.gated_delta_rule.chunk_gated_delta_rule", **shape,
                fwd_ms=sig(result["t_fwd"] * 1e3), fwd_bwd_ms=sig(result["t_fwd_bwd"] * 1e3),
                fwd_tflops=sig(flops / result["t_fwd"] / 1e12), fwd_bwd_tflops=sig(fb_tflops),
                efficiency=efficiency,
                note="FLOPs/token fwd = 8*heads*key_head_dim*value_head_dim, fwd_bwd = 3 x fwd; "
                     "efficiency = fwd_bwd_tflops / catalog dense bf16 peak")
