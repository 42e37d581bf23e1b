"""Failure classes for what goes wrong in a worker: an exception it reports, or an exit without a report."""
from __future__ import annotations

from cost_model.nouns.layout import InvalidLayout
from cost_model.nouns.model_spec import ModelError

# When ranks fail differently, the first of these names the trial's failure (a stuck collective is
# usually the peers of the rank that really failed).
CLASS_PRIORITY = ("invalid_config", "cuda_oom", "host_oom", "crash", "nccl_timeout", "hang", "too_few_steps")


def says_cuda_oom(text: str) -> bool:
    """Whether an error's text is the device running out of memory: torch's allocator ("CUDA out of memory"), a
    CUDA call ("CUDA error: out of memory"), or a Triton kernel's launch ("Triton Error [CUDA]: out of memory", met
    by fla's Gated DeltaNet kernels on 1 x H100, 2026-12-07)."""
    lowered = text.lower()
    return "out of memory" in lowered and "cuda" in lowered


def classify_exception(exc: BaseException, phase: str = "train") -> str:
    """A failure class for an exception raised in a worker during `phase` ("init", "config",
    "build", "optimizer", "train")."""
    text = f"{type(exc).__name__}: {exc}"
    oom_types, dist_types = _torch_error_types()
    if (oom_types and isinstance(exc, oom_types)) or says_cuda_oom(text):
        return "cuda_oom"
    if isinstance(exc, MemoryError):
        return "host_oom"
    lowered = text.lower()
    if ("watchdog caught collective operation timeout" in lowered
            or (dist_types and isinstance(exc, dist_types) and ("timeout" in lowered or "timed out" in lowered))
            or ("nccl" in lowered and ("timeout" in lowered or "timed out" in lowered))):
        return "nccl_timeout"
    if isinstance(exc, (InvalidLayout, ModelError)):
        return "invalid_config"
    if phase in ("config", "build", "optimizer") and isinstance(
            exc, (ValueError, AssertionError, ImportError, NotImplementedError, TypeError, KeyError)):
        return "invalid_config"
    return "crash"


def _torch_error_types() -> tuple[tuple, tuple]:
    """(CUDA out-of-memory types, distributed error types) of this torch; empty without torch."""
    try:
        import torch
        oom_types = tuple(t for t in (getattr(torch.cuda, "OutOfMemoryError", None),
                                      getattr(torch, "OutOfMemoryError", None)) if t is not None)
        dist_types = tuple(t for t in (getattr(torch.distributed, "DistBackendError", None),
                                       getattr(torch.distributed, "DistError", None)) if t is not None)
    except Exception:  # noqa: BLE001 - classification must work without torch
        return (), ()
    return oom_types, dist_types


def classify_exit(exitcode: int | None, log_tail: str = "") -> str:
    """A failure class for a worker that died without reporting an exception."""
    lowered = log_tail.lower()
    if "watchdog caught collective operation timeout" in lowered or ("nccl" in lowered and "timeout" in lowered):
        return "nccl_timeout"
    if says_cuda_oom(log_tail):
        return "cuda_oom"
    if exitcode == -9:
        return "host_oom"  # SIGKILL we did not send: the kernel's OOM killer
    return "crash"


def most_telling(errors: list[dict]) -> dict:
    """The error that names a failed trial: the highest-priority class, the earliest among equals."""
    return min(errors, key=lambda e: (CLASS_PRIORITY.index(e["failure_class"])
                                      if e["failure_class"] in CLASS_PRIORITY else 99, e.get("t", 0)))
