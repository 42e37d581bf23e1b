"""fla's TileLang backward kernel, compiled ahead in parallel processes that never touch the GPU.

On Hopper fla 0.6.0 runs its Gated DeltaNet backward's chunk_bwd_dqkwg in TileLang (fla #640). TileLang compiles
that kernel per batch size (the sequence length is dynamic, the batch is not), about 10 s each through nvcc on the
hosts measured, one after the other inside whichever process first runs the shape: on a machine where no GDN kernel
ran, `tune profile` of a GDN model spent about 40 of its 214 s there (batch 1 in the kernel section, 2, 4 and 8 in
the first GDN build). TileLang keeps what it compiles on disk (~/.tilelang/cache, keyed by the kernel's program and
the target), so a kernel compiled in another process is loaded, not compiled, by the process that runs it.

`CompileAhead` starts one process per batch size at the start of the profile, at the lowest CPU priority. Each
calls fla's own chunk_bwd_dqkwg_tilelang on meta tensors of the layer's shapes, so fla derives the kernel's
parameters as it will when it runs; the kernel is built (compiled, or found on disk) and the launch that would
follow is skipped. No CUDA context is created: the device is asked only its name and capability, so the
device-level memory readings that run beside them are not moved (each process reports whether its device's
primary context became active, read through the driver). Anything else (no fla or TileLang, TileLang not the
backend fla will use, an fla without this kernel) ends the process with the reason; the run then compiles as
before.

    python -m experiments.megatron.tilelang_ahead --batch B --qk-heads H --v-heads HV --key-dim K --value-dim V
prints one JSON object: what was compiled, in how many seconds, or why nothing was.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from experiments.checks.runner_components import set_priority

MODULE = "fla.ops.common.backends.tilelang.chunk_bwd"
BUILDER = "_build_chunk_bwd_dqkwg_kernel"
SEQ_LEN = 4096   # any length: TileLang's T is dynamic; a multiple of fla's chunk of 64
CHUNK = 64


@dataclass(frozen=True)
class KernelShape:
    """The Gated DeltaNet kernel's heads and head dims as the layer calls it (q/k repeated to the value heads in
    megatron-core's GatedDeltaNet, so qk_heads == v_heads there)."""
    qk_heads: int
    v_heads: int
    key_head_dim: int
    value_head_dim: int

    def __post_init__(self):
        for name in ("qk_heads", "v_heads", "key_head_dim", "value_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.v_heads % self.qk_heads:
            raise ValueError(f"v_heads {self.v_heads} is not a multiple of qk_heads {self.qk_heads}")

    def argv(self) -> list[str]:
        return ["--qk-heads", str(self.qk_heads), "--v-heads", str(self.v_heads),
                "--key-dim", str(self.key_head_dim), "--value-dim", str(self.value_head_dim)]


class _Built(Exception):
    """Raised after the kernel is built, in place of its launch on meta tensors."""


def primary_context_active(device: int = 0) -> bool | None:
    """Whether `device`'s primary CUDA context is active in this process (cuDevicePrimaryCtxGetState); None when
    the driver cannot be asked. Asking creates no context."""
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        handle, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(handle), device):
            return None
        if cuda.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)):
            return None
        return bool(active.value)
    except (OSError, AttributeError):
        return None


def _tilelang_in_use(torch) -> str | None:
    """None when fla will run chunk_bwd_dqkwg in TileLang here, else why not (FLA_TILELANG set as the profile and
    the runner set it: "1" on Hopper unless the user set it)."""
    import importlib.util
    for package in ("fla", "tilelang"):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not importable"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability(0)[0] == 9:
        os.environ.setdefault("FLA_TILELANG", "1")
    from experiments.megatron.gdn import fla_backends
    common = fla_backends().get("common", [])
    return None if "tilelang" in common else f"fla's chunk kernels run {common}, not TileLang"


