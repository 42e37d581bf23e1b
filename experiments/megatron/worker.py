"""One rank's process and its reports to the parent.

The contract both launchers (launch.py) and the monitor rely on: a worker puts dicts on `report`
(a queue with .put) — {"kind": "hb", "phase", ...} heartbeats (with "step" once a training step
is done), then one {"kind": "result", ...} or one {"kind": "error", "phase", "failure_class",
"type", "message", ...} — each with its "rank" and the time "t".
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from experiments.megatron.failures import classify_exception
from experiments.megatron.memory import failure_snapshot
from experiments.megatron.train_loop import train


def worker(rank: int, world_size: int, job: dict, report, device_index: int | None = None) -> None:
    """One rank of a trial. Shared by the torch.multiprocessing and Ray launchers."""
    os.environ.update(job["env"])
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_RANK": str(rank if device_index is None else device_index)})
    log_path = job.get("log_dir") and os.path.join(job["log_dir"], f"rank{rank}.log")
    if log_path:
        _redirect_output(log_path)
    state = {"phase": "init"}

    def send(kind: str, **kw):
        try:
            report.put({"kind": kind, "rank": rank, "t": time.time(), **kw})
        except Exception:  # noqa: BLE001 - the parent is gone; nothing to report to
            pass

    try:
        send("hb", phase="init")
        result = train(rank, world_size, job, send, state, rank if device_index is None else device_index)
        send("result", **result)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        failure = classify_exception(exc, state["phase"])
        extra = {"memory_gib": failure_snapshot(state.get("memory"))} if failure == "cuda_oom" else {}
        send("error", phase=state["phase"], failure_class=failure, type=type(exc).__name__,
             message=" ".join(str(exc).split())[:2000], traceback=tb[-4000:], **extra)
    finally:
        _leave_process_group()
        sys.stdout.flush()
        sys.stderr.flush()


def _redirect_output(log_path: str) -> None:
    """stdout and stderr (this process's and its libraries' native output) to the rank's log."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _leave_process_group() -> None:
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def selftest_worker(rank: int, world_size: int, job: dict, report, device_index: int | None = None) -> None:
    """A stand-in worker for the CPU tests of the launchers and the monitor: no torch, no GPU.

    job["selftest"]: ok (a result), error (a reported construction error), exit (dies silently),
    hang (stalls after its first training step), startup-hang (stalls while loading), slow-start
    (loads for job["load_s"] seconds without a heartbeat, then reports a result)."""
    mode = job["selftest"]

    def send(kind: str, **kw):
        report.put({"kind": kind, "rank": rank, "t": time.time(), **kw})

    send("hb", phase="init")
    if mode == "hang":
        send("hb", phase="train", step=0, step_time_s=0.1)
        time.sleep(3600)
    elif mode == "startup-hang":
        time.sleep(3600)
    elif mode == "exit":
        os._exit(3)
    elif mode == "error":
        exc = NotImplementedError("selftest: a construction error")
        send("error", phase="build", type="NotImplementedError", failure_class=classify_exception(exc, "build"),
             message=str(exc))
    else:
        if mode == "slow-start":
            time.sleep(float(job.get("load_s", 2.0)))
        send("result", step_times_s=[0.1] * 3)
