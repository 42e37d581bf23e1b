"""Device experiment: the offloaded optimizer's step, step by step, on the profile's own offload builds.

The profile times an offload build's optimizer step as the median of 3 steps after one warm-up step, at offload
1.0. The measured grids' offload runs cost a median 0.84x that per parameter. This prints every step's time (zeroing
the gradient buffers + optimizer.step) over `--steps` steps, for a build at the given offload fraction, so the
warm-up the CPU side needs and the cost per parameter at 0.5 and 1.0 can be read off.

Usage (one build per process, as the profile runs them):
    python benchmarks/device/offload_steps.py --model llama3-8b --layers 2 --fraction 1.0 --steps 8 >> out.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--fraction", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--real-vocab", action="store_true")
    args = p.parse_args()

    from cost_model.nouns.layout import Layout
    from cost_model.nouns.model_spec import load_model
    from experiments.checks.runner_components import (MICROBATCHES, SEQ_LEN, SMALL_VOCAB, Bench, kind_model,
                                                      layer_kinds)

    bench = Bench(SEQ_LEN, MICROBATCHES, 1, lambda s: None)
    model = load_model(args.model)
    m = kind_model(model, layer_kinds(model)[0], args.layers, None if args.real_vocab else SMALL_VOCAB)
    layout = Layout(1, max_tokens_per_gpu=SEQ_LEN, optimizer_offload_fraction=args.fraction)
    t0 = time.perf_counter()
    config, chunks, optimizer, n_params = bench.build(m, layout, offload=False)
    build_s = time.perf_counter() - t0
    torch = bench.torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from experiments.megatron.data import StepBatches
    from experiments.megatron.train_loop import forward_step
    batches = StepBatches(global_batch=MICROBATCHES, dp=1, dp_rank=0, rows_per_microbatch=1, seq_len=SEQ_LEN,
                          vocab=m.vocab_size, seed=0)
    fwd_bwd = get_forward_backward_func()
    steps = []
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        chunks[0].zero_grad_buffer()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        fwd_bwd(forward_step_func=forward_step, data_iterator=iter(batches(i)), model=chunks[0],
                num_microbatches=MICROBATCHES, seq_length=SEQ_LEN, micro_batch_size=1, decoder_seq_length=SEQ_LEN,
                forward_only=False)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        optimizer.step()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        steps.append({"zero_grad_s": round(t1 - t0, 4), "fwd_bwd_s": round(t2 - t1, 4), "optimizer_s": round(t3 - t2, 4)})
    print(json.dumps({"model": m.name, "params": n_params, "fraction": args.fraction, "build_s": round(build_s, 1),
                      "optimizer_kind": type(getattr(optimizer, "optimizer", optimizer)).__name__, "steps": steps}),
          flush=True)
    bench.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
