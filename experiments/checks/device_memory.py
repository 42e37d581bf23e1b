"""The profile's device_memory section: what a training process holds beyond its tensors, measured.

Run in a fresh process on GPU 0 before the profile touches any GPU (`measure_device_memory` spawns it),
so `total - free` from torch.cuda.mem_get_info is this process alone (on a machine running nothing else):

- visible_gib: mem_get_info's total at the first call: the capacity a training process can use;
- cuda_context_only_gib: device memory in use right after the CUDA context is created;
- kernel steps: after each kind of kernel a training step runs (cuBLAS GEMM, cuBLASLt GEMM with bias,
  SDPA with each backend forward and backward, grouped GEMM, MoE routing ops, a 248k-vocabulary
  cross-entropy, norms and activations, a foreach Adam step), the memory outside PyTorch's allocator:
  `total - free - torch.cuda.memory_reserved()`. Its growth over the context is the workspaces and the
  loaded kernel modules; context_gib (what the cost model reads) is the last step's figure;
- allocator_reserve: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set before CUDA starts (as
  slime and the megatron runner run), a training-like pattern (per micro-batch: layers of saved
  activations with transient buffers between them, the loss path's bf16 and fp32 logits, the backward
  freeing them in reverse while it makes gradient temporaries; micro-batches of different sizes; an
  optimizer-step temporary) scaled to about half the card. unconstrained_fraction = max_memory_reserved
  / max_memory_allocated - 1 when the allocator may keep what it likes; fraction (what the cost model
  reads) = the least slack over the allocated peak with which the same pattern still runs when the
  allocator is capped (set_per_process_memory_fraction): at the limit of the card the allocator gives
  back its cache and retries, so only this part is needed. Without expandable segments (what neither the
  runner nor slime runs) it is measured only when asked (`measure_device_memory(without_expandable=True)`): a
  second fresh process, about 12 s of `tune profile` that nothing read.

The NCCL part of the section is measured with the collectives (experiments.checks.nccl_memory).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

from experiments.checks.measure import load_torch, sig

GIB = 2 ** 30
EXPANDABLE = "expandable_segments:True"
DEVICE_MEMORY_TIMEOUT_S = 240
HOW = ("fresh process on GPU 0 before any other profile section; torch.cuda.mem_get_info: visible = total at the "
       "first call, context = total - free after it, outside PyTorch = total - free - memory_reserved after each "
       "kernel kind; allocator reserve = the least slack over the allocated peak that runs a training-like "
       "pattern under a cap (set_per_process_memory_fraction), PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def _outside(torch, device) -> float:
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return (total - free - torch.cuda.memory_reserved(device)) / GIB


def _kernel_mix(torch, device, tokens: int = 4096, hidden: int = 2048, vocab: int = 248320):
    """(label, fn) for each kind of kernel a training step runs, at training-like shapes."""
    F = torch.nn.functional
    bf = dict(device=device, dtype=torch.bfloat16)
    t, h = tokens, hidden

    def gemm():
        return torch.mm(torch.randn(t, h, **bf), torch.randn(2 * h, h, **bf).t())

    def gemm_bias():
        return F.linear(torch.randn(t, h, **bf), torch.randn(h // 2, h, **bf), torch.randn(h // 2, **bf))

    def sdpa(backend):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q = torch.randn(1, 16, t, 128, **bf, requires_grad=True)
        k, v = (torch.randn(1, 16, t, 128, **bf, requires_grad=True) for _ in range(2))
        with sdpa_kernel(getattr(SDPBackend, backend)):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    def grouped():
        fn = getattr(F, "grouped_mm", None) or torch._grouped_mm
        experts, rows = 64, max(16, t // 32)
        x = torch.randn(experts * rows, h, **bf, requires_grad=True)
        w = torch.randn(experts, h // 2, h, **bf, requires_grad=True)
        offs = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows
        out = fn(x, w.transpose(1, 2), offs=offs)
        out.backward(torch.randn_like(out))  # a dense gradient: grouped_mm's backward rejects expanded ones

    def routing():
        logits = torch.randn(2 * t, 256, device=device, dtype=torch.float32, requires_grad=True)
        probs, idx = torch.topk(torch.softmax(logits, dim=-1), 8, dim=-1)
        order = torch.argsort(idx.flatten(), stable=True) % (2 * t)
        x = torch.randn(2 * t, h, **bf)
        y = torch.zeros_like(x).index_add_(0, order, x[order])
        (probs.sum() + y.float().sum()).backward()

    def cross_entropy():
        logits = torch.randn(max(16, t // 2), vocab, **bf, requires_grad=True)
        F.cross_entropy(logits.float(), torch.randint(0, vocab, (logits.shape[0],), device=device)).backward()

    def elementwise():
        x = torch.randn(2 * t, h, **bf, requires_grad=True)
        norm = torch.nn.RMSNorm(h, device=device, dtype=torch.bfloat16)
        (F.silu(norm(x)) * x).sum().backward()

    def adam():
        params = [torch.nn.Parameter(torch.randn(t * 256, device=device)) for _ in range(4)]
        for p in params:
            p.grad = torch.randn_like(p)
        torch.optim.AdamW(params, lr=1e-4, foreach=True).step()

    steps = [("bf16 GEMM (cuBLAS)", gemm), ("bf16 GEMM with bias (cuBLASLt)", gemm_bias)]
    steps += [(f"SDPA {b.split('_')[0].lower()} fwd+bwd", lambda b=b: sdpa(b))
              for b in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")]
    steps += [("grouped GEMM fwd+bwd", grouped), ("MoE routing (softmax, topk, argsort, index_add)", routing),
              ("cross-entropy over the vocabulary, fp32, fwd+bwd", cross_entropy),
              ("RMSNorm, SiLU fwd+bwd", elementwise), ("AdamW foreach step", adam)]
    return steps


RESERVE_HIDDEN, RESERVE_LAYERS, RESERVE_VOCAB = 2048, 8, 32768
# Bytes per token of the pattern's forward: per layer bf16 tensors of 1, 3 and 8 hidden widths and a
# quarter-width one for each of 9 routed rows; then the loss path's bf16 and fp32 logits.
RESERVE_BYTES_PER_TOKEN = RESERVE_LAYERS * 2 * RESERVE_HIDDEN * (1 + 3 + 8 + 9 / 4) + 6 * RESERVE_VOCAB


def _micro_batch(torch, device, tokens: int) -> None:
    """One micro-batch's forward and backward allocations, as megatron's make them."""
    h, bf = RESERVE_HIDDEN, torch.bfloat16
    saved = []
    for _ in range(RESERVE_LAYERS):             # forward: saved tensors, a transient between them
        saved += [torch.empty(tokens, h * s, device=device, dtype=bf) for s in (1, 3, 8)]
        transient = torch.empty(tokens * 9, h, device=device, dtype=bf)
        saved.append(torch.empty(tokens * 9, h // 4, device=device, dtype=bf))
        del transient
    logits = torch.empty(tokens, RESERVE_VOCAB, device=device, dtype=bf)
    fp32 = torch.empty(tokens, RESERVE_VOCAB, device=device, dtype=torch.float32)
    del logits
    grad = torch.empty(tokens, RESERVE_VOCAB, device=device, dtype=bf)
    del fp32, grad
    while saved:                                # backward: gradient temporaries, saved freed in reverse
        g = torch.empty_like(saved[-2])
        del saved[-4:], g


def _run_pattern(torch, device, base_tokens: int, step_numel: int) -> tuple[int, int]:
    """One pass of the pattern: micro-batches of four sizes, then an optimizer-step temporary;
    (max allocated, max reserved) bytes."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    for share in (0.8, 0.6, 1.0, 0.7):
        _micro_batch(torch, device, max(64, int(base_tokens * share)))
    step_temp = torch.empty(step_numel, device=device, dtype=torch.float32)
    del step_temp
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


