"""Hardware profiler behind `tune profile`: measure a GPU machine's real rates, write a profile YAML.

The cost model executes FLOPs and bytes at rates measured here, on the GPU type it predicts for.
Run on a machine with NVIDIA GPUs (only torch, numpy, pyyaml and the standard library needed):

    PYTHONPATH=<repo root> python -m experiments.checks.hardware_profile [--model M] [--out FILE] [--quick]

GPU 0 in this process unless said otherwise; random normal data; CUDA-event timing after warm-up, each figure the
median of `repeats` samples of `inner` back-to-back calls (a sample >= ~1 ms; the L2 cache is not flushed).
`--only SECTIONS` measures some sections; `--update FILE` puts them into an existing profile. This module
orchestrates and writes the profile; each section is measured, and its figures defined, in its own module of
experiments.checks: profile_shapes (the grid), compute, memory, cpu_adam, collectives, device_memory (first, in
fresh processes, before this one touches a GPU; with runner_memory and nccl_memory), measure (timing).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.model_spec import ModelSpec, load_model
from experiments.checks.collectives import NCCL_ENV, measure_collectives
from experiments.checks.compute import (gdn_series, linear_attention_estimate, measure_attention, measure_gemm,
                                        measure_gemm_fp8, measure_grouped_gemm, measure_linear_attention)
from experiments.checks.cpu_adam import ADAM_NUMEL, measure_cpu_adam
from experiments.checks.device_memory import device_memory_section, measure_device_memory
from experiments.checks.measure import collapse_notes, load_torch, note_failure, sig, sync
from experiments.checks.memory import MEMORY_BYTES, measure_memory
from experiments.checks.nccl_memory import MESSAGE_BYTES, measure_nccl_memory
from experiments.checks.runner_memory import measure_runner_outside, probe_with_gdn
from experiments.checks.profile_shapes import (GEMM_M, GEMM_NK, MODEL_TOKENS, default_linear_attention_shape,
                                             profile_shapes, quick_shapes)

SCHEMA_VERSION = 1
NO_GPU_MESSAGE = "no CUDA GPU found: tune profile must run on a machine with NVIDIA GPUs"


class NoGpuError(AttuneError, RuntimeError):
    """No CUDA GPU (or no torch) on this machine."""


def gpu_type_from_name(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; unknown GPUs -> the sanitized device name."""
    low = name.lower()
    for key in ("gb200", "b200", "h200", "h100"):
        if re.search(rf"(?<![a-z0-9]){key}(?![0-9])", low):
            return key
    return re.sub(r"^nvidia-", "", re.sub(r"[^a-z0-9]+", "-", low).strip("-")) or "unknown"


def _progress(t0: float, text: str) -> None:
    print(f"[profile {time.perf_counter() - t0:7.1f} s] {text}", file=sys.stderr, flush=True)


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0].strip() or None
    except Exception:  # noqa: BLE001 - no nvidia-smi: the driver is simply unknown
        return None


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(v, int):  # older encoding: 21803 -> 2.18.3 (2.9+), 2708 -> 2.7.8
        base = 10000 if v >= 10000 else 1000
        return f"{v // base}.{v % base // 100}.{v % 100}"
    return ".".join(str(x) for x in tuple(v)[:3])


def _warm_up_clocks(device, seconds: float = 1.0) -> None:
    """Busy the GPU for ~a second so clocks ramp up before the first measurement."""
    torch = load_torch()
    n = 4096 if device.type == "cuda" else 64
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            torch.mm(a, a)
        sync(device)


