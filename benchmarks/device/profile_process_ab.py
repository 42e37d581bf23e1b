"""Device check: do builds that share a process (what `tune profile` now does while megatron holds less than half
the GPU) time the same as builds in a process each (how the shipped profile was measured)?

Runs MODEL's `tune profile` build plan twice on GPU 0: once through run_plan (shared process), once one build per
process (`--kind`), alternating which goes first per repeat, and prints per build: each point's forward-backward
ratio (shared / own process), the memory held from earlier builds, and both wall times. Measured figures only;
nothing here enters a profile.

Usage (on the device, after benchmarks/device/session_env.sh):
    python benchmarks/device/profile_process_ab.py --model qwen3-30b-a3b --out $OUT/ab.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cost_model.nouns.model_spec import load_model  # noqa: E402
from experiments.checks import runner_components as rc  # noqa: E402


def own_processes(name: str, plan, out: Path, env: dict, timeout_s: float) -> float:
    started = time.perf_counter()
    model = load_model(name)
    for kind, layers, extra in plan:
        argv = [sys.executable, "-m", "experiments.checks.runner_components", "--model", name, "--kind", "+".join(kind),
                "--layers", str(layers), "--out", str(out), "--microbatches", str(rc.MICROBATCHES),
                "--rows", ",".join(map(str, rc.build_rows(model, extra)))] + ([extra] if extra else [])
        try:
            subprocess.run(argv, env=env, timeout=timeout_s, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            print(f"  {'+'.join(kind)} x{layers} {extra}: timed out after {timeout_s:.0f} s (own process)")
    return time.perf_counter() - started


def shared_process(name: str, plan, out: Path, env: dict, timeout_s: float) -> float:
    started = time.perf_counter()
    rc.run_plan(name, plan, out, ["--microbatches", str(rc.MICROBATCHES)], env, timeout_s, print)
    return time.perf_counter() - started


def key(b: dict) -> tuple:
    return (b["model"], tuple(b["kind"]), b["layers"], b["vocab"], bool(b.get("offload")))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--model", default="qwen3-30b-a3b")
    p.add_argument("--out", required=True, help="JSONL of both arms' build records (arm, repeat added)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=300.0)
    args = p.parse_args()
    env = rc.build_env()
    plan = rc.build_plan(load_model(args.model))
    out = Path(args.out)
    records, walls = {"shared": [], "own": []}, {"shared": [], "own": []}
    for r in range(args.repeats):
        arms = ("shared", "own") if r % 2 == 0 else ("own", "shared")
        for arm in arms:
            tmp = out.with_suffix(f".{arm}{r}.tmp")
            tmp.unlink(missing_ok=True)
            run = shared_process if arm == "shared" else own_processes
            walls[arm].append(run(args.model, plan, tmp, env, args.timeout_s))
            lines = rc.read_builds(tmp)
            records[arm] += lines
            with open(out, "a") as f:
                for b in lines:
                    f.write(json.dumps({"arm": arm, "repeat": r, **b}) + "\n")
            tmp.unlink(missing_ok=True)
    own = {}
    for b in records["own"]:
        own.setdefault(key(b), []).append(b)
    ratios = []
    print(f"{args.model}: {len(plan)} builds; wall shared {statistics.median(walls['shared']):.0f} s, "
          f"one process a build {statistics.median(walls['own']):.0f} s (median of {args.repeats})")
    for b in records["shared"]:
        mates = own.get(key(b), [])
        pts = {(q["tokens"], q["full_recompute"]): q["fwd_bwd_s"] for m in mates for q in m["points"] if "fwd_bwd_s" in q}
        rs = [q["fwd_bwd_s"] / pts[(q["tokens"], q["full_recompute"])] for q in b["points"]
              if "fwd_bwd_s" in q and (q["tokens"], q["full_recompute"]) in pts]
        ratios += rs
        label = f"{'+'.join(b['kind'])} x{b['layers']}" + (" host floor" if b.get("host_floor") else "") + \
                (" real vocab" if b["vocab"] > rc.SMALL_VOCAB else "") + (" offload" if b.get("offload") else "")
        print(f"  {label:40s} held before {b.get('held_before_gib', 0):6.1f} GiB, after {b.get('held_after_gib', 0):6.1f} "
              f"(hollowed {b.get('hollowed_gib', 0):.1f}); fwd-bwd shared/own: "
              + (f"median {statistics.median(rs):.3f}, {min(rs):.3f}-{max(rs):.3f} over {len(rs)} points" if rs
                 else "no matching points"))
    if ratios:
        print(f"all points: shared/own median {statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f} "
              f"({len(ratios)} points; measured, 1 GPU)")
    for b in records["shared"]:
        for h in b.get("held_by", []):
            print(f"  held after {'+'.join(b['kind'])} x{b['layers']}: " + (h.get("error") or
                  f"{h['gib']} GiB {h['dtype']}{h['shape']} by {' <- '.join(h['held_by'])}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
