"""How far the host's time to issue a layer's kernels differs between machines of the pool: the spread behind
constants.yaml runner_host_launch_error_sd.

A runner layer kind's host floor (cost_model.runner_components.HostFloor) is what `tune profile`'s host-floor builds
measured on the machine it ran on: a hidden-256 layer whose GPU work is too small to show, so its seconds are the
host's. The shipped profiles hold one host's floors; a user's host issues kernels faster or slower. Here every stored
profile that measured a host floor (the shipped H200 profile and the `tune profile` runs under benchmarks/results) is
read, the floors grouped by the build that measured them (layer kind and host-floor model: the same kernels), and the
log sd within the groups measured on more than one machine or day is pooled. No training run is read: these are
profile builds, not the grids the model is judged on.

    python benchmarks/host_floor_spread.py
"""
from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The shipped H200 profile's floors are its builds'; the shipped H100 one is derived from them (the same floors), so
# only the H200 file counts.
SOURCES = [ROOT / "cost_model/data/profiles/h200.yaml",
           *sorted((ROOT / "benchmarks/results").glob("profile-*.yaml"))]


def floors(paths=SOURCES) -> dict[tuple[str, tuple[str, ...]], list[tuple[str, float]]]:
    """(layer kind, host-floor models) -> [(profile file, seconds per layer per micro-batch)], each profile's own
    measurements (floors borrowed from another profile left out)."""
    out = defaultdict(list)
    for path in paths:
        profile = load_profile(path)
        if profile.runner is None:
            continue
        for kind, floor in profile.runner.host_floors.items():
            if not floor.borrowed and not floor.composed:
                out[(kind, floor.models)].append((path.name, floor.layer_s))
    return dict(out)


def pooled_log_sd(groups: dict) -> tuple[float, int]:
    """(the pooled sd of log seconds within the groups with two or more measurements, its degrees of freedom)."""
    ss, df = 0.0, 0
    for points in groups.values():
        if len(points) < 2:
            continue
        logs = [math.log(s) for _, s in points]
        mean = statistics.fmean(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
    return (math.sqrt(ss / df) if df else float("nan")), df


def main() -> int:
    groups = floors()
    print("host floors (seconds per layer per micro-batch) by the build that measured them; measured, each a "
          "tune profile's host-floor builds on the machine it ran on")
    for (kind, models), points in sorted(groups.items()):
        print(f"{kind:24s} {'+'.join(models)}")
        for name, s in points:
            print(f"    {s * 1e3:7.2f} ms  {name}")
    sd, df = pooled_log_sd(groups)
    spread = [(k, p) for k, p in groups.items() if len(p) >= 2]
    print(f"pooled log sd within the {len(spread)} builds measured more than once: {sd:.3f} ({df} degrees of freedom)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