def compile_kernel(batch: int, shape: KernelShape) -> dict:
    """Build fla's TileLang chunk_bwd_dqkwg for `batch` rows of `shape` (compiled, or loaded from TileLang's disk
    cache), skipping its launch; what happened, as a dict."""
    started = time.perf_counter()
    out = {"batch": batch, **vars(shape)}
    import importlib

    import torch
    why = _tilelang_in_use(torch)
    if why is not None:
        return {**out, "skipped": why}
    try:
        module = importlib.import_module(MODULE)
        build = getattr(module, BUILDER)
    except (ImportError, AttributeError) as e:
        return {**out, "skipped": f"this fla has no {MODULE}.{BUILDER} ({type(e).__name__})"}

    def build_only(*args, **kwargs):
        build(*args, **kwargs)
        raise _Built

    h, hv, k, v = shape.qk_heads, shape.v_heads, shape.key_head_dim, shape.value_head_dim
    bf16 = dict(device="meta", dtype=torch.bfloat16)
    states = torch.empty(batch, SEQ_LEN // CHUNK, hv, k, v, **bf16)
    tensors = dict(q=torch.empty(batch, SEQ_LEN, h, k, **bf16), k=torch.empty(batch, SEQ_LEN, h, k, **bf16),
                   v=torch.empty(batch, SEQ_LEN, hv, v, **bf16), do=torch.empty(batch, SEQ_LEN, hv, v, **bf16),
                   h=states, dh=torch.empty_like(states), w=torch.empty(batch, SEQ_LEN, hv, k, **bf16),
                   g=torch.empty(batch, SEQ_LEN, hv, device="meta", dtype=torch.float32),
                   dv=torch.empty(batch, SEQ_LEN, hv, v, **bf16))
    setattr(module, BUILDER, build_only)
    try:   # what fla's gated delta rule backward passes: gated (g), with w and dv, states [K, V], chunks of 64
        module.chunk_bwd_dqkwg_tilelang(**tensors, chunk_size=CHUNK)
    except _Built:
        return {**out, "built_s": round(time.perf_counter() - started, 1), "context": primary_context_active()}
    except Exception as e:  # noqa: BLE001 - reported; the run compiles it as before
        return {**out, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    finally:
        setattr(module, BUILDER, build)
    return {**out, "error": "fla returned without building the kernel"}


class CompileAhead:
    """One compiling process per batch size, started now (`start`), at the lowest CPU priority so that the timed
    sections beside them keep the host's cores; `wait` collects what each did."""

    def __init__(self, shape: KernelShape, batches, env: dict | None = None):
        self.shape, self.batches, self.started = shape, sorted(set(batches)), time.perf_counter()
        self.results: list[dict] | None = None
        argv = [sys.executable, "-m", __name__] + shape.argv()
        self.procs = [subprocess.Popen(argv + ["--batch", str(b)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, env=env) for b in self.batches]

    def wait(self, timeout_s: float = 180.0) -> list[dict]:
        """Each process's report, waiting at most `timeout_s` in all; a process still compiling then is stopped
        (the run compiles that kernel itself) and reported as such."""
        if self.results is not None:
            return self.results
        deadline, results = time.monotonic() + timeout_s, []
        for batch, proc in zip(self.batches, self.procs):
            try:
                text, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                results.append(_report(text, batch, proc.returncode))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                results.append({"batch": batch, "error": f"still compiling after {timeout_s:.0f} s: stopped"})
        self.results = results
        self.waited_s = round(time.perf_counter() - self.started, 1)
        return results

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def note(self) -> str:
        """One line on what was compiled ahead (after `wait`)."""
        results = self.wait()
        built = [r for r in results if "built_s" in r]
        other = [r for r in results if "built_s" not in r]
        text = (f"tilelang_ahead: fla's TileLang chunk_bwd_dqkwg built ahead for batch "
                f"{', '.join(str(r['batch']) for r in built) or 'none'} in {len(self.procs)} parallel processes "
                f"(their longest {max((r['built_s'] for r in built), default=0)} s; done {self.waited_s} s after "
                f"they started)")
        if any(r.get("context") for r in built):
            text += "; a CUDA context became active in one of them"
        reasons = sorted({r.get("skipped") or r.get("error") or "no report" for r in other})
        return text + (f"; not built: {'; '.join(reasons)}" if reasons else "")


def _report(text: str, batch: int, returncode: int | None) -> dict:
    lines = [line for line in (text or "").splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"batch": batch, "error": f"no report (exit code {returncode})"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, required=True)
    for name in ("qk-heads", "v-heads", "key-dim", "value-dim"):
        p.add_argument(f"--{name}", type=int, required=True)
    args = p.parse_args(argv)
    set_priority(19)   # before its imports: the profile's timed sections run beside it
    try:
        shape = KernelShape(args.qk_heads, args.v_heads, args.key_dim, args.value_dim)
        if args.batch < 1:
            raise ValueError(f"batch must be positive, got {args.batch}")
    except ValueError as e:
        print(f"tilelang_ahead: {e}", file=sys.stderr)
        return 2
    print(json.dumps(compile_kernel(args.batch, shape)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
