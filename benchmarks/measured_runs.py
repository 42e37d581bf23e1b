"""Measured runner suites as runs: one per trial name, its repeats together, nothing counted that was not measured.

A suite's results file may hold a trial more than once (a repeat, in another device call); the run's figure is
the mean of its measurements and the spread between them is its repeat noise. A line the runner ran with a smaller
global batch than the suite's (its time budget was short) is a run of its own (`as_run`). A line that says "ok" but
timed no step after its warm-up (stored before the runner refused such lines: its figure is a compiling first
step) is a failed run here, failure "too_few_steps". A line the suite's time budget stopped before its timing
window is left out, like a skipped one: nothing of the layout was measured.

A line's figure is its steady state: the tokens of its timed window over the window's steps from the runner's
own warm-up (2 steps) on. The stored grids timed steps 1-3 of 4, and step 1 was still settling on the largest
micro-batches (near the memory limit up to 8% slower than steps 2-3, which agree within 1%): the leaderboard's
window (steps 5..19) and the runner's default both leave it out.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from cost_model.nouns.runtime import MEGATRON_RUNNER, Runtime
from experiments.runner import allocator_retries_per_step
from experiments.megatron.failures import says_cuda_oom
from experiments.megatron.runner import gpu_from_name
from experiments.megatron.suite import SuiteTrial, parse_suite

ROOT = Path(__file__).resolve().parents[1]
# The runner before it collected an offloaded optimizer's first build (one object: the cost model's memos key by it)
RUNNER_BEFORE_COLLECT = replace(MEGATRON_RUNNER, offload_first_build_collected=False)


@dataclass
class MeasuredRun:
    trial: SuiteTrial
    source: str                                   # the results file's name
    tokens: list = field(default_factory=list)    # tokens/s/GPU of each valid measurement
    peaks: list = field(default_factory=list)     # device peak GiB of each valid measurement
    failures: list = field(default_factory=list)  # failure class of each failed line
    seconds: list = field(default_factory=list)   # wall seconds of each line
    recorded: dict | None = None                  # the prediction the first line recorded when it ran
    gpu: str = "h200"                             # the catalog GPU type the run measured on (its line's source)
    # whether the record's optimizer note says "first offload build collected" (runs from v12 on); before, the runner
    # left an offloaded optimizer's first build to the cyclic collector (only an offloaded layout's memory reads it)
    first_build_collected: bool = True
    retries: list = field(default_factory=list)   # the allocator's retries per step of each valid measurement that
                                                  # counted them (runs from v32 on: experiments.runner.allocator_retries_per_step)
    # whether `peaks` are device-level (total - free); the first 2-GPU suites (2026-11-29/30) recorded the
    # allocator's peak (torch.cuda.max_memory_allocated) as peak_memory_gib, which leaves out what lives outside PyTorch
    device_peaks: bool = True

    @property
    def runtime(self) -> Runtime:
        """The runner's stack as it ran (cost_model.nouns.runtime): what its prediction must assume."""
        return MEGATRON_RUNNER if self.first_build_collected else RUNNER_BEFORE_COLLECT

    @property
    def ok(self) -> bool:
        return bool(self.tokens)

    @property
    def measured(self) -> float:
        return statistics.mean(self.tokens) if self.tokens else 0.0

    @property
    def peak(self) -> float:
        return max(self.peaks) if self.peaks else 0.0

    @property
    def failure(self) -> str | None:
        return None if self.ok else (self.failures[0] if self.failures else "failed")

    @property
    def strained(self) -> bool:
        """A measurement ran short of memory: the allocator retried every step (its time is partly the allocator's)."""
        return any(r > 0 for r in self.retries)

    @property
    def spread(self) -> float | None:
        """(max - min) / mean of the repeats; None for one measurement."""
        return (max(self.tokens) - min(self.tokens)) / self.measured if len(self.tokens) > 1 else None


def measured_gpu(line: dict, default: str) -> str:
    """The catalog GPU type a result line measured on, from its source ("... runner on NVIDIA H200 x1, ..."); the
    suite's where the line does not say (a failed launch)."""
    found = re.search(r" on (.+?) x\d+", str(line.get("source") or ""))
    gpu = gpu_from_name(found.group(1)) if found else None
    return gpu.name if gpu is not None else default