def _conventions() -> list[str]:
    return [
        "timing: median of `repeats` samples (each >= ~1 ms of back-to-back calls) timed with CUDA events "
        "after warm-up; random normal data; L2 not flushed",
        "gemm_bf16: torch.mm(A[m,k], W[n,k].T), bf16; TFLOP/s = 2*m*n*k/time; the full grid m in "
        f"{list(GEMM_M)} x n, k in {list(GEMM_NK)}, then the model's forward GEMMs (m = tokens "
        f"{list(MODEL_TOKENS)}, n = output width, k = input width) off the grid, each with a `label`",
        "gemm_fp8: torch._scaled_mm e4m3 x e4m3, per-tensor fp32 scales, bf16 out, use_fast_accum=False",
        "grouped_gemm_bf16: torch._grouped_mm(X[E*rows,k], W[E,n,k].transpose(-2,-1), offs), equal rows per "
        "expert; fwd FLOPs = 2*E*rows*k*n; fwd_bwd_tflops = 3 x fwd FLOPs / time(fwd + bwd for X and W)",
        "attention_bf16: SDPA is_causal=True, batch 1, kv heads = heads; fwd FLOPs = 2*2*heads*seq^2*head_dim/2; "
        "fwd_bwd_tflops = 3 x fwd FLOPs / time(fwd+bwd) (the cost model's training = 3 x forward; kernels "
        "execute ~3.5 x forward)",
        "memory: GB/s = 1e9 B/s, pinned host buffers, 2 GiB (and 256 MiB) copies; hbm_copy_tb_s counts read + "
        "write of a 2 GiB device-to-device copy",
        "collectives: busbw_gb_s from batches of back-to-back calls between CUDA events (as nccl-tests); "
        "synced_busbw_gb_s from single calls timed by wall clock between device synchronisations; "
        "bf16 buffers, bytes = full buffer (all_gather output, reduce_scatter input); "
        "time = max over ranks of the per-rank median; algbw = bytes/time; busbw = algbw x factor "
        "(all_reduce 2(n-1)/n, all_gather/reduce_scatter/all_to_all (n-1)/n, p2p 1; p2p = rank 2i -> 2i+1); "
        "NCCL_NVLS_ENABLE=0",
    ]


SECTIONS = ("gemm_bf16", "gemm_fp8", "grouped_gemm_bf16", "attention_bf16", "linear_attention", "memory",
            "cpu_adam", "collectives", "device_memory")


class _Sections:
    """Runs the profile's sections one by one: progress lines, one failure never loses the others, and
    only the sections asked for (`only`; all by default) are measured."""

    def __init__(self, device, t0: float, notes: list, only=None, ahead=None):
        self.device, self.t0, self.notes, self.only, self.ahead = device, t0, notes, only, ahead

    def kernels_compiled(self) -> None:
        """Before the first section that runs fla's kernels: wait for those compiled ahead (`ahead`, a
        tilelang_ahead.CompileAhead), and note what they did."""
        if self.ahead is not None and self.ahead.results is None:
            _progress(self.t0, "fla's TileLang kernels compiled ahead: waiting for them ...")
            self.notes.append(self.ahead.note())
            _progress(self.t0, self.notes[-1])

    def wants(self, name: str) -> bool:
        return self.only is None or name in self.only

    def __call__(self, key: str | None, label: str, fn, default):
        if key is not None and not self.wants(key):
            return default
        torch = load_torch()
        _progress(self.t0, f"{label} ...")
        start = time.perf_counter()
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - one section failing must not lose the others
            note_failure(self.notes, f"{label} failed", e)
            result = default
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        _progress(self.t0, f"{label} done in {time.perf_counter() - start:.1f} s")
        return result