PRESSURE_SLACK = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)


def _reserve_pattern(torch, device, budget_gib: float) -> dict:
    """The allocator's reserve under a training-like pattern peaking near `budget_gib`: free-running
    (reserved / allocated peak - 1), and under pressure: the least slack over the allocated peak the
    allocator needs to run the same pattern when its reserved memory is capped
    (torch.cuda.set_per_process_memory_fraction), which is what decides whether a layout at the limit fits."""
    base = max(64, int(budget_gib * GIB / RESERVE_BYTES_PER_TOKEN))
    step_numel = int(budget_gib * GIB / 8 / 4)
    alloc, reserved = _run_pattern(torch, device, base, step_numel)
    out = dict(unconstrained_fraction=sig(reserved / alloc - 1, 3), unconstrained_gib=sig((reserved - alloc) / GIB, 3),
               allocated_peak_gib=sig(alloc / GIB, 4))
    total = torch.cuda.mem_get_info(device)[1]
    for slack in PRESSURE_SLACK:
        torch.cuda.set_per_process_memory_fraction(min(1.0, alloc * (1 + slack) / total), device)
        try:
            _run_pattern(torch, device, base, step_numel)
        except torch.cuda.OutOfMemoryError:
            continue
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            torch.cuda.empty_cache()
        out.update(fraction=slack, how="least slack tried that ran under the cap (tried "
                                        f"{', '.join(f'{x:g}' for x in PRESSURE_SLACK)})")
        return out
    out.update(fraction=out["unconstrained_fraction"], how="no capped run succeeded: the free-running figure")
    return out


