"""Predictions for a runner suite before any of it runs, from the code and shipped profile as they are now.

Committed beside the suite before the device call, so the judged figures cannot have been chosen after the
fact (benchmarks/runner_accuracy.py re-predicts them later with whatever model is then current).

Usage: python benchmarks/predict_before.py SUITE.json [> benchmarks/results/NAME-predicted-before.txt]
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.runner_accuracy import trial_prediction  # noqa: E402
from benchmarks.suite_overlap import describe, overlaps  # noqa: E402
from cost_model.nouns.hardware import load_gpu  # noqa: E402
from experiments.megatron.backend_support import microbatch_refusal  # noqa: E402
from experiments.megatron.suite import parse_suite  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/predict_before.py SUITE.json", file=sys.stderr)
        return 2
    trials, meta = parse_suite(argv[0])
    gpu = load_gpu(meta["gpu"])
    counts = " or ".join(str(n) for n in sorted({t.layout.world_size for t in trials}))
    print(f"# on {counts} x {gpu.display_name} (the suite's gpu), from its shipped profile")
    for line in describe([f for f in overlaps(argv[0]) if f[1] == "same run"]):   # not held out: say so before
        print(f"# repeats a stored run (not new evidence): {line}")
    print(f"{'trial':22} {'predicted tok/s/GPU':>20} {'needs GiB':>9} {'device peak':>11} verdict   "
          "(predicted before any of these ran; device peak: what it needs plus the allocator's gap where there is room)")
    for t in trials:
        refusal = microbatch_refusal(t.layout, t.workload.global_batch)
        if refusal:   # the runner refuses it at set-up: no prediction to judge (fix the suite)
            print(f"{t.name:22} {'refused':>20} by the runner: {refusal}")
            continue
        _, p = trial_prediction(t, gpu)
        print(f"{t.name:22} {p.tokens_per_s_per_gpu:20.0f} {p.peak_memory_gib:9.1f} {p.memory.device_peak:11.1f} "
              f"{p.fit_verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