def _compute_sections(run: _Sections, shapes: dict, repeats: int, gpu_type: str, fp8: bool | None) -> dict:
    device, notes = run.device, run.notes
    torch = load_torch()
    out = dict(gemm_bf16=run("gemm_bf16", f"gemm_bf16 ({len(shapes['gemm'])} shapes)",
                             lambda: measure_gemm(shapes["gemm"], device, repeats, notes), []))
    if fp8 is None:
        fp8 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
    if fp8:
        out["gemm_fp8"] = run("gemm_fp8", f"gemm_fp8 ({len(shapes['gemm_fp8'])} shapes)",
                              lambda: measure_gemm_fp8(shapes["gemm_fp8"], device, repeats, notes), [])
    else:
        out["gemm_fp8"] = []
        notes.append("fp8_note: gemm_fp8 skipped: compute capability below 8.9 (no fp8 tensor cores)")
    out["grouped_gemm_bf16"] = run("grouped_gemm_bf16", f"grouped_gemm_bf16 ({len(shapes['grouped_gemm'])} points)",
                                   lambda: measure_grouped_gemm(shapes["grouped_gemm"], device, repeats, notes), [])
    out["attention_bf16"] = run("attention_bf16", f"attention_bf16 ({len(shapes['attention'])} points)",
                                lambda: measure_attention(shapes["attention"], device, repeats, notes), [])
    if shapes["linear_attention"] is None and run.only is None:
        out["linear_attention"] = dict(linear_attention_estimate(),
                                       note="not measured: the profiled model has no Gated DeltaNet layers (`tune "
                                            "profile` without --model, or with such a model, measures the kernel)")
    else:
        run.kernels_compiled()
        out["linear_attention"] = run("linear_attention", "linear_attention (fla Gated DeltaNet)",
                                      lambda: measure_linear_attention(
                                          shapes["linear_attention"] or default_linear_attention_shape(),
                                          repeats, gpu_type),
                                      linear_attention_estimate())
    return out


def _system_sections(run: _Sections, shapes: dict, repeats: int, world: int, backend: str,
                     memory_bytes: tuple[int, int], adam_numel: int, early_memory: dict | None) -> dict:
    """memory, cpu_adam, collectives, and device_memory (`early_memory`: its parts measured before this
    process touched a GPU, under "early" and "probe")."""
    device = run.device
    out = dict(memory=run("memory", "memory", lambda: measure_memory(device, repeats, memory_bytes), {}),
               cpu_adam=run("cpu_adam", "cpu_adam", lambda: measure_cpu_adam(repeats, adam_numel), {}))
    if world >= 2:
        ops, sizes = shapes["collectives"]["ops"], shapes["collectives"]["bytes"]
        out["collectives"] = run("collectives", f"collectives ({world} ranks, {len(ops) * len(sizes)} points)",
                                 lambda: measure_collectives(ops, sizes, world, repeats, backend), [])
    else:
        out["collectives"] = []
        run.notes.append("collectives skipped: only 1 GPU visible")
    cuda = device.type == "cuda"
    nccl = run("device_memory", f"device_memory: NCCL communicators ({world} rank(s))",
               lambda: measure_nccl_memory(world, backend, message_bytes=MESSAGE_BYTES if cuda else 2 ** 16), {})
    if run.wants("device_memory"):
        early = early_memory or {}
        out["device_memory"] = device_memory_section(early.get("early"), nccl, cuda, early.get("probe"))
    return out


@dataclass(frozen=True)
class ProfilePlan:
    """What one profile run measures and how: the shapes (profile_shapes), samples per point, the ranks and
    backend for collectives, the copy sizes and Adam size, fp8 (None: when the GPU has fp8 tensor cores),
    and `only` the sections asked for (SECTIONS names; None: all)."""
    shapes: dict
    repeats: int
    world: int
    backend: str = "nccl"
    memory_bytes: tuple[int, int] = MEMORY_BYTES
    adam_numel: int = ADAM_NUMEL
    fp8: bool | None = None
    only: list[str] | None = None


