"""Are torch's fused attention kernels right for the shapes the megatron runner gives them? (GPU)

The runner's torch-native core attention (experiments/megatron/torch_native.TorchSDPAttention)
receives megatron's [s, b, heads, head_dim] tensors and hands SDPA their [b, heads, s, head_dim]
permutation (not contiguous when b > 1), with GQA and causal masking; the gradient arriving at its
output is a permutation too. For each kernel torch offers (flash, cuDNN, memory-efficient, math)
and for the kernel torch's own dispatch picks ("auto"), this prints, against an FP32 math
reference on the same inputs:
  - the relative L2 error of the output and of dq, dk, dv;
  - the batch consistency: sample 1 of a b > 1 call against the same sample run alone (b = 1);
  - the fwd+bwd time.
Qwen3.6-35B-A3B's attention: 16 query heads, 2 KV heads (8 and 1 per rank at TP 2), head_dim 256.

    python benchmarks/sdpa_kernels_check.py [--seq 4096 8192] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from experiments.megatron.torch_native import SDPA_KERNELS as KERNELS
NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}


def attention(q_sbhd, k_sbhd, v_sbhd, contiguous: bool):
    """The runner's call: permute to [b, h, s, d], causal SDPA with GQA, back to [s, b, h * d]."""
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q_sbhd, k_sbhd, v_sbhd))
    if contiguous:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5,
                                         enable_gqa=k.shape[1] != q.shape[1])
    s, b = q_sbhd.shape[:2]
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def run(q, k, v, g, contiguous):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    y = attention(*leaves, contiguous)
    (y.float() * g).sum().backward()
    return y.detach(), [t.grad.detach() for t in leaves]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(seq: int, batch: int, heads: int, kv_heads: int, dim: int, seed: int = 0, device: str = "cuda") -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(seq, batch, n, dim, device=device, generator=gen, dtype=torch.bfloat16)
               for n in (heads, kv_heads, kv_heads))
    g = torch.randn(seq, batch, heads * dim, device=device, generator=gen)
    with sdpa_kernel([SDPBackend.MATH]):
        ref_y, ref_grads = run(q.float(), k.float(), v.float(), g, contiguous=True)
    rows = []
    for name in ("auto", *KERNELS):
        for contiguous in (False, True):
            ctx = sdpa_kernel([KERNELS[name]]) if name != "auto" else sdpa_kernel(list(KERNELS.values()))
            with ctx:
                qb = q.permute(1, 2, 0, 3)
                kb = k.permute(1, 2, 0, 3)
                try:
                    chosen = int(torch._fused_sdp_choice(qb, kb, kb, is_causal=True, enable_gqa=kv_heads != heads))
                    y, grads = run(q, k, v, g, contiguous)
                    _sync(device)
                    t0 = time.perf_counter()
                    for _ in range(3):
                        run(q, k, v, g, contiguous)
                    _sync(device)
                    ms = (time.perf_counter() - t0) / 3 * 1e3
                    # Sample `batch - 1` of the batched call against the same sample alone.
                    last = slice(batch - 1, batch)
                    y1, grads1 = run(q[:, last], k[:, last], v[:, last], g[:, last], contiguous)
                    consistency = max(rel(y[:, last], y1), *(rel(a[:, last], b) for a, b in zip(grads, grads1)))
                    err = dict(out=rel(y, ref_y), dq=rel(grads[0], ref_grads[0]), dk=rel(grads[1], ref_grads[1]),
                               dv=rel(grads[2], ref_grads[2]))
                    status = "ok"
                except RuntimeError as e:
                    chosen, err, ms, consistency = -1, {}, None, None
                    status = f"refused: {' '.join(str(e).split())[:120]}"
            rows.append(dict(seq=seq, batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, kernel=name,
                             chosen=NAMES.get(chosen, str(chosen)), inputs="contiguous" if contiguous else "runner",
                             status=status, rel_err=err, batch_consistency=consistency, fwd_bwd_ms=ms))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--device", default="cuda", help="cuda (the check); cpu only smoke-tests this script")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sdpa_kernels_check: error: no CUDA GPU", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# {gpu} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}")
    print(f"{'seq':>5} {'b':>2} {'h/kv':>5} {'kernel':>9} {'inputs':>10} {'ran':>9} {'out':>9} {'dq':>9} {'dk':>9} "
          f"{'dv':>9} {'b-consist':>9} {'ms':>7}")
    rows = []
    shapes = [(s, b, h, kv) for s in args.seq for (b, h, kv) in ((1, 16, 2), (2, 16, 2), (2, 8, 1), (4, 8, 1))]
    for s, b, h, kv in shapes:
        for r in check(s, b, h, kv, args.head_dim, device=args.device):
            rows.append(r)
            e = r["rel_err"]
            if r["status"] != "ok":
                print(f"{s:>5} {b:>2} {h:>2}/{kv:<2} {r['kernel']:>9} {r['inputs']:>10} {r['status']}")
                continue
            print(f"{s:>5} {b:>2} {h:>2}/{kv:<2} {r['kernel']:>9} {r['inputs']:>10} {r['chosen']:>9} "
                  f"{e['out']:9.2e} {e['dq']:9.2e} {e['dk']:9.2e} {e['dv']:9.2e} {r['batch_consistency']:9.2e} "
                  f"{r['fwd_bwd_ms']:7.2f}")
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"gpu": gpu, "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
