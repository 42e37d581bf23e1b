"""Measure what the megatron runner's step is made of, on this GPU, with the runner's own code.

`tune profile --model M` (or `python -m experiments.checks.runner_components --model M --out FILE`) builds
the runner's GPTModel (experiments.megatron.train_loop: megatron-core, torch-native kernels, megatron's DDP
with fp32 gradient buffers, its distributed optimizer) on GPU 0, in one process while the GPU has room for the
memory megatron keeps of earlier builds (then a fresh one: HELD_FRACTION), for each layer kind of
the model, with 1 and 2 layers of that kind and a small vocabulary, and times at 1, 2, 4, 8, 16 rows of
`seq_len` tokens per micro-batch (1-8 with Gated DeltaNet, whose TileLang kernels compile per shape):

- the forward-backward of `microbatches` micro-batches through megatron's schedule (gradient accumulation
  into the fp32 buffers by megatron's hooks included), with and without full recompute;
- the per-step work: zeroing the gradient buffers and the optimizer step (grad norm, clip, Adam, the copy
  back to bf16);
- once with the model's real vocabulary, for the embedding, LM head and cross-entropy of a micro-batch;
- for a dense, MoE or Gated DeltaNet MoE layer kind, 1 and 4 layers of it at the host-floor shape (hidden 256,
  expert width 64: too small for its GPU work to show; experts, top-k and heads kept), the host's time to issue
  its kernels.

The cost model takes differences: one layer = (2 layers - 1 layer), the micro-batch's ends = (1 layer - one
layer), the optimizer per parameter = the slope between the builds' parameter counts. Nothing is fitted to
training runs. CPU Adam (torch's AdamW on the CPU, what megatron's HybridDeviceOptimizer steps there when the
optimizer is offloaded) is timed with 1, 2 and 4 processes at once (ranks sharing a host).

Each point is the median of `repeats` steps after a warm-up step; a build or point that runs out of memory
is recorded as such and the larger points of that build are skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from experiments.checks.device_tensors import drop_graphs, held_tensors, hollow_out

ROWS = (1, 2, 4, 8, 16)
SEQ_LEN = 4096
MICROBATCHES = 4  # enough that the first micro-batch and the flush are a small share, as in a real step
REPEATS = 3
SMALL_VOCAB = 1024


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def layer_kinds(model) -> list[tuple[str, str]]:
    """The (attention kind, MLP kind) pairs of the model's layers, in first-seen order."""
    out = []
    for kind in zip(model.layer_types, model.mlp_types):
        if kind not in out:
            out.append(kind)
    return out


def kind_model(model, kind: tuple[str, str], layers: int, vocab: int | None):
    """`model` with `layers` layers all of `kind`, no MTP, and (when given) another vocabulary size."""
    attn, mlp = kind
    changes = dict(num_hidden_layers=layers, layer_types=(attn,) * layers, mlp_types=(mlp,) * layers,
                   num_nextn_predict_layers=0, name=f"{model.name}[{attn}+{mlp} x{layers}]")
    if vocab is not None:
        changes["vocab_size"] = vocab
    return replace(model, **changes)


# A layer too small for its GPU work to show at the profile's token counts: its time is the host's issuing its
# kernels. Only widths shrink: the kernels stay the model's (its norms, gates and attention core; a MoE layer's
# experts and top-k, which set its dispatch and grouped GEMMs; a Gated DeltaNet layer's heads, whose TileLang
# kernels compile per shape).
HOST_FLOOR_DIMS = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, intermediate_size=512)
HOST_FLOOR_DENSE_HEAD_DIM = 128
HOST_FLOOR_EXPERT_DIM = 64
# The kinds `tune profile` measures a host floor for (the rest: `--kind K --host-floor` on its own).
HOST_FLOOR_KINDS = {("full_attention", "dense"), ("full_attention", "moe"), ("linear_attention", "moe"),
                    ("linear_attention", "dense")}
HOST_FLOOR_ROWS = (1, 2, 4)


