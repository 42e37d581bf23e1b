"""How many layouts per second the cost model scores on one core.

Enumerates the whole search space of a model on N GPUs, then times `predict` over it.
Usage: python benchmarks/cost_model_speed.py [--model qwen3.6-35b-a3b] [--gpu h200] [--gpus 8]
"""
from __future__ import annotations

import argparse
import time

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from search_space.enumerate import enumerate_layouts
from cost_model.nouns.stack import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.6-35b-a3b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    args = parser.parse_args()
    model, gpu, workload = load_model(args.model), load_gpu(args.gpu), Workload()
    for n in args.gpus:
        t0 = time.perf_counter()
        layouts = list(enumerate_layouts(model, n, workload, Stack()))
        t1 = time.perf_counter()
        predictions = [predict(model, gpu, workload, layout) for layout in layouts]
        t2 = time.perf_counter()
        fitting = sum(p.fits for p in predictions)
        print(f"{model.display_name} on {n} x {gpu.display_name}: {len(layouts):,} valid layouts enumerated in "
              f"{t1 - t0:.2f} s; scored in {t2 - t1:.2f} s = {len(layouts) / (t2 - t1):,.0f} layouts/s "
              f"({(t2 - t1) / len(layouts) * 1e6:.0f} us each); {fitting:,} predicted to fit")


if __name__ == "__main__":
    main()