def _profile(device, plan: ProfilePlan, *, model_name: str | None = None, t0: float | None = None,
             early_memory: dict | None = None, ahead=None) -> dict:
    """Measure everything on `device` (and `plan.world` ranks for collectives); the profile dict.
    `early_memory`: _early_device_memory's parts, measured before anything touched the GPU; `ahead`: fla's
    kernels compiling in other processes (tilelang_ahead.CompileAhead), waited for before the GDN kernel."""
    shapes, repeats, world, only = plan.shapes, plan.repeats, plan.world, plan.only
    torch = load_torch()
    t0 = time.perf_counter() if t0 is None else t0
    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else "cpu"
    gpu_type = gpu_type_from_name(device_name)
    notes = _conventions()
    run = _Sections(device, t0, notes, only, ahead)
    if only is None or set(only) - {"device_memory", "linear_attention", "cpu_adam"}:
        run(None, "clock warm-up", lambda: _warm_up_clocks(device), None)
    compute = _compute_sections(run, shapes, repeats, gpu_type, plan.fp8)
    system = _system_sections(run, shapes, repeats, world, plan.backend, plan.memory_bytes, plan.adam_numel,
                              early_memory)
    measured = dict(schema_version=SCHEMA_VERSION, gpu_type=gpu_type, provenance="measured", device=device_name,
                    count=max(world, 1), driver=_driver_version() if cuda else None,
                    cuda=str(torch.version.cuda) if torch.version.cuda else None,
                    torch=str(torch.__version__),  # TorchVersion, a str subclass yaml.safe_dump refuses
                    nccl=_nccl_version(torch) if cuda else None,
                    date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                    wall_time_s=sig(time.perf_counter() - t0), model=model_name,
                    source=f"tune profile (experiments/checks/hardware_profile.py) on {socket.gethostname()}",
                    **compute, **system, notes=collapse_notes(notes))
    if "device_memory" in measured:
        measured["device_memory"]["date"] = measured["date"]
    if only is not None:
        measured = {k: v for k, v in measured.items() if k not in SECTIONS or k in only}
    return measured


