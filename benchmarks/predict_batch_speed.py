"""Time `tune predict --batch` on N requests (default 1,000) in one process.

Requests cycle over models, GPUs, GPU counts and layouts drawn from the search space, plus the two
reference recipes and a few invalid requests, as a user's what-if file would.
Usage: python benchmarks/predict_batch_speed.py [-n 1000]
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from search_space.enumerate import enumerate_layouts
from cost_model.nouns.stack import Stack
from cost_model.nouns.layout_codec import layout_values

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "tests" / "fixtures" / "reference_recipes"


def requests(n: int) -> list[dict]:
    pool = []
    for name, gpu, gpus in (("qwen3.6-35b-a3b", "h200", 8), ("qwen3-30b-a3b", "h100", 16),
                            ("deepseek-v3", "gb200", 64), ("llama3-8b", "b200", 8)):
        layouts = list(enumerate_layouts(load_model(name), gpus, Workload(), Stack()))
        for layout in layouts[:: max(1, len(layouts) // 60)]:
            values = layout_values(layout)
            pool.append({"model": name, "gpu": gpu, "gpus": gpus, "layout": values})
    pool += [{"recipe": str(p)} for p in sorted(RECIPES.glob("*.yaml"))]
    pool += [{"model": "qwen3.6-35b-a3b", "gpu": "h200", "layout": {"tp": 3}}, {"model": "nope", "gpu": "h200"}]
    return list(itertools.islice(itertools.cycle(pool), n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000)
    args = parser.parse_args()
    reqs = requests(args.n)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", "predict", "--batch", f.name], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    wall = time.perf_counter() - t0
    lines = proc.stdout.splitlines()
    errors = sum(1 for l in lines if "error" in json.loads(l))
    print(f"{len(reqs):,} requests -> {len(lines):,} result lines ({errors} errors) in {wall:.2f} s wall, "
          f"one process, exit {proc.returncode}; {wall / len(reqs) * 1e3:.2f} ms per request")


if __name__ == "__main__":
    main()