def host_floor_model(model):
    """`model` at the host-floor shape (HOST_FLOOR_DIMS; a dense model's head dimension 128, a MoE model's expert
    widths HOST_FLOOR_EXPERT_DIM), named as such."""
    dims = dict(HOST_FLOOR_DIMS)
    if not model.is_moe:
        dims["head_dim"] = HOST_FLOOR_DENSE_HEAD_DIM
    else:
        dims["moe_intermediate_size"] = HOST_FLOOR_EXPERT_DIM
        if model.shared_expert_intermediate_size:
            dims["shared_expert_intermediate_size"] = HOST_FLOOR_EXPERT_DIM * max(model.num_shared_experts, 1)
    return replace(model, **dims, name=f"{model.name}-host-floor")


class Bench:
    """One process on GPU 0: megatron's parallel state for 1 GPU, then builds and timings."""

    def __init__(self, seq_len: int, microbatches: int, repeats: int, log):
        import torch
        import torch.distributed as dist

        from cost_model.nouns.layout import Layout
        from experiments.megatron import torch_native as tnb
        from experiments.megatron.train_loop import _init_parallel

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        self.seq_len, self.microbatches, self.repeats, self.log = seq_len, microbatches, repeats, log
        self.device = torch.cuda.get_device_name(0)
        _init_parallel(0, 1, {"layout": Layout(1), "seed": 0, "nccl_timeout_s": 600}, 0)
        self.backend, self.backend_reason = tnb.resolve_backend("auto")
        self.torch, self.dist = torch, dist
        self.fla = None

    def build(self, model, layout, offload: bool = False):
        from cost_model.nouns.workload import Workload
        from experiments.megatron.config import build_transformer_config
        from experiments.megatron.train_loop import _build_model, build_optimizer

        self.release()
        _clear_moe_tracker()
        if offload:
            layout = replace(layout, optimizer_offload_fraction=1.0)
        workload = Workload(seq_len=self.seq_len, global_batch=self.microbatches, framework="megatron")
        config = build_transformer_config(model, layout, workload, backend=self.backend)
        job = {"model": model, "layout": layout, "workload": workload, "seed": 0}
        chunks, _info, n_params = _build_model(job, config, self.backend)
        optimizer, _note = build_optimizer(chunks, layout, 1e-5)
        from megatron.core.distributed import finalize_model_grads
        config.grad_scale_func = optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
        return config, chunks, optimizer, n_params

    def step_times(self, model, config, chunks, optimizer, rows: int, full_recompute: bool) -> dict:
        """Median seconds of (zero grads, forward-backward of the micro-batches, optimizer step)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from experiments.megatron.data import StepBatches
        from experiments.megatron.train_loop import forward_step

        torch = self.torch
        config.recompute_granularity = "full" if full_recompute else None
        config.recompute_method = "uniform" if full_recompute else None
        config.recompute_num_layers = 1 if full_recompute else None
        batches = StepBatches(global_batch=rows * self.microbatches, dp=1, dp_rank=0, rows_per_microbatch=rows,
                              seq_len=self.seq_len, vocab=model.vocab_size, seed=0)
        fwd_bwd = get_forward_backward_func()
        model_chunk = chunks[0]
        samples = []
        for i in range(1 + self.repeats):
            micro = batches(i)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model_chunk.zero_grad_buffer()
            optimizer.zero_grad()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            fwd_bwd(forward_step_func=forward_step, data_iterator=iter(micro), model=model_chunk,
                    num_microbatches=self.microbatches, seq_length=self.seq_len, micro_batch_size=rows,
                    decoder_seq_length=self.seq_len, forward_only=False)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            optimizer.step()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            if i:
                samples.append((t1 - t0, t2 - t1, t3 - t2))
        config.recompute_granularity = config.recompute_method = config.recompute_num_layers = None
        zero, fb, opt = (statistics.median(s[j] for s in samples) for j in range(3))
        return {"zero_grad_s": zero, "fwd_bwd_s": fb, "optimizer_s": opt,
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2 ** 30}

    def release(self):
        import gc
        gc.collect()
        self.torch.cuda.empty_cache()
        self.torch.cuda.reset_peak_memory_stats()


def _clear_moe_tracker() -> None:
    """megatron keeps its MoE aux-loss tracker in a global sized by the first model's layers."""
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
        getattr(get_moe_metrics_tracker(), "metrics", {}).clear()
    except ImportError:
        pass


