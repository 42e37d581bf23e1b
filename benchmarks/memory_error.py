"""The memory model's measured error: the device peak each stored runner run measured against the peak
the cost model predicted for it before it ran, and the relative sd that "fits" is judged with.

    python benchmarks/memory_error.py [RESULTS.jsonl ...]      (default: benchmarks/results/*.jsonl)

Each line of a results file is a TrialResult dict of the megatron runner: the measured device-level peak
`peak_memory_gib` (max over ranks of total - free, details.peak_memory_basis "device"), and the cost model's
prediction made for the run under details.prediction_for_model_run. The predicted figure is what the layout
needs (memory_gib.total, the prediction's peak_memory_gib; lines written before the allocator cache was
split off call it memory_gib.needed, their total includes the cache). The error of a run is
measured / predicted - 1: positive where the prediction was under the measurement.

Counted: runs with status ok, a prediction and a device-level peak that reached their measuring window: a
run stopped before its third step (a first kernel compile took the trial's time) may not have reached the
peak of a later step, so it is printed, not counted. A trial measured twice in one file
counts once (its last line). A file whose trials a later file measured again (same trial layout and layer
count; files in the order git first recorded them) is superseded: the boundary suites were re-run after
each recalibration of the memory model, which was refitted on the earlier suite's runs, so its predictions
no longer say what the current model errs by. Its runs are printed, not counted.

memory_error_sd is the larger of (median |error| / 0.6745) and (max |error| / 2), never below 0.01: a
normal sd whose median absolute value is the observed median and whose 2-sd band holds every counted run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MAD_TO_SD = 0.6745      # median |x| of a standard normal
MAX_IN_SD = 2.0         # every counted error within 2 sd
SD_FLOOR = 0.01


@dataclass(frozen=True)
class Run:
    file: str
    trial: str
    key: tuple              # (trial layout, layers, GPUs): what a later suite re-measures
    measured: float
    predicted: float
    usable: float | None
    predicted_fits: bool | None
    short: bool = False     # stopped before its measuring window: printed, not counted

    @property
    def error(self) -> float:
        return self.measured / self.predicted - 1


def short_run(details: dict) -> bool:
    ran, asked = details.get("steps_run"), details.get("steps_requested")
    return ran is not None and bool(asked) and ran < min(asked, 3)


def read_runs(path: Path) -> tuple[list[Run], dict[str, int]]:
    """The file's runs that carry a comparable measured and predicted peak (a trial's last line), and how
    many lines were left out, by reason."""
    runs: dict[str, Run] = {}
    skipped: dict[str, int] = {}
    for text in path.read_text().splitlines():
        if not text.strip():
            continue
        line = json.loads(text)
        d = line.get("details") or {}
        pred = d.get("prediction_for_model_run") or {}
        mem = pred.get("memory_gib") or {}
        needed = mem.get("needed", pred.get("peak_memory_gib", mem.get("total")))
        why = ("not ok" if line.get("status") != "ok" else "no prediction" if not needed
               else "peak not device-level" if not str(d.get("peak_memory_basis", "")).startswith("device")
               else "no measured peak" if not line.get("peak_memory_gib") else None)
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        name = str(line.get("trial") or "")
        key = (name.split("--")[0], (d.get("model_run") or {}).get("layers"), line.get("gpus"))
        if name in runs:
            skipped["measured again later in the file"] = skipped.get("measured again later in the file", 0) + 1
        runs[name] = Run(path.name, name, key, float(line["peak_memory_gib"]), float(needed), mem.get("usable"),
                         pred.get("fits"), short_run(d))
    return list(runs.values()), skipped


def recorded_order(paths: list[Path]) -> tuple[list[Path], str]:
    """`paths` oldest first: by the time git first recorded each (a file git does not hold yet is newest),
    then by name; by name alone where git cannot say."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=@%ct", "--name-only", "--", "."],
                             cwd=paths[0].parent, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError, IndexError):
        return sorted(paths, key=lambda p: p.name), "by file name (git history not available)"
    first: dict[str, int] = {}
    when = 0
    for text in out.splitlines():
        if text.startswith("@"):
            when = int(text[1:])
        elif text.strip():
            first[Path(text.strip()).name] = when   # newest commit first: the last seen is the first recorded
    newest = max(first.values(), default=0) + 1
    return (sorted(paths, key=lambda p: (first.get(p.name, newest), p.name)),
            "by the commit that first recorded each file (git log)")


