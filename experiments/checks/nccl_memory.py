"""The profile's NCCL memory: device memory per communicator, at creation and after its first collectives.

One process per GPU (as training runs), NVLink multicast off (as the runners run). Each rank binds its
device in init_process_group (device_id), so torch creates every new group's communicator eagerly by
splitting the default one (what the megatron runner does; megatron-core builds about 20 groups per
rank). Memory outside PyTorch's allocator is `total - free - memory_reserved` (torch.cuda.mem_get_info):

- default group: after init_process_group, and after its first all-reduce;
- `groups` new groups of all ranks: per communicator after creating them (init_gib), then after running
  all-reduce, all-gather, reduce-scatter, all-to-all (64 MiB) and send/recv on each (buffers_gib);
- the same for single-rank groups (each rank alone), which NCCL treats differently (issue #2363: the first
  collective allocates a 512 MiB shared buffer).

The figure per row is the largest over ranks. On a CPU (gloo) the plumbing runs and every figure is 0.
"""
from __future__ import annotations

import json
import os

from experiments.checks.collectives import NCCL_ENV, init_group, rank_setup, spawn_ranks
from experiments.checks.measure import sig

GIB = 2 ** 30
NCCL_MEMORY_GROUPS = 4
NCCL_MEMORY_TIMEOUT_S = 180
MESSAGE_BYTES = 64 * 2 ** 20
HOW = ("one process per GPU, init_process_group(device_id=...) so groups are created eagerly, NCCL_NVLS_ENABLE=0; "
       "outside PyTorch = total - free - memory_reserved (torch.cuda.mem_get_info) around creating {groups} groups "
       "of each size and around their first all-reduce, all-gather, reduce-scatter, all-to-all ({mib} MiB) and "
       "send/recv; per communicator; the largest over ranks")


def _use(group, size: int, rank: int, ranks: list[int], device, torch, nbytes: int = MESSAGE_BYTES) -> None:
    """The collectives a training step runs on a group: each once, at a message size that uses every channel."""
    import torch.distributed as dist
    numel = max(size, nbytes // 2 // size * size)
    full = torch.ones(numel, device=device, dtype=torch.bfloat16)
    part = torch.ones(numel // size, device=device, dtype=torch.bfloat16)
    dist.all_reduce(full, group=group)
    dist.all_gather_into_tensor(full, part, group=group)
    dist.reduce_scatter_tensor(part, full, group=group)
    dist.all_to_all_single(torch.empty_like(full), full, group=group)
    if size > 1:
        me = ranks.index(rank)
        if me % 2 == 0 and me + 1 < size:
            dist.send(part, ranks[me + 1], group=group)
        elif me % 2 == 1:
            dist.recv(part, ranks[me - 1], group=group)


def _groups(size: int, world: int, rank: int, count: int):
    """`count` new groups of `size` ranks this rank belongs to (every rank creates every group, in order)."""
    import torch.distributed as dist
    if size == world:
        return [(dist.new_group(list(range(world))), list(range(world))) for _ in range(count)]
    mine = []
    for _ in range(count):
        made = [dist.new_group([r]) for r in range(world)]
        mine.append((made[rank], [rank]))
    return mine


def _nccl_memory_worker(rank: int, world: int, port: int, plan: dict, result_path: str) -> None:
    """One rank: the figures, reduced to the largest over ranks; rank 0 writes them."""
    torch, dist, device = rank_setup(rank, port, plan)
    cuda = device.type == "cuda"

    def outside() -> float:
        if not cuda:
            return 0.0
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return (total - free - torch.cuda.memory_reserved(device)) / GIB

    figures = [outside()]
    init_group(dist, plan, rank, world, device)
    try:
        figures.append(outside())
        dist.all_reduce(torch.ones(1024, device=device))
        figures.append(outside())
        for size in plan["sizes"]:
            groups = _groups(size, world, rank, plan["groups"])
            figures.append(outside())
            for group, ranks in groups:
                _use(group, size, rank, ranks, device, torch, plan["message_bytes"])
            figures.append(outside())
        worst = torch.tensor(figures, dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            with open(result_path, "w") as fh:
                json.dump(worst.tolist(), fh)
    finally:
        dist.destroy_process_group()


def _rows(figures: list[float], sizes: list[int], groups: int) -> tuple[dict, list[dict]]:
    """(the default group's figures, one row per group size) from the worker's readings."""
    base, after_init, after_use = figures[:3]
    default = dict(init_gib=sig(after_init - base, 4), buffers_gib=sig(after_use - after_init, 4))
    rows, prev = [], after_use
    for i, size in enumerate(sizes):
        created, used = figures[3 + 2 * i], figures[4 + 2 * i]
        rows.append(dict(ranks=size, groups=groups, init_gib=sig(max(0.0, created - prev) / groups, 4),
                         buffers_gib=sig(max(0.0, used - created) / groups, 4)))
        prev = used
    return default, rows


def measure_nccl_memory(world: int, backend: str = "nccl", groups: int = NCCL_MEMORY_GROUPS,
                        timeout_s: float = NCCL_MEMORY_TIMEOUT_S, message_bytes: int = MESSAGE_BYTES) -> dict:
    """Spawn one process per GPU (or CPU rank with gloo); the NCCL part of the device_memory section."""
    os.environ.update(NCCL_ENV)
    sizes = ([world] if world > 1 else []) + [1]
    plan = dict(backend=backend, groups=groups, sizes=sizes, timeout_s=max(30, int(timeout_s / 2)),
                message_bytes=message_bytes)
    figures = spawn_ranks(_nccl_memory_worker, world, plan, timeout_s, "NCCL memory measurement",
                          "attune-nccl-memory-")
    default, rows = _rows(figures, sizes, groups)
    return dict(nccl=rows, nccl_default_group=default,
                nccl_how=HOW.format(groups=groups, mib=sig(message_bytes / 2 ** 20, 3)))
