"""Per-rank peak GPU memory for a slime run: the function slime calls before every training step.

slime loads it from `--custom-megatron-before-train-step-hook-path MODULE.FUNCTION` with
`importlib.import_module` + `getattr` (`slime/utils/misc.py:load_function`) and calls it on every Megatron
rank as `hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)`, after zeroing the
gradients and before the step's forward/backward (`slime/backends/megatron_utils/model.py:557-561`, THUDM/slime
@624b824). The runner ships this file as the top-level module `peak_memory_hook` in the job's working
directory, so the flag is `peak_memory_hook.record_peak_memory`.

Each call prints one line (stdout, flushed; Ray forwards it with its `(MegatronTrainRayActor pid=N)` prefix):

    attune-peak-memory rank=3 rollout=1 step_id=0 step=1 allocated_bytes=123 reserved_bytes=456 device=3 alloc_retries=0

`allocated_bytes` / `reserved_bytes` are `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` of the
current device; `alloc_retries` is the caching allocator's count of allocations it retried after freeing its cache
(`torch.cuda.memory_stats()["num_alloc_retries"]`, cumulative): a step that adds to it ran short of memory.
Nothing is reset, so each line is the peak since the process started up to the start of step `step`: the line of
the last step shows the peak of all steps but the last one. `step` is slime's accumulated step id (rollout_id x
steps_per_rollout + step_id, as the `step N:` log lines count), with steps_per_rollout = rollout_batch_size x
n_samples_per_prompt / global_batch_size.

The module imports nothing outside the standard library at import time; without torch or CUDA the hook
prints nothing. `experiments.slime.log` parses the line.
"""
from __future__ import annotations

import os
import sys

TAG = "attune-peak-memory"
HOOK_FUNCTION = "record_peak_memory"


def _memory_stats() -> tuple[int, int, int, int | None] | None:
    """(max allocated bytes, max reserved bytes, device index, allocator retries so far) of the current CUDA
    device, or None."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        device = torch.cuda.current_device()
        retries = torch.cuda.memory_stats(device).get("num_alloc_retries")
        return (int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device)),
                int(device), None if retries is None else int(retries))
    except Exception:                     # a broken CUDA context must not stop training
        return None


def _rank() -> int:
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return int(os.environ.get("RANK", "-1"))


def _steps_per_rollout(args) -> int | None:
    try:
        rows = int(args.rollout_batch_size) * int(getattr(args, "n_samples_per_prompt", 1) or 1)
        gbs = int(args.global_batch_size)
    except (AttributeError, TypeError, ValueError):
        return None
    return rows // gbs if gbs > 0 and rows % gbs == 0 else None


def format_line(rank: int, rollout_id: int, step_id: int, step: int | None, allocated: int, reserved: int,
                device: int | None, alloc_retries: int | None = None) -> str:
    return (f"{TAG} rank={rank} rollout={rollout_id} step_id={step_id} step={'None' if step is None else step} "
            f"allocated_bytes={allocated} reserved_bytes={reserved} device={'None' if device is None else device}"
            + ("" if alloc_retries is None else f" alloc_retries={alloc_retries}"))


def record_peak_memory(args, rollout_id, step_id, model=None, optimizer=None, opt_param_scheduler=None) -> str | None:
    """slime's before-train-step hook: print this rank's peak memory so far; returns the line (None
    when no CUDA device is in use)."""
    stats = _memory_stats()
    if stats is None:
        return None
    allocated, reserved, device, retries = stats
    per_rollout = _steps_per_rollout(args)
    step = int(rollout_id) * per_rollout + int(step_id) if per_rollout else None
    line = format_line(_rank(), int(rollout_id), int(step_id), step, allocated, reserved, device, retries)
    print(line, flush=True)
    return line