def superseded(ordered: list[Path], runs: dict[Path, list[Run]]) -> dict[Path, Path]:
    """file -> the later file that measured some of its trials again."""
    out = {}
    for i, path in enumerate(ordered):
        keys = {r.key for r in runs[path]}
        later = next((q for q in ordered[i + 1:] if keys & {r.key for r in runs[q]}), None)
        if later is not None:
            out[path] = later
    return out


def figures(errors: list[float]) -> dict:
    if not errors:
        return dict(runs=0)
    absolute = [abs(e) for e in errors]
    return dict(runs=len(errors), median_signed=statistics.median(errors), median_abs=statistics.median(absolute),
                max_abs=max(absolute), prediction_under=sum(e > 0 for e in errors))


def derive_sd(f: dict) -> tuple[float, str]:
    """memory_error_sd from the counted runs' figures, and how."""
    by_median, by_max = f["median_abs"] / MAD_TO_SD, f["max_abs"] / MAX_IN_SD
    sd = max(by_median, by_max, SD_FLOOR)
    which = ("the floor" if sd == SD_FLOOR else "median |error| / 0.6745" if sd == by_median
             else "max |error| / 2")
    return sd, (f"max(median |error| {f['median_abs']:.2%} / {MAD_TO_SD} = {by_median:.2%}, max |error| "
                f"{f['max_abs']:.2%} / {MAX_IN_SD:g} = {by_max:.2%}, floor {SD_FLOOR:.0%}) = {sd:.2%} ({which})")


def _fmt(f: dict) -> str:
    if not f["runs"]:
        return "no comparable run"
    return (f"{f['runs']} runs, median {f['median_signed']:+.2%} (|error| median {f['median_abs']:.2%}, max "
            f"{f['max_abs']:.2%}), prediction under the measurement in {f['prediction_under']}")


def report(paths: list[Path], out=None) -> dict:
    out = out or sys.stdout
    ordered, how = recorded_order(paths)
    runs, skipped = {}, {}
    for p in ordered:
        runs[p], skipped[p] = read_runs(p)
    later = superseded(ordered, runs)
    print(f"device peak error = measured / predicted - 1 (predicted: what the layout needs, memory_gib.total); "
          f"files {how}", file=out)
    counted = []
    for p in ordered:
        if not runs[p] and not skipped[p]:
            continue
        errs = [r.error for r in runs[p] if not r.short]
        state = ("" if not runs[p] else f"; superseded by {later[p].name}, not counted" if p in later
                 else "; counted")
        left = ", ".join(f"{n} {why}" for why, n in sorted(skipped[p].items()))
        print(f"{p.name}: {_fmt(figures(errs))}{state}" + (f"; left out: {left}" if left else ""), file=out)
        for r in runs[p]:
            print(f"    {r.trial[:44]:44s} measured {r.measured:6.1f} predicted {r.predicted:6.1f} of "
                  f"{r.usable if r.usable is not None else float('nan'):6.1f} "
                  f"({'fits' if r.predicted_fits else 'not to fit'}) {r.error:+.2%}"
                  + ("  (stopped before its window: not counted)" if r.short else ""), file=out)
        if p not in later:
            counted += [r for r in runs[p] if not r.short]
    everything = figures([r.error for rs in runs.values() for r in rs if not r.short])
    overall = figures([r.error for r in counted])
    print(f"every comparable run (superseded suites too): {_fmt(everything)}", file=out)
    print(f"counted: {_fmt(overall)}", file=out)
    if not overall["runs"]:
        print("no counted run: memory_error_sd cannot be derived", file=out)
        return dict(overall=overall, everything=everything, memory_error_sd=None)
    sd, derivation = derive_sd(overall)
    print(f"memory_error_sd = {derivation}", file=out)
    files = [p.name for p in ordered if p not in later and runs[p]]
    result = dict(overall={k: round(v, 4) if isinstance(v, float) else v for k, v in overall.items()},
                  everything={k: round(v, 4) if isinstance(v, float) else v for k, v in everything.items()},
                  memory_error_sd=round(sd, 4), counted_files=files,
                  superseded={p.name: q.name for p, q in later.items()})
    print(json.dumps(result), file=out)
    return result


# Runs kept out of every derivation: the runner grids that judge the cost model (benchmarks/runner_accuracy.py).
HELD_OUT = ("runner-grids-",)


def default_paths() -> list[Path]:
    return sorted(p for p in RESULTS.glob("*.jsonl") if not p.name.startswith(HELD_OUT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", help="runner result files (default: benchmarks/results/*.jsonl)")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.results] or default_paths()
    return 0 if report(paths)["memory_error_sd"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