def _is_oom(err: BaseException) -> bool:
    return "out of memory" in str(err).lower() or type(err).__name__ == "OutOfMemoryError"


def measure_build(bench: Bench, model, kind, layers: int, vocab: int | None, rows_list, recompute: bool,
                  offload: bool = False) -> dict:
    from cost_model.nouns.layout import Layout

    m = kind_model(model, kind, layers, vocab)
    entry = {"kind": list(kind), "layers": layers, "vocab": m.vocab_size, "offload": offload, "points": []}
    t0 = time.perf_counter()
    try:
        config, chunks, optimizer, n_params = bench.build(m, Layout(1, max_tokens_per_gpu=bench.seq_len), offload)
    except Exception as e:  # noqa: BLE001 - recorded, the profile goes on
        entry["error"] = f"build: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        bench.release()
        return entry
    entry["params"] = n_params
    entry["build_s"] = round(time.perf_counter() - t0, 2)
    out_of_memory = False
    for rows in rows_list:
        for full in ((False, True) if recompute else (False,)):
            point = {"rows": rows, "tokens": rows * bench.seq_len, "full_recompute": full}
            try:
                point.update(bench.step_times(m, config, chunks, optimizer, rows, full))
                bench.log(f"  {m.name} vocab {m.vocab_size} rows {rows} full={full}: fb {point['fwd_bwd_s']*1e3:.1f} "
                          f"ms opt {point['optimizer_s']*1e3:.1f} ms peak {point['peak_allocated_gib']:.1f} GiB")
            except Exception as e:  # noqa: BLE001 - recorded, the profile goes on
                out_of_memory = _is_oom(e)
                point["error"] = ("out of memory" if out_of_memory else
                                  f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
                config.recompute_granularity = config.recompute_method = config.recompute_num_layers = None
                bench.torch.cuda.empty_cache()
            entry["points"].append(point)
            if out_of_memory:
                break
        if out_of_memory:
            break
    entry["optimizer_kind"] = type(getattr(optimizer, "optimizer", optimizer)).__name__
    try:   # the dispatchers' graph references go (the cycle that kept every MoE build), then any storage left
        dropped = drop_graphs(chunks, optimizer, config)
        if dropped:
            entry["graphs_dropped"] = sorted(set(dropped))
        entry["hollowed_gib"] = round(hollow_out(chunks, optimizer, config) / 2 ** 30, 2)
    except Exception as e:  # noqa: BLE001 - the build is measured; what is held is then handled by HELD_FRACTION
        entry["hollow_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del config, chunks, optimizer
    bench.release()
    return entry


def _cpu_adam_worker(n_params: int, threads: int, steps: int, go, queue, nice: bool) -> None:
    """One rank's CPU Adam: set up once (torch imported, the moments' pages touched), then a timed round of
    `steps` steps for each item `go` gives, until None. `nice`: set up at the lowest CPU priority (started ahead,
    beside the profile's timed sections), back to the usual one where allowed once set up."""
    if nice:
        set_priority(19)
    import torch
    torch.set_num_threads(threads)
    params = [torch.zeros(n_params // 8, requires_grad=True) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    # megatron's HybridDeviceOptimizer steps its CPU share with torch's AdamW(fused=True) (optimizer/__init__.py)
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    for _ in range(2):   # first touch of the moments' pages (a VM's memory grows on demand) before timing
        opt.step()
    queue.put("ready")
    if nice:   # set up; it waits idle until timed, so the usual priority costs nothing beside the builds
        set_priority(0)
    while go.get() is not None:
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.step()
        queue.put(n_params * steps / (time.perf_counter() - t0))


def set_priority(value: int) -> None:
    """This process's CPU priority, where the host allows it (lowering the nice value back needs privilege)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)
    except (OSError, AttributeError):
        pass


class CpuAdamWorkers:
    """The CPU Adam processes `cpu_adam_ranks` times: they start once (each start imports torch: seconds on a small
    host) and step together `r` at a time while the others wait. `nice`: started ahead, beside the profile's timed
    sections (`start_builds_ahead`), set up at the lowest CPU priority; `rates` waits until all are set up."""

    def __init__(self, threads: int, count: int = 4, n_params: int = 32 * 2 ** 20, steps: int = 3,
                 nice: bool = False):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.threads, self.queue, self.ready = threads, ctx.Queue(), 0
        self.gos = [ctx.Queue() for _ in range(count)]
        self.procs = [ctx.Process(target=_cpu_adam_worker, args=(n_params, threads, steps, go, self.queue, nice),
                                  daemon=True) for go in self.gos]
        for p in self.procs:
            p.start()

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until every process is set up (none then takes the host's cores from what runs next)."""
        while self.ready < len(self.procs):
            self.queue.get(timeout=timeout_s)
            self.ready += 1

    def rates(self, ranks=(1, 2, 4)) -> list[dict]:
        """Parameters per second per process, `r` processes stepping at once, for each `r` of `ranks`."""
        self.wait_ready()
        out = []
        for r in ranks:
            for go in self.gos[:r]:
                go.put(r)
            rates = [self.queue.get(timeout=300) for _ in range(r)]
            out.append({"ranks": r, "threads_per_rank": self.threads,
                        "params_per_s_per_rank": statistics.median(rates)})
        return out

    def close(self) -> None:
        """Ends them: those set up when told to, any still setting up (a profile that ended early) at once."""
        for go in self.gos:
            go.put(None)
        for p in self.procs:
            p.join(timeout=30 if self.ready == len(self.procs) else 0)
            if p.is_alive():
                p.terminate()
                p.join(timeout=30)
        self.procs, self.gos = [], []


def cpu_adam_ranks(threads: int, ranks=(1, 2, 4), n_params: int = 32 * 2 ** 20, steps: int = 3,
                   workers: CpuAdamWorkers | None = None) -> list[dict]:
    """torch.optim.AdamW(fused=True) on CPU (what megatron's HybridDeviceOptimizer runs there), in `r` processes at once
    with `threads` threads each: parameters per second per process (CpuAdamWorkers; `workers`: ones started
    ahead, with at least max(ranks) processes)."""
    workers = workers or CpuAdamWorkers(threads, max(ranks), n_params, steps)
    try:
        return workers.rates(ranks)
    finally:
        workers.close()


# A released MoE build stayed allocated (measured in one process on 2026-12-02 and 2026-12-04): megatron's token
# dispatcher keeps the last forward's routing probabilities with their graph, a cycle through autograd's C++ nodes
# that the collector cannot see (device_tensors). A released build's graph references are dropped and its tensors
# hollowed out, and what still stays is logged with its holder. Held memory does not change a point's timing, so
# the builds share a process (one start, about 30 s: imports, NCCL) until more than HELD_FRACTION of the device is
# held; a build that runs out of memory while earlier builds hold some is measured again in a fresh process, so
# what is held never costs a point.
HELD_FRACTION = 0.5
EXIT_LEAKED = 75
HELD_REPORT_BYTES = 2 ** 30


def build_rows(model, extra: str) -> tuple[int, ...]:
    """The rows per micro-batch a planned build times (`extra`: its flags, space-separated): one offloaded point,
    the host floor's rows, else ROWS (1-8 with Gated DeltaNet, whose TileLang kernels compile per shape)."""
    flags = extra.split()
    if "--offload" in flags:
        return (1,)
    if "--host-floor" in flags:
        return HOST_FLOOR_ROWS
    return ROWS[:4] if model.has_linear_attention else ROWS


def gdn_kernel_batches(model) -> tuple[int, ...]:
    """The batch sizes (rows per micro-batch) at which `tune profile`'s builds run `model`'s Gated DeltaNet
    layers; () for a model without them."""
    rows = {r for kind, _layers, extra in build_plan(model) if kind[0] == "linear_attention"
            for r in build_rows(model, extra)}
    return tuple(sorted(rows))


def run_builds(args, plan: list[tuple[tuple[str, str], int, str]], rows_for) -> int:
    """The builds of `plan` in this process, each appended as a JSON line to --out when it ends (measured or
    failed); returns EXIT_LEAKED, leaving the rest to a fresh process, once the memory earlier builds hold passes
    HELD_FRACTION of the device, or before recording a build that ran out of memory beside it."""
    from cost_model.nouns.model_spec import load_model
    from cost_model.runner_components import layer_signature

    log = lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)  # noqa: E731
    base = load_model(args.model[0])
    bench = Bench(args.seq_len, args.microbatches, args.repeats, log)
    if base.has_linear_attention:
        from experiments.megatron import gdn
        bench.fla = gdn.configure_fla(0)
    cuda = bench.torch.cuda
    baseline, total = cuda.memory_allocated(), cuda.get_device_properties(0).total_memory
    try:
        for i, (kind, layers, extra) in enumerate(plan):
            flags = set(extra.split())
            model = host_floor_model(base) if "--host-floor" in flags else base
            started, held_before = time.perf_counter(), cuda.memory_allocated() - baseline
            entry = measure_build(bench, model, kind, layers, None if "--real-vocab" in flags else SMALL_VOCAB,
                                  rows_for(extra), recompute=not flags & {"--real-vocab", "--offload"},
                                  offload="--offload" in flags)
            errors = [entry.get("error", "")] + [p.get("error", "") for p in entry["points"]]
            out_of_memory = any("out of memory" in e for e in errors)
            if out_of_memory and held_before > 0.02 * total:
                log(f"  out of memory with {held_before / 2 ** 30:.1f} GiB held from earlier builds: measured again "
                    "in a fresh process")
                return EXIT_LEAKED
            held = cuda.memory_allocated() - baseline
            if held - held_before > HELD_REPORT_BYTES:   # name the holder, to be fixed where it is
                try:   # a diagnosis: it never costs the profile a build
                    entry["held_by"] = held_tensors(top=3)
                except Exception as e:  # noqa: BLE001
                    entry["held_by"] = [{"error": f"{type(e).__name__}: {str(e)[:200]}"}]
                log(f"  {(held - held_before) / 2 ** 30:.1f} GiB stayed allocated after this build; largest: "
                    + "; ".join(h.get("error") or
                                f"{h['gib']} GiB {h['dtype']}{h['shape']} held by {' <- '.join(h['held_by'])}"
                                for h in entry["held_by"]))
            # peak_allocated_gib of a point counts what earlier builds hold (held_before_gib)
            entry.update(model=model.name, signature=layer_signature(model, *kind), seq_len=args.seq_len,
                         microbatches=args.microbatches, repeats=args.repeats, device=bench.device, date=_now(),
                         wall_s=round(time.perf_counter() - started, 1),
                         held_before_gib=round(held_before / 2 ** 30, 2), held_after_gib=round(held / 2 ** 30, 2),
                         **({"host_floor": True} if "--host-floor" in flags else {}))
            _append(Path(args.out), entry)
            # another failure (an illegal memory access, a device-side assert) may have broken this process's CUDA
            # context; memory held past HELD_FRACTION leaves too little for the next build
            why = ("failed" if any(e and "out of memory" not in e for e in errors) else
                   f"{held / 2 ** 30:.1f} GiB held after this build" if held > HELD_FRACTION * total else None)
            if why and i + 1 < len(plan):
                log(f"  {why}: the next builds run in a fresh process")
                return EXIT_LEAKED
        return 0
    finally:
        bench.dist.destroy_process_group()
        if base.has_linear_attention:   # with ATTUNE_FLA_TUNING_RECORD set (device scripts): after the teardown
            from experiments.megatron import fla_tuning
            fla_tuning.record()


def import_ahead() -> None:
    """What a builds process imports before its first build (torch, megatron-core, the runner), without creating
    a CUDA context: a process started ahead waits beside the profile's microbenchmarks and its device-level memory
    readings (the NCCL part), holding no device memory, and imports at the lowest CPU priority, so that the
    host-timed sections beside it (CPU Adam) keep the host's cores. fla is left to the build: its import asks the
    device's name."""
    import importlib

    set_priority(19)
    for name in ("torch", "megatron.core", "megatron.core.distributed", "megatron.core.pipeline_parallel",
                 "experiments.megatron.train_loop", "experiments.megatron.config", "experiments.megatron.data",
                 "experiments.megatron.torch_native", "cost_model.runner_components"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass    # the build that needs it says so
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():   # a diagnosis: the readings beside it would count it
        print("runner_components: CUDA was initialised by an import ahead of the builds", file=sys.stderr)


def one_build(args) -> int:
    """`--kind K`: one build in this process at --rows, appended as a JSON line to --out."""
    extra = " ".join(f for f, on in (("--real-vocab", args.real_vocab), ("--offload", args.offload),
                                     ("--host-floor", args.host_floor)) if on)
    rows = tuple(int(r) for r in args.rows.split(","))
    return run_builds(args, [(tuple(args.kind.split("+")), args.layers, extra)], lambda _extra: rows)


def _append(path: Path, entry: dict) -> None:
    """One JSON line; after a line a killed process left unfinished, on a line of its own."""
    with open(path, "a+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell():
            f.seek(f.tell() - 1)
            if f.read(1) != "\n":
                f.write("\n")
        f.write(json.dumps(entry) + "\n")


def _lines(path: Path) -> int:
    """Build records written whole (a line a killed process left unfinished is not one)."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines(keepends=True) if line.endswith("\n") and _parses(line))


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def read_builds(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if _parses(line)] if path.exists() else []


def _plan_json(plan) -> str:
    return json.dumps([["+".join(k), n, e] for k, n, e in plan])


def _builds_argv(name: str, out: Path, plan_arg: str, argv_tail: list[str]) -> list[str]:
    return [sys.executable, "-m", "experiments.checks.runner_components", "--model", name, "--out", str(out),
            "--plan", plan_arg] + argv_tail


class BuildsAhead:
    """A builds process started ahead (`--plan -`): it imports torch, megatron-core and the runner while the
    profile's timed sections run, touching no GPU, then waits on its stdin for the plan. Its start (about half a
    minute on the hosts measured) then overlaps the microbenchmarks instead of following them."""

    def __init__(self, name: str, out: Path, argv_tail: list[str], env: dict):
        import subprocess
        import tempfile

        self.name, self.out, self.argv_tail = name, out, argv_tail
        self.cpu_adam: CpuAdamWorkers | None = None   # the CPU Adam processes, where started with it
        self.err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(_builds_argv(name, out, "-", argv_tail), env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=self.err, text=True)

    def send(self, plan) -> bool:
        """Hand it the plan; False when it is gone (then a fresh process runs the plan)."""
        try:
            self.proc.stdin.write(_plan_json(plan) + "\n")
            self.proc.stdin.close()
            return True
        except (BrokenPipeError, OSError, ValueError):
            self.close()
            return False

    def close(self) -> None:
        """Stop it, and the CPU Adam processes, if they still run (an interrupted profile leaves nothing waiting or
        on the GPU)."""
        if self.cpu_adam is not None:
            self.cpu_adam.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def run_plan(name: str, plan, out: Path, argv_tail: list[str], env: dict, timeout_s: float, log,
             ahead: BuildsAhead | None = None) -> None:
    """`plan`'s builds in as few processes as their memory allows (run_builds): a process that ends (memory held,
    a failed build, a crash) or measures nothing for `timeout_s` leaves the rest to a fresh one; a build a process
    ended on without recording it (a crash, a timeout) is skipped and said so. `ahead`: a process started ahead
    for this model and `out`, which runs the first of them."""
    import subprocess
    import tempfile

    done = 0
    while done < len(plan):
        rest = plan[done:]
        before = _lines(out)
        if ahead is not None and ahead.send(rest):
            proc, err = ahead.proc, ahead.err
        else:
            err = tempfile.TemporaryFile("w+")
            proc = subprocess.Popen(_builds_argv(name, out, _plan_json(rest), argv_tail), env=env,
                                    stdout=subprocess.DEVNULL, stderr=err)
        ahead = None
        with err:
            seen, last, timed_out = before, time.perf_counter(), False
            try:
                while proc.poll() is None:
                    time.sleep(0.5)
                    if (n := _lines(out)) != seen:
                        seen, last = n, time.perf_counter()
                    elif time.perf_counter() - last > timeout_s:
                        proc.kill()
                        proc.wait()
                        timed_out = True
            finally:   # an interrupted profile leaves no build running on the GPU
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            err.seek(0)
            tail = [line for line in err.read().splitlines() if line.strip()][-1:]
        finished = _lines(out) - before
        label = lambda b: " ".join([f"{name}: {'+'.join(b[0])} x{b[1]}", b[2]]).rstrip()  # noqa: E731
        for b in rest[:finished]:
            log(label(b))
        # a fresh process is asked for after a build it recorded: one that asks having recorded none is a crash
        if finished < len(rest) and (proc.returncode != EXIT_LEAKED or finished == 0):
            why = f"timed out after {timeout_s:.0f} s" if timed_out else f"its process ended ({proc.returncode})"
            log(f"{label(rest[finished])} not measured: {why}" + (f": {tail[0][:200]}" if tail else ""))
            finished += 1
        elif finished < len(rest):
            log(f"{name}: the {len(rest) - finished} builds left run in a fresh process")
        done += finished


# Fields of a measured point the cost model reads (cost_model.runner_components).
POINT_FIELDS = ("tokens", "full_recompute", "zero_grad_s", "fwd_bwd_s", "optimizer_s")


def section_from_builds(builds: list[dict], meta: dict) -> dict:
    """The profile's runner_components section from one-build records (`one_build`'s JSON lines): the
    builds that measured something, with the fields the cost model reads, and what ran where. The hidden size is
    read from the layer's signature: a config.json model's name is not a catalog key."""
    from cost_model.runner_components import signature_dims

    out = []
    for b in builds:
        points = [{k: p[k] for k in POINT_FIELDS} for p in b.get("points", []) if "error" not in p]
        if not points or "params" not in b:
            continue
        out.append({"model": b["model"], "signature": b["signature"], "kind": b["kind"], "layers": b["layers"],
                    "vocab": b["vocab"], "hidden_size": int(signature_dims(b["signature"])["hidden_size"]), "params": b["params"],
                    "microbatches": b.get("microbatches", meta.get("microbatches", MICROBATCHES)),
                    **({"offload": 1.0} if b.get("offload") else {}),
                    **({"host_floor": True} if b.get("host_floor") else {}), "points": points,
                    # where a profile's minutes go (a first Gated DeltaNet build compiles its kernels)
                    **{k: b[k] for k in ("build_s", "wall_s") if k in b}})
    return {"provenance": "measured", **meta, "builds": out}


# On the H200 hosts measured: a process's start (imports, NCCL) and a build's model build and points.
PROCESS_S, BUILD_S = 30, 8


def build_plan(model) -> list[tuple[tuple[str, str], int, str]]:
    """The builds `tune profile` runs for `model`, in order: (layer kind, layers, extra flag)."""
    kinds = layer_kinds(model)
    return ([(k, n, "") for k in kinds for n in (1, 2)] + [(kinds[0], 1, "--real-vocab"), (kinds[0], 2, "--offload")]
            + [(k, n, "--host-floor") for k in kinds if k in HOST_FLOOR_KINDS for n in (1, 4)])


def build_env() -> dict:
    """The environment of a build's process: the runner's (one NCCL setting, no torch.compile, expandable segments),
    with Triton's autotuning kept on disk (the profile's kernel timings tuned the same shapes)."""
    from experiments.checks.compute import TRITON_AUTOTUNE_CACHE

    return {**TRITON_AUTOTUNE_CACHE, **os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"),
            "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCHDYNAMO_DISABLE": "1",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def builds_argv_tail(seq_len: int = SEQ_LEN, repeats: int = REPEATS, microbatches: int = MICROBATCHES) -> list[str]:
    return ["--seq-len", str(seq_len), "--repeats", str(repeats), "--microbatches", str(microbatches)]


def start_builds_ahead(model: str, out: Path) -> BuildsAhead:
    """`tune profile --model`'s builds process, started while the profile's timed sections run (BuildsAhead),
    with measure_models' defaults; its builds are appended to `out`. The CPU Adam processes start with it (their
    imports, seconds on a small host, then overlap the microbenchmarks too)."""
    env = build_env()
    ahead = BuildsAhead(model, out, builds_argv_tail(), env)
    ahead.cpu_adam = CpuAdamWorkers(int(env["OMP_NUM_THREADS"]), nice=True)
    return ahead


def measure_models(models: list[str], *, seq_len: int = SEQ_LEN, repeats: int = REPEATS, log=print,
                   timeout_s: float = 300.0, microbatches: int = MICROBATCHES, cpu_adam: bool = True,
                   ahead: BuildsAhead | None = None) -> dict:
    """Every build of every model (run_plan: one process while the GPU has room), then CPU Adam; the
    runner_components section. `ahead`: a builds process started ahead (start_builds_ahead) for the first model,
    with these settings; its `out` is where the builds go."""
    import tempfile

    import torch

    from cost_model.nouns.model_spec import load_model

    started = time.perf_counter()
    env = build_env()
    tail = builds_argv_tail(seq_len, repeats, microbatches)
    if ahead is not None and (ahead.name != models[0] or ahead.argv_tail != tail):
        ahead.close()
        ahead = None
    workers = ahead.cpu_adam if ahead is not None and cpu_adam else None
    if workers is not None:   # set up before the builds time the host
        try:
            workers.wait_ready()
        except Exception:  # noqa: BLE001 - a process that never got ready: fresh ones are started after the builds
            workers.close()
            workers = None
    with tempfile.TemporaryDirectory() as tmp:
        out = ahead.out if ahead is not None else Path(tmp) / "builds.jsonl"
        for name in models:
            plan = build_plan(load_model(name))
            log(f"{name}: {len(plan)} builds, in one process while the GPU has room (about "
                f"{(PROCESS_S * (ahead is None) + BUILD_S * len(plan)) / 60:.1f} min on an H200 host"
                f"{', its process started ahead' if ahead is not None else ''}; a first Gated DeltaNet build "
                f"compiles its kernels, minutes more)")
            run_plan(name, plan, out, tail, env, timeout_s, log, ahead=ahead)
            ahead = None
        builds = read_builds(out)
    import megatron.core
    meta = {"how": __doc__.split("\n\n")[1].replace("\n", " "), "device": torch.cuda.get_device_name(0),
            "torch": str(torch.__version__), "megatron_core": str(getattr(megatron.core, "__version__", "?")),
            "seq_len": seq_len, "microbatches": microbatches, "repeats": repeats, "date": _now()[:10]}
    if cpu_adam:
        meta["cpu_adam_ranks"] = cpu_adam_ranks(int(env["OMP_NUM_THREADS"]), workers=workers)
    section = section_from_builds(builds, meta)
    section["wall_s"] = round(time.perf_counter() - started, 1)
    return section


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.checks.runner_components", description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True, help="catalog name or config.json (repeatable)")
    p.add_argument("--out", required=True, help="profile YAML to put the runner_components section into "
                                                "(with --kind: a JSONL file a build record is appended to)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--kind", help="one build only, in this process: ATTN+MLP (e.g. full_attention+moe)")
    p.add_argument("--layers", type=int, default=1, help="with --kind: layers of that kind")
    p.add_argument("--plan", help="builds in this process: JSON [[ATTN+MLP, layers, extra flag], ...] (what "
                                  "`tune profile` runs; exits 75 when the rest need a fresh process)")
    p.add_argument("--real-vocab", action="store_true", help="with --kind: the model's own vocabulary")
    p.add_argument("--offload", action="store_true", help="with --kind: the whole optimizer offloaded to the CPU")
    p.add_argument("--microbatches", type=int, default=MICROBATCHES, help="micro-batches per timed step")
    p.add_argument("--host-floor", action="store_true",
                   help="with --kind: the model at the host-floor shape (the kind's layer, dense or MoE, too small "
                        "for its GPU work to show), the build marked as the kind's host floor")
    args = p.parse_args(argv)
    if args.kind:
        return one_build(args)
    if args.plan:
        from cost_model.nouns.model_spec import load_model
        model = load_model(args.model[0])
        text = args.plan
        if text == "-":     # started ahead: import now, touching no GPU, then wait for the plan
            import_ahead()
            text = sys.stdin.readline()
            if not text.strip():
                return 0    # the profile ended without builds
            set_priority(0)   # the builds time the host: back to the usual priority where allowed
        plan = [(tuple(k.split("+")), int(n), e) for k, n, e in json.loads(text)]
        return run_builds(args, plan, lambda extra: build_rows(model, extra))
    import yaml

    log = lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)  # noqa: E731
    section = measure_models(args.model, seq_len=args.seq_len, repeats=args.repeats, log=log)
    path = Path(args.out)
    data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    data["runner_components"] = section
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=120, default_flow_style=None))
    log(f"wrote {path} ({section['wall_s']} s, {len(section['builds'])} builds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