def _early_device_memory(t0: float, world: int, gdn: bool = True) -> dict:
    """The device_memory parts measured in fresh processes before this one creates a CUDA context (a
    device-level reading would count it): capacity, context, workspaces, allocator reserve; then the
    megatron runner's own processes (experiments.checks.runner_memory; `gdn` False: its Gated DeltaNet layers
    replaced, for a profile of a model without them)."""
    _progress(t0, "device_memory: capacity, CUDA context, workspaces, allocator reserve ...")
    out = {"early": measure_device_memory()}
    gpus = "1 GPU" if world == 1 else f"1 and {world} GPUs"
    _progress(t0, f"device_memory: the megatron runner's processes on {gpus}"
                  f"{'' if gdn else ' (Gated DeltaNet layers replaced by full attention)'} ...")
    try:
        out["probe"] = measure_runner_outside(world, gdn=gdn)
    except Exception as e:  # noqa: BLE001 - the probe is one part; the others stand without it
        out["probe"] = {"runner_outside": [dict(error=f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")]}
    _progress(t0, "device_memory: first parts done")
    return out


def run_profile(model: ModelSpec | None = None, repeats: int = 10, quick: bool = False, only=None,
                gpu_shared=None, kernel_batches=(1,)) -> dict:
    """Profile the local GPUs (compute on GPU 0, collectives over all of them); the profile dict.

    Raises NoGpuError when torch or a CUDA GPU is missing. quick=True shrinks the grids (smoke run).
    `only`: the sections to measure (SECTIONS names); all by default. `gpu_shared()`: called once the parts that
    need the device to themselves (device-level memory readings) are done, before the timed sections (`tune
    profile --model` starts its builds' process there, to import while these run). `kernel_batches`: the batch
    sizes fla's Gated DeltaNet kernel will run at, here and in the builds that follow (their TileLang kernel is
    compiled ahead for each, beside the first sections: experiments.megatron.tilelang_ahead)."""
    t0 = time.perf_counter()
    for key, value in NCCL_ENV.items():  # forced, not setdefault: an inherited NCCL_NVLS_ENABLE=1 is wrong here
        os.environ[key] = value
    try:
        torch = load_torch()
    except ImportError:
        raise NoGpuError(NO_GPU_MESSAGE) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        available = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not available:
        raise NoGpuError(NO_GPU_MESSAGE)
    shapes = profile_shapes(model)
    if quick:
        shapes = quick_shapes(shapes)
        repeats = min(repeats, 5)
    ahead = _compile_ahead(shapes["linear_attention"], only, kernel_batches)
    try:
        early = None
        if only is None or "device_memory" in only:
            early = _early_device_memory(t0, torch.cuda.device_count(), probe_with_gdn(model))
        if gpu_shared is not None:
            gpu_shared()
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        torch.manual_seed(0)
        plan = ProfilePlan(shapes, max(1, repeats), torch.cuda.device_count(),
                           adam_numel=ADAM_NUMEL // 8 if quick else ADAM_NUMEL, only=only)
        return _profile(device, plan, model_name=model.name if model is not None else None, t0=t0,
                        early_memory=early, ahead=ahead)
    finally:
        if ahead is not None:
            ahead.close()


TILELANG_AHEAD_ENV = "ATTUNE_TILELANG_AHEAD"


def _compile_ahead(shape: dict | None, only, batches):
    """fla's TileLang kernel compiling for each of `batches` in processes of its own (tilelang_ahead), where the
    profile times the model's Gated DeltaNet kernel; None otherwise."""
    if shape is None or (only is not None and "linear_attention" not in only) or not batches:
        return None
    if os.environ.get(TILELANG_AHEAD_ENV, "1") == "0":   # the same profile without it, to time what it saves
        return None
    import importlib.util
    if importlib.util.find_spec("fla") is None or importlib.util.find_spec("tilelang") is None:
        return None
    from experiments.megatron.tilelang_ahead import CompileAhead, KernelShape
    (qk, v), = gdn_series(shape)
    return CompileAhead(KernelShape(qk, v, shape["key_head_dim"], shape["value_head_dim"]), batches)


def profile_target_problem(path) -> str | None:
    """Why `path` may not be replaced by a profile (None: it may): only a new name or an earlier profile (a YAML
    mapping with a gpu_type, however old its sections) is; never a link (the write would land where it points), a
    device, a FIFO, or another file."""
    path = Path(path)
    if path.is_symlink():
        return "is a symbolic link"
    if not path.exists():
        return None
    if not path.is_file():
        return "is not a regular file"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.stat().st_size < 16 << 20 else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = None
    if not (isinstance(data, dict) and "gpu_type" in data):
        return "is not a profile tune can read"
    return None


def check_profile_target(path) -> None:
    """ProfileError naming `path` where a profile may not replace it (profile_target_problem)."""
    from cost_model.profile import ProfileError

    problem = profile_target_problem(path)
    if problem:
        raise ProfileError(f"{path} {problem}: not replaced (remove it or give another --out)")


def write_profile(profile: dict, path) -> None:
    """Write the profile as YAML, atomically (a temp file in the same folder, synced, then os.replace), with the
    mode open() would give it (0666 less the umask: 0644 under umask 022), as recipes and reports are
    (recipes.files.write_atomic): a profile is meant to be shared, and mkstemp's 0600 would keep it private.
    A path a profile may not replace is refused (check_profile_target)."""
    path = Path(path)
    check_profile_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump(profile, fh, sort_keys=False, default_flow_style=None, width=120)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def summary(profile: dict) -> list[str]:
    """A few headline figures of a profile, one per line."""
    def find(rows, **want):
        return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)

    lines = [f"{profile['device']} x{profile['count']} ({profile['gpu_type']}), "
             f"torch {profile['torch']}, CUDA {profile['cuda']}, NCCL {profile['nccl']}"]
    gemm = profile.get("gemm_bf16")
    if gemm:
        big = find(gemm, m=8192, n=8192, k=8192)
        best = max(gemm, key=lambda r: r["tflops"])
        lines.append(f"bf16 GEMM: {big['tflops'] if big else 'n/a'} TFLOP/s at 8192^3, best {best['tflops']} "
                     f"at {best['m']}x{best['n']}x{best['k']}")
    if profile.get("gemm_fp8"):
        best = max(profile["gemm_fp8"], key=lambda r: r["tflops"])
        lines.append(f"fp8 GEMM: best {best['tflops']} TFLOP/s at {best['m']}x{best['n']}x{best['k']}")
    if profile.get("grouped_gemm_bf16"):
        best = max(profile["grouped_gemm_bf16"], key=lambda r: r["fwd_tflops"])
        best_fb = max(profile["grouped_gemm_bf16"], key=lambda r: r["fwd_bwd_tflops"] or 0)
        lines.append(f"grouped GEMM: best fwd {best['fwd_tflops']} TFLOP/s (E={best['experts']}, "
                     f"rows={best['rows_per_expert']}), best fwd+bwd {best_fb['fwd_bwd_tflops']}")
    if profile.get("attention_bf16"):
        best = max(profile["attention_bf16"], key=lambda r: r["fwd_bwd_tflops"] or 0)
        lines.append(f"attention: best fwd+bwd {best['fwd_bwd_tflops']} TFLOP/s (seq {best['seq']}, "
                     f"{best['heads']}x{best['head_dim']})")
    lines += _summary_linear_and_device(profile)
    for op in ("all_reduce", "all_to_all"):
        row = find(profile.get("collectives") or [], op=op, bytes=256 * 2 ** 20)
        if row:
            lines.append(f"{op} busbw at 256 MiB: {row['busbw_gb_s']} GB/s batched "
                         f"({row.get('synced_busbw_gb_s')} GB/s single synchronised calls)")
    mem = profile.get("memory")
    if mem:
        lines.append(f"H2D {mem.get('h2d_gb_s')} GB/s, D2H {mem.get('d2h_gb_s')} GB/s, "
                     f"HBM copy {mem.get('hbm_copy_tb_s')} TB/s")
    if profile.get("cpu_adam"):
        lines.append(f"CPU Adam: {profile['cpu_adam']['params_per_s']:.4g} params/s "
                     f"({profile['cpu_adam']['threads']} threads)")
    host = host_vs_shipped(profile)
    if host:
        lines.append(host)
    failures = [n for n in profile.get("notes") or [] if "Error" in n or "failed" in n]
    if failures:
        lines.append(f"{len(failures)} failure note(s); see notes")
    lines.append(f"wall time: {profile['wall_time_s']} s")
    return lines


def host_vs_shipped(profile: dict) -> str | None:
    """How fast this machine's host issued a layer's kernels against the host behind the GPU type's shipped profile:
    the host floors of the layer kinds both measured (runner_components' host-floor builds); None without them. The
    shipped profile prices every other user's host so (runner_host_launch_error_sd: hosts differ)."""
    from cost_model.profile import profile_from_dict, shipped_profile
    shipped = shipped_profile(profile.get("gpu_type", ""))
    if not profile.get("runner_components") or shipped is None or shipped.runner is None:
        return None
    try:
        here = profile_from_dict(profile, "this profile").runner
    except Exception:  # noqa: BLE001 - a headline line must not fail a profile already measured and written
        return None
    pairs = [(kind, floor.layer_s, theirs.layer_s) for kind, floor in sorted(here.host_floors.items())
             if not floor.borrowed and (theirs := shipped.runner.host_floors.get(kind)) is not None]
    if not pairs:
        return None
    ratio = math.exp(statistics.fmean(math.log(a / b) for _, a, b in pairs))
    each = "; ".join(f"{kind} {1e3 * a:.2f} vs {1e3 * b:.2f} ms a layer" for kind, a, b in pairs)
    return (f"host: issued a layer's kernels in x{ratio:.2f} the time of the host behind the shipped "
            f"{shipped.gpu_type} profile ({each}); predictions from this profile use this host's")


def _fla_tuning_note(tuning: dict | None) -> str:
    """How fla's kernels were configured in the kernel timing: the shipped autotune choices, or tuned here."""
    if not tuning:
        return ""
    if tuning.get("seeded"):
        return (f"; fla autotune: {tuning['seeded']} of {tuning.get('of')} shipped choices seeded from "
                f"{tuning.get('from')}")
    return f"; fla autotune: {tuning.get('why', 'tuned here')}"


def _summary_linear_and_device(profile: dict) -> list[str]:
    lines = []
    la = profile.get("linear_attention") or {}
    if la:
        measured = la.get("points") or []
        heads = max((p.get("qk_heads") for p in measured), default=None)   # the series the cost model reads
        points = ", ".join(f"{p['tokens']}: {p['fwd_ms']}/{p['fwd_bwd_ms']} ms" for p in measured
                           if p.get("qk_heads") == heads)
        lines.append(f"linear attention: {la.get('kind')}, efficiency {la.get('efficiency')}"
                     + (f"; fla {la.get('fla')}, fwd/fwd+bwd {points}" if points else "")
                     + (f"; {la['backend_problem']}" if la.get("backend_problem") else "")
                     + _fla_tuning_note(la.get("tuning")))
    dm = profile.get("device_memory") or {}
    if dm.get("visible_gib") is not None:
        nccl = ", ".join(f"{r['ranks']} rank(s) {r['init_gib']} + {r['buffers_gib']} GiB" for r in dm.get("nccl") or [])
        lines.append(f"device memory: visible {dm['visible_gib']} GiB, context + workspaces {dm.get('context_gib')} GiB, "
                     f"allocator reserve {(dm.get('allocator_reserve') or {}).get('fraction')}, NCCL per "
                     f"communicator (init + buffers) {nccl or 'n/a'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.checks.hardware_profile",
        description="Measure this machine's GPUs (GEMM, grouped GEMM, attention, memory, collectives) "
                    "and write a hardware profile YAML for the cost model.")
    parser.add_argument("--model", help="catalog name or config.json path: adds the model's own shapes")
    parser.add_argument("--out", help="output YAML (default: profile-<gpu_type>.yaml)")
    parser.add_argument("--quick", action="store_true", help="small grids: a smoke run")
    parser.add_argument("--repeats", type=int, default=10, help="timed samples per point (median)")
    parser.add_argument("--only", help=f"comma-separated sections to measure ({', '.join(SECTIONS)})")
    parser.add_argument("--update", help="an existing profile YAML whose sections the measured ones replace (the "
                                         "rest is kept); written to --out, by default back to this file")
    args = parser.parse_args(argv)
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    unknown = sorted(set(only or ()) - set(SECTIONS))
    try:
        if unknown:
            raise ValueError(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
        model = load_model(args.model) if args.model else None
        existing = yaml.safe_load(Path(args.update).read_text()) if args.update else None
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"error: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 2
    try:
        profile = run_profile(model, repeats=args.repeats, quick=args.quick, only=only)
    except NoGpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if existing is not None:
        profile = merge_sections(existing, profile)
    report_written(profile, args.out or args.update)
    return 0


def merge_sections(existing: dict, measured: dict) -> dict:
    """`existing` with the sections `measured` holds replaced, and a note saying which and when."""
    out = dict(existing)
    replaced = [k for k in SECTIONS if k in measured]
    out.update({k: measured[k] for k in replaced})
    notes = list(existing.get("notes") or [])
    notes.append(f"sections {', '.join(replaced)} re-measured {measured.get('date')} on {measured.get('device')} "
                 f"(torch {measured.get('torch')}, CUDA {measured.get('cuda')}, NCCL {measured.get('nccl')})")
    out["notes"] = notes
    return out


def report_written(profile: dict, out: str | None) -> Path:
    """Write the profile (default profile-<gpu>.yaml) and print its headline figures."""
    path = Path(out or f"profile-{profile['gpu_type']}.yaml")
    n = 2
    while out is None and profile_target_problem(path):   # the default name is taken: a measurement is not lost
        path, n = Path(f"profile-{profile['gpu_type']}-{n}.yaml"), n + 1
    write_profile(profile, path)
    for line in summary(profile):
        print(line)
    print(f"profile written to {path}")
    return path


if __name__ == "__main__":
    sys.exit(main())
