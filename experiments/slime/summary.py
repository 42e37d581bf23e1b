"""A finished slime run's TrialResult from its parsed log (no Ray needed; the runner and tests use it).

Tokens/s per GPU over the window (steps window[0]..window[1], each global_batch rows x seq_len tokens), step
times and their CV, losses, per-rank peak memory from the hook, GPU-hours = GPUs x the run's wall time, and
the failure class (`experiments.slime.log.classify_failure`; `hang` when the runner stopped the job).
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model import metrics
from experiments.runner import TrialResult, TrialSpec
from experiments.slime.log import SlimeLog, WindowError, classify_failure, failure_evidence


@dataclass(frozen=True)
class RunEnd:
    """What the runner knows of a run besides its log: the steps it ran (`window` timed), its exit code, whether
    the job succeeded, why the runner stopped it (None when it ended on its own) and its wall time."""
    window: tuple[int, int]
    steps: int
    exit_code: int | None
    succeeded: bool
    stopped: str | None
    wall_s: float


def summarize(spec: TrialSpec, log: SlimeLog, text: str, end: RunEnd, *, source: str, runner: str = "slime",
              details: dict | None = None) -> TrialResult:
    """The run's TrialResult."""
    window, steps = end.window, end.steps
    gpus = spec.case.layout.world_size
    details = dict(details or {})
    common = _common_fields(log, details, source=source, runner=runner, gpu_hours=metrics.gpu_hours(gpus, end.wall_s))
    failure, detail = classify(text, end.exit_code, succeeded=end.succeeded, stopped=end.stopped)
    stats = None
    if failure is None:
        try:
            stats = log.window_stats(spec.case.workload.global_batch, spec.case.workload.seq_len, gpus, window)
        except WindowError as e:
            failure, detail = "crash", f"the run finished but {e}"
        else:
            if log.last_step is not None and log.last_step + 1 < steps:
                details["warning"] = f"only steps 0..{log.last_step} of {steps} were logged"
    if failure is not None:
        details["log_tail"] = _tail(text)
        return TrialResult(status="failed", failure_class=failure, detail=detail,
                           step_times_s=_partial_step_times(log), details=details, **common)
    tps = stats.tokens_per_s_per_gpu
    details.update(window_tokens=stats.tokens, window_wall_s=round(stats.wall_s, 3), time_source=stats.time_source,
                   grad_norms=list(log.grad_norms()))
    mfu = metrics.format_mfu(spec.case.model.params.active_non_embedding, tps, spec.case.gpu) \
        if metrics.format_peak_tflops(spec.case.gpu) else None
    usd = metrics.usd_per_million_tokens(spec.case.gpu.usd_per_gpu_hour, tps)
    return TrialResult(status="ok", tokens_per_s_per_gpu=tps, step_time_s=stats.wall_s / stats.steps,
                       step_times_s=stats.step_times_s, step_time_cv_percent=stats.step_time_cv_percent,
                       mfu=mfu, usd_per_million_tokens=usd, details=details, **common)


def classify(text: str, exit_code: int | None, *, succeeded: bool, stopped: str | None) -> tuple[str | None, str]:
    """(failure class, message) of a run, (None, "") when it succeeded; a window too short to time is found
    later, by `summarize`."""
    if stopped is not None:
        return "hang", stopped
    if succeeded:
        return None, ""
    failure = classify_failure(text, exit_code) or "crash"
    evidence = failure_evidence(text, failure)
    return failure, f"exit code {exit_code}" + (f": {evidence}" if evidence else "")


def _common_fields(log: SlimeLog, details: dict, *, source: str, runner: str, gpu_hours: float) -> dict:
    """The result's fields a failed run has too (losses, peak memory, GPU-hours); adds the log's counts and
    the per-rank memory figures to `details`."""
    per_rank = log.peak_memory_gib_per_rank()
    reserved = log.peak_memory_gib_per_rank(reserved=True)
    details.update(steps_logged=len(log.steps), last_step=log.last_step,
                   peak_reserved_gib_per_rank={str(k): round(v, 3) for k, v in reserved.items()},
                   peak_memory_ranks=len(per_rank))
    if per_rank:
        details["peak_memory_rank_ids"] = sorted(per_rank)
    retries = log.allocator_retries_per_rank()
    if retries:   # the megatron runner's form (experiments.runner.allocator_retries_per_step reads both)
        details["allocator_churn_per_rank"] = {str(r): {"alloc_retries": [float(x) for x in v]}
                                               for r, v in retries.items()}
    return dict(kind="measured", source=source, runner=runner, losses=log.losses(),
                peak_memory_gib=max(per_rank.values()) if per_rank else None,
                peak_memory_gib_per_rank=tuple(per_rank[k] for k in sorted(per_rank)), gpu_hours=gpu_hours)


def _partial_step_times(log: SlimeLog) -> tuple[float, ...]:
    """The step times a failed run logged (steps 1..last), () when they cannot be told."""
    if not log.last_step or log.last_step < 1:
        return ()
    try:
        return log.step_times(1, log.last_step)[0]
    except WindowError:
        return ()


def _tail(text: str, lines: int = 40, chars: int = 6000) -> str:
    tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    return tail[-chars:]