def device_memory_worker(queue, expandable: bool, budget_fraction: float = 0.5) -> None:
    """Subprocess body (spawned before anything else touched the GPU); reports one dict on `queue`."""
    try:
        torch = load_torch()
        if expandable:
            try:
                torch.cuda.memory._set_allocator_settings(EXPANDABLE)
            except Exception:  # noqa: BLE001 - the environment variable set by the parent is the first way
                pass
        device = torch.device("cuda", 0)
        t0 = time.perf_counter()
        free, total = torch.cuda.mem_get_info(device)
        out = dict(visible_gib=sig(total / GIB, 5), cuda_context_only_gib=sig((total - free) / GIB, 4),
                   alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), kernel_steps=[])
        for label, fn in _kernel_mix(torch, device):
            try:
                fn()
                out["kernel_steps"].append(dict(after=label, outside_gib=sig(_outside(torch, device), 4)))
            except Exception as e:  # noqa: BLE001 - a kernel this torch or GPU lacks: say so, go on
                out["kernel_steps"].append(dict(after=label, error=f"{type(e).__name__}: {str(e)[:160]}"))
            torch.cuda.empty_cache()
        out["reserve"] = _reserve_pattern(torch, device, free / GIB * budget_fraction)
        out["wall_s"] = sig(time.perf_counter() - t0, 3)
        queue.put(out)
    except BaseException as e:  # noqa: BLE001 - report anything; the parent decides
        queue.put(dict(error=f"{type(e).__name__}: {str(e)[:300]}"))


def _run(expandable: bool, timeout_s: float) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE  # the child reads it before CUDA starts
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    try:
        proc = ctx.Process(target=device_memory_worker, args=(queue, expandable), daemon=True)
        proc.start()
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = saved
    try:
        result = queue.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: hung or died
        result = dict(error=f"no result within {timeout_s:.0f} s (exit code {proc.exitcode})")
    proc.join(timeout=10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=10)
    return result


def measure_device_memory(timeout_s: float = DEVICE_MEMORY_TIMEOUT_S, without_expandable: bool = False) -> dict:
    """A fresh process on GPU 0 with expandable segments (and one without, if asked); the device_memory figures."""
    on = _run(True, timeout_s)
    if "error" in on:
        return dict(error=on["error"])
    off = _run(False, timeout_s) if without_expandable else {}
    steps = on["kernel_steps"]
    measured = [s["outside_gib"] for s in steps if "outside_gib" in s]
    context = max([on["cuda_context_only_gib"]] + measured)
    out = dict(visible_gib=on["visible_gib"], cuda_context_only_gib=on["cuda_context_only_gib"],
               context_gib=sig(context, 4), workspaces_gib=sig(context - on["cuda_context_only_gib"], 4),
               kernel_steps=steps,
               allocator_reserve=dict(on["reserve"], expandable_segments=True,
                                      alloc_conf=on.get("alloc_conf")))
    if "reserve" in off:
        out["allocator_reserve"]["without_expandable_segments"] = off["reserve"]
    return out


def device_memory_section(early: dict | None, nccl: dict, cuda: bool, probe: dict | None = None) -> dict:
    """The profile's device_memory section from the first part (`measure_device_memory`), the runner probe
    (experiments.checks.runner_memory) and the NCCL part (experiments.checks.nccl_memory); what the cost
    model reads is documented in cost_model/device_memory.py. On a CPU nothing is measured: the NCCL rows
    are kept apart as plumbing."""
    if not cuda:
        return dict(provenance="not measured: no CUDA device", nccl_cpu_plumbing=nccl.get("nccl", []))
    out = dict(provenance="measured by tune profile (experiments/checks/device_memory.py, nccl_memory.py)",
               how=HOW)
    if early and "error" not in early:
        out.update(early)
    elif early:
        out["error"] = early["error"]
    if nccl.get("nccl"):
        out.update(nccl)
    if probe and probe.get("runner_outside"):
        out.update(probe)
    return out
