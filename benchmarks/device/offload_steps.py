"""Device experiment: the offloaded optimizer's step, step by step and phase by phase.

The profile prices an offloaded step per parameter from dense builds; MoE runs with the optimizer offloaded
(v14: Qwen3-235B-A22B, Mixtral-8x22B, Qwen3.5-397B-A17B) took 1.1-1.7x that. This prints every step's time
(zeroing the gradient buffers, forward-backward, optimizer.step) for one build at the given offload fraction, and
with `--phases` what megatron-core's HybridDeviceOptimizer spends inside the step (each phase closed by a
device synchronize, so the phases add up to slightly more than an unsynchronized step):

- d2h_s: the gradients of the offloaded tensors copied into pinned host buffers;
- gpu_s: the GPU Adam over the tensors left on the GPU (and its fp32-to-bf16 copy back);
- cpu_s: CPU Adam over the offloaded tensors (torch's fused AdamW on the CPU);
- h2d_s: the updated fp32 host tensors copied into the bf16 GPU parameters;
- outer_s: the rest of optimizer.step (megatron's grad norm, clip, chained optimizers).

Usage (one build per process, as the profile runs them):
    python benchmarks/device/offload_steps.py --model llama3-8b --layers 2 --fraction 1.0 --steps 8 >> out.jsonl
    python benchmarks/device/offload_steps.py --model qwen3-235b-a22b --layers 2 --fraction 0.25 --rows 8 \
        --microbatches 2 --real-vocab --phases >> out.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PHASES = ("d2h_s", "gpu_s", "cpu_s", "h2d_s", "hdo_s")


def hybrid_optimizers(optimizer) -> list:
    """megatron's HybridDeviceOptimizer instances inside a (chained) distributed optimizer."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [s.optimizer for s in subs if isinstance(getattr(s, "optimizer", None), HybridDeviceOptimizer)]


def instrument(hdo, acc: dict, torch) -> dict:
    """Time the phases of `hdo.step` into `acc` (seconds, summed over a step); returns its tensor counts."""
    def timed(fn, key):
        def run(*a, **k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            torch.cuda.synchronize()
            acc[key] += time.perf_counter() - t0
            return out
        return run

    hdo._set_sub_optimizer_grads = timed(hdo._set_sub_optimizer_grads, "d2h_s")
    hdo.step = timed(hdo.step, "hdo_s")
    if hdo.gpu_optimizer is not None:
        hdo.gpu_optimizer.step = timed(hdo.gpu_optimizer.step, "gpu_s")

    def before(*_):
        acc["_t"] = time.perf_counter()

    def math_done(*_):  # CPU Adam is synchronous: it has finished when the post hooks start
        t = time.perf_counter()
        acc["cpu_s"] += t - acc["_t"]
        acc["_t"] = t

    def copied(*_):
        torch.cuda.synchronize()
        acc["h2d_s"] += time.perf_counter() - acc["_t"]

    for opt in hdo.cpu_optimizers:
        opt.register_step_pre_hook(before)
        first = opt.register_step_post_hook(math_done)
        opt._optimizer_step_post_hooks.move_to_end(first.id, last=False)  # before megatron's copy-back hook
        opt.register_step_post_hook(copied)
    cpu = [p for o in hdo.cpu_optimizers for g in o.param_groups for p in g["params"]]
    gpu = [p for g in (hdo.gpu_optimizer.param_groups if hdo.gpu_optimizer else []) for p in g["params"]]
    return {"cpu_tensors": len(cpu), "cpu_numel": sum(p.numel() for p in cpu),
            "gpu_tensors": len(gpu), "gpu_numel": sum(p.numel() for p in gpu),
            "largest_cpu_tensor": max((p.numel() for p in cpu), default=0)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--fraction", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rows", type=int, default=1, help="rows of seq_len tokens per micro-batch")
    p.add_argument("--microbatches", type=int, default=None)
    p.add_argument("--real-vocab", action="store_true")
    p.add_argument("--phases", action="store_true", help="time the HybridDeviceOptimizer's phases")
    args = p.parse_args()

    from cost_model.nouns.layout import Layout
    from cost_model.nouns.model_spec import load_model
    from experiments.checks.runner_components import (MICROBATCHES, SEQ_LEN, SMALL_VOCAB, Bench, kind_model,
                                                      layer_kinds)

    microbatches = args.microbatches or MICROBATCHES
    bench = Bench(SEQ_LEN, microbatches, 1, lambda s: None)
    model = load_model(args.model)
    m = kind_model(model, layer_kinds(model)[0], args.layers, None if args.real_vocab else SMALL_VOCAB)
    layout = Layout(1, max_tokens_per_gpu=SEQ_LEN * args.rows, optimizer_offload_fraction=args.fraction)
    t0 = time.perf_counter()
    config, chunks, optimizer, n_params = bench.build(m, layout, offload=False)
    build_s = time.perf_counter() - t0
    torch = bench.torch
    acc = dict.fromkeys(PHASES, 0.0)
    counts = [instrument(h, acc, torch) for h in hybrid_optimizers(optimizer)] if args.phases else []
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from experiments.megatron.data import StepBatches
    from experiments.megatron.train_loop import forward_step
    batches = StepBatches(global_batch=microbatches * args.rows, dp=1, dp_rank=0, rows_per_microbatch=args.rows,
                          seq_len=SEQ_LEN, vocab=m.vocab_size, seed=0)
    fwd_bwd = get_forward_backward_func()
    steps = []
    for i in range(args.steps):
        acc.update(dict.fromkeys(PHASES, 0.0))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        chunks[0].zero_grad_buffer()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        fwd_bwd(forward_step_func=forward_step, data_iterator=iter(batches(i)), model=chunks[0],
                num_microbatches=microbatches, seq_length=SEQ_LEN, micro_batch_size=args.rows,
                decoder_seq_length=SEQ_LEN, forward_only=False)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        optimizer.step()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        step = {"zero_grad_s": round(t1 - t0, 4), "fwd_bwd_s": round(t2 - t1, 4), "optimizer_s": round(t3 - t2, 4)}
        if counts:
            step.update({k: round(acc[k], 4) for k in PHASES})
            step["outer_s"] = round(t3 - t2 - acc["hdo_s"], 4)
        steps.append(step)
    print(json.dumps({"model": m.name, "params": n_params, "fraction": args.fraction, "rows": args.rows,
                      "microbatches": microbatches, "vocab": m.vocab_size, "build_s": round(build_s, 1),
                      "optimizer_kind": type(getattr(optimizer, "optimizer", optimizer)).__name__,
                      "hybrid_optimizers": counts, "device": torch.cuda.get_device_name(0),
                      "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2),
                      "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2 ** 30, 2),
                      "steps": steps}), flush=True)
    bench.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
