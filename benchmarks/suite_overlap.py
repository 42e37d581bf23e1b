"""Which trials of a runner suite repeat runs already stored, before it is registered as held out.

A held-out grid is evidence only where it runs what no stored grid ran: v35 (2026-12-06) re-ran four of v31's
Qwen3.6 layouts unnoticed until after the run. For each trial of SUITE this names the stored runs (every results
file benchmarks/runner_accuracy.py judges) of

- the same run: same model, layer count, GDN replacement, GPU type, sequence length and layout;
- the same shape: all of that but the layout (another layout of a model shape seen there).

benchmarks/predict_before.py prints the first kind in the registration it writes.

Usage: python benchmarks/suite_overlap.py SUITE.json
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measured_runs import load_runs  # noqa: E402
from experiments.megatron.suite import SuiteTrial, parse_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stored:
    trial: str
    results: str   # the results file's name


def _model_key(model: str) -> str:
    """A catalog name as given; a config.json by its path relative to the repository (how suites name them)."""
    path = Path(model)
    if path.suffix == ".json":
        try:
            return str(path.resolve().relative_to(ROOT))
        except ValueError:
            return str(path.resolve())
    return model


def shape_key(t: SuiteTrial, gpu: str) -> tuple:
    return (_model_key(t.model), t.layers, t.replace_gdn, gpu, t.workload.seq_len, t.gpus)


def run_key(t: SuiteTrial, gpu: str) -> tuple:
    return shape_key(t, gpu) + (t.layout,)


def stored_runs(sources) -> tuple[dict, dict]:
    """(run key -> stored runs, shape key -> stored runs) over `sources` [(suite, results), ...]."""
    by_run: dict[tuple, list[Stored]] = {}
    by_shape: dict[tuple, list[Stored]] = {}
    for suite, results in sources:
        if not Path(results).exists():
            continue
        for run in load_runs(Path(suite), Path(results)):
            stored = Stored(run.trial.name, Path(results).name)
            by_run.setdefault(run_key(run.trial, run.gpu), []).append(stored)
            by_shape.setdefault(shape_key(run.trial, run.gpu), []).append(stored)
    return by_run, by_shape


def overlaps(suite: str | Path, sources=None) -> list[tuple[str, str, list[Stored]]]:
    """[(trial, "same run" | "same shape", the stored runs), ...] for SUITE's trials that repeat runs of other suites
    (its own results, once it has run, are not a repeat)."""
    if sources is None:
        from benchmarks.runner_accuracy import DEFAULT
        sources = DEFAULT
    trials, meta = parse_suite(str(suite))
    own = Path(suite).resolve()
    by_run, by_shape = stored_runs([(s, r) for s, r in sources if Path(s).resolve() != own])   # not its own runs
    out = []
    for t in trials:
        same = by_run.get(run_key(t, meta["gpu"]))
        if same:
            out.append((t.name, "same run", same))
            continue
        shape = by_shape.get(shape_key(t, meta["gpu"]))
        if shape:
            out.append((t.name, "same shape", shape))
    return out


def describe(found) -> list[str]:
    return [f"{name}: {kind} as {', '.join(sorted({f'{s.trial} ({s.results})' for s in stored})[:4])}"
            + (" ..." if len({(s.trial, s.results) for s in stored}) > 4 else "")
            for name, kind, stored in found]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/suite_overlap.py SUITE.json", file=sys.stderr)
        return 2
    found = overlaps(argv[0])
    for line in describe(found):
        print(line)
    print(f"{sum(k == 'same run' for _, k, _ in found)} trials repeat a stored run, "
          f"{sum(k == 'same shape' for _, k, _ in found)} more a stored shape")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
