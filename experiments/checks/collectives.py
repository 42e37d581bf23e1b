"""The profile's collectives section: one process per GPU sweeps NCCL collectives over buffer sizes;
NCCL-tests bus bandwidth.

- collectives: one process per GPU (NCCL, NVLink multicast forced off), all_reduce, all_gather
  (all_gather_into_tensor), reduce_scatter (reduce_scatter_tensor), all_to_all (all_to_all_single)
  and p2p (send/recv, rank 2i -> 2i+1, all pairs at once), bf16 buffers of 64 KiB .. 1 GiB in powers
  of 4 (`bytes` = the full buffer: all_gather's output, reduce_scatter's input). Every call is timed
  with CUDA events; time = the max over ranks of each rank's median. NCCL-tests bus bandwidth:
  algbw = bytes / time, busbw = algbw x factor (`bus_factor`).
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
import time
import warnings

from experiments.checks.measure import batch_times, load_torch, sig, synced_times
from experiments.megatron.launch import free_port

COLLECTIVE_WARMUP = 5
COLLECTIVE_TIMEOUT_S = 240

# NVLink multicast (NVLS) must be off on the profiling machines: force it, whatever is inherited.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def bus_factor(op: str, n: int) -> float:
    """NCCL-tests busbw / algbw for `op` over n ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def _collective_fn(op: str, nbytes: int, rank: int, world: int, device, dtype):
    """(fn, bytes) for one collective on a buffer of ~nbytes (rounded down to a multiple of world)."""
    torch = load_torch()
    import torch.distributed as dist
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = nbytes // elem // world * world
    full = torch.randn(numel, device=device).to(dtype)
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(full)  # noqa: E731
    elif op == "all_gather":
        part = full[:numel // world].clone()
        fn = lambda: dist.all_gather_into_tensor(full, part)  # noqa: E731
    elif op == "reduce_scatter":
        part = torch.empty(numel // world, device=device, dtype=dtype)
        fn = lambda: dist.reduce_scatter_tensor(part, full)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(full)
        fn = lambda: dist.all_to_all_single(out, full)  # noqa: E731
    elif op == "p2p":
        if rank % 2 == 0 and rank + 1 < world:
            fn = lambda: dist.send(full, rank + 1)  # noqa: E731
        elif rank % 2 == 1:
            fn = lambda: dist.recv(full, rank - 1)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731 - the odd rank out of an odd world idles
    else:
        raise ValueError(f"unknown collective {op!r}")
    return fn, numel * elem


def rank_setup(rank: int, port: int, plan: dict):
    """A spawned rank's environment, torch and device (GPU `rank` with NCCL, the CPU with gloo):
    (torch, torch.distributed, device). The process group is created by `init_group`."""
    os.environ.update(NCCL_ENV)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor collectives renamed in new torch
    torch = load_torch()
    import torch.distributed as dist
    if plan["backend"] == "nccl":
        torch.cuda.set_device(rank)
        return torch, dist, torch.device("cuda", rank)
    return torch, dist, torch.device("cpu")


def init_group(dist, plan: dict, rank: int, world: int, device) -> None:
    kw = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(plan["backend"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=plan["timeout_s"]), **kw)


def spawn_ranks(worker, world: int, plan: dict, timeout_s: float, what: str, prefix: str):
    """Run `worker(rank, world, port, plan, result_path)` on `world` spawned ranks and return the JSON rank 0
    wrote; ranks still alive after `timeout_s` are killed and TimeoutError names `what`."""
    import torch.multiprocessing as tmp
    with tempfile.TemporaryDirectory(prefix=prefix) as tmpdir:
        path = os.path.join(tmpdir, "result.json")
        ctx = tmp.spawn(worker, args=(world, free_port(), plan, path), nprocs=world, join=False)
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"{what} did not finish within {timeout_s:.0f} s")
        with open(path) as fh:
            return json.load(fh)


def _collective_worker(rank: int, world: int, port: int, plan: dict, result_path: str) -> None:
    """One rank of the collective sweep; rank 0 writes [bytes, max-over-ranks median seconds] per point."""
    torch, dist, device = rank_setup(rank, port, plan)
    init_group(dist, plan, rank, world, device)
    try:
        dtype = getattr(torch, plan["dtype"])
        sizes, medians, synced = [], [], []
        for op in plan["ops"]:
            for nbytes in plan["bytes"]:
                fn, actual = _collective_fn(op, nbytes, rank, world, device, dtype)
                dist.barrier()
                warmup = plan["warmup"] if nbytes < 2 ** 28 else 2
                iters = 20 if nbytes <= 2 ** 24 else 5
                medians.append(statistics.median(batch_times(fn, device, warmup, iters, plan["iters"])))
                synced.append(statistics.median(synced_times(fn, device, plan["iters"])))
                sizes.append(actual)
                fn = None
        worst = torch.tensor([medians, synced], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(result_path, "w") as fh:
                json.dump(dict(bytes=sizes, seconds=worst[0].tolist(), synced_seconds=worst[1].tolist()), fh)
    finally:
        dist.destroy_process_group()


def measure_collectives(ops: list[str], sizes: list[int], world: int, repeats: int,
                        backend: str = "nccl", timeout_s: float = COLLECTIVE_TIMEOUT_S) -> list[dict]:
    """Spawn one process per GPU (or CPU rank with gloo) and sweep ops x sizes; NCCL-tests busbw."""
    os.environ.update(NCCL_ENV)
    plan = dict(ops=list(ops), bytes=list(sizes), backend=backend, warmup=COLLECTIVE_WARMUP,
                iters=max(repeats, 5), dtype="bfloat16", timeout_s=max(30, int(timeout_s / 2)))
    result = spawn_ranks(_collective_worker, world, plan, timeout_s, "collective sweep", "attune-collectives-")
    rows = []
    points = [(op, n) for op in ops for n in sizes]
    for (op, _), nbytes, t, ts in zip(points, result["bytes"], result["seconds"], result["synced_seconds"]):
        algbw = nbytes / t / 1e9
        rows.append(dict(op=op, gpus=world, bytes=nbytes, time_us=sig(t * 1e6),
                         algbw_gb_s=sig(algbw), busbw_gb_s=sig(algbw * bus_factor(op, world)),
                         synced_busbw_gb_s=sig(nbytes / ts / 1e9 * bus_factor(op, world))))
    return rows