def _valid(line: dict, trial: SuiteTrial) -> bool:
    """A measured line that timed at least one step after the trial's warm-up (the stored window was clamped to
    the steps that ran, so the trial's own window says where the warm-up ends)."""
    if line.get("status") != "ok" or not line.get("tokens_per_s_per_gpu"):
        return False
    start = trial.window[0] if trial.window else min(2, trial.steps - 1)
    return len(line.get("step_times_s") or []) > start


WARM_UP_STEPS = 2


def steady_tokens(line: dict) -> float:
    """tokens/s/GPU over the stored window's steps from WARM_UP_STEPS on (the whole window when none is left)."""
    steps = line.get("step_times_s") or []
    first, last = ((line.get("details") or {}).get("window") or [0, len(steps) - 1])[:2]
    window = steps[first:last + 1]
    steady = steps[max(first, WARM_UP_STEPS):last + 1]
    if not window or not steady:
        return float(line["tokens_per_s_per_gpu"])
    return float(line["tokens_per_s_per_gpu"]) * statistics.fmean(window) / statistics.fmean(steady)


def as_run(trial: SuiteTrial, line: dict) -> SuiteTrial:
    """The trial as the line ran it. The runner scales a trial's global batch down when what is left of the suite's
    time budget is short (its note says so): fewer micro-batches per optimizer step is another workload, so such a
    line is its own run, named `NAME[gb N]`, predicted for the rows it ran and never averaged with the suite's."""
    rows = (line.get("details") or {}).get("global_batch_rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows == trial.workload.global_batch:
        return trial
    return replace(trial, name=f"{trial.name}[gb {rows}]", workload=replace(trial.workload, global_batch=rows))


def _cut_by_budget(line: dict, trial) -> bool:
    """A line the suite's time budget stopped before its timing window: the harness ran out of time, the layout
    neither ran nor failed (unlike the trial's own time limit, which a user's first trial can hit too: a kernel
    compile). Lines written before the suite recorded `suite_budget_s`: stopped well inside the trial's limit."""
    if line.get("failure_class") != "too_few_steps" or "(time budget)" not in str(line.get("detail", "")):
        return False
    if "suite_budget_s" in line:
        return True
    return float(line.get("elapsed_s") or trial.timeout_s) < 0.9 * trial.timeout_s


def load_runs(suite: Path, results: Path) -> list[MeasuredRun]:
    """The suite's trials that have result lines, in the order they first ran."""
    parsed, meta = parse_suite(str(suite))
    trials, default_gpu = {t.name: t for t in parsed}, meta["gpu"]
    runs: dict[str, MeasuredRun] = {}
    for text in results.read_text().splitlines():
        line = json.loads(text)
        t = trials.get(line.get("trial"))
        if (t is None or line.get("status") == "skipped" or line.get("failure_class") == "invalid_config"
                or _cut_by_budget(line, t)):
            continue
        t = as_run(t, line)
        run = runs.setdefault(t.name, MeasuredRun(t, results.name, gpu=measured_gpu(line, default_gpu)))
        if run.recorded is None:
            run.recorded = (line.get("details") or {}).get("prediction_for_model_run") or {}
            run.first_build_collected = "first offload build collected" in str((line.get("details") or {}).get(
                "optimizer", ""))
        run.seconds.append(float((line.get("details") or {}).get("trial_wall_s") or line.get("elapsed_s") or 60.0))
        if _valid(line, t):
            run.tokens.append(steady_tokens(line))
            run.peaks.append(float(line.get("peak_memory_gib") or 0.0))
            run.device_peaks = run.device_peaks and peak_is_device(line)
            retries = allocator_retries_per_step(line.get("details"))
            if retries is not None:
                run.retries.append(retries)
        else:
            run.failures.append(failure_class(line))
    return list(runs.values())


def peak_is_device(line: dict) -> bool:
    """Whether a result line's peak_memory_gib is the device-level peak: its details say so, or it has no record of
    the basis at all but is not one of the first runner's lines (a `detail` dict, allocator peaks only)."""
    details = line.get("details")
    if isinstance(details, dict) and "peak_memory_basis" in details:
        return str(details["peak_memory_basis"]).startswith("device")
    return not isinstance(line.get("detail"), dict)


def failure_class(line: dict) -> str:
    """A failed line's class; a "crash" whose error says the device ran out of memory (a Triton kernel's, which the
    runner called a crash before 2026-12-07) is an out-of-memory run."""
    cls = line.get("failure_class") or ("too_few_steps" if line.get("status") == "ok" else "failed")
    return "cuda_oom" if cls == "crash" and says_cuda_oom(str(line.get("detail", ""))) else cls
