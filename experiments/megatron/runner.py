"""MegatronRunner: plan a trial on the CPU, run it on the local GPUs, summarise what the ranks measured.

See the package docstring (experiments/megatron/__init__.py) for what a trial runs and records.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

from cost_model import metrics
from cost_model.nouns.batching import rows_per_microbatch
from cost_model.nouns.case import Case
from cost_model.constants import default_constants
from cost_model.nouns.hardware import GpuSpec, HardwareError, load_gpu
from cost_model.nouns.layout import InvalidLayout
from cost_model.nouns.model_spec import LINEAR_ATTENTION, ModelError
from cost_model.nouns.stack import Stack
from experiments.megatron.backend_support import microbatch_refusal
from experiments.megatron.launch import STARTUP_GRACE_S, free_port, ray_available, run_job
from experiments.megatron.model_run import auto_layers, predict_run, trial_model, trial_model_notes
from experiments.runner import TrialResult, TrialRunner, TrialSpec

RUNNER_NAME = "megatron"
DEFAULT_LR = 1e-5
DEFAULT_SEED = 1234
# How much slower than the cost model's (tuned Megatron + TE) step a torch-native run is assumed to be
# when sizing the global batch to the time budget (a guess; the measured step time is what counts).
BUDGET_SLOWDOWN = {"te": 1.5, "torch-native": 3.0, "local": 8.0, "auto": 3.0}
STARTUP_ALLOWANCE_S = 35.0  # torch + megatron import, NCCL init, model build, first step warm-up


# ================================================================================ this machine
def visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


def detect_gpu() -> GpuSpec | None:
    """The catalog GPU matching the first GPU's name: nvidia-smi, else torch in a short-lived
    subprocess (no CUDA context in this process, which spawns the workers)."""
    name = ""
    exe = shutil.which("nvidia-smi")
    try:
        if exe:
            name = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=30).stdout
        if not name.strip():
            name = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                                  capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return gpu_from_name(name)


def gpu_from_name(name: str) -> GpuSpec | None:
    first = (name.strip().splitlines() or [""])[0].upper()
    for key in ("gb200", "b200", "h200", "h100"):
        if key.upper() in first:
            try:
                return load_gpu(key)
            except HardwareError:
                return None
    return None


def _window(steps: int, window: tuple[int, int] | None) -> tuple[int, int]:
    """Inclusive 0-based step window; the default skips two warm-up steps (2..N-1)."""
    if window is not None and 0 <= window[0] <= window[1] < steps:
        return window
    return (min(2, steps - 1), steps - 1)


def port_taken(out: dict) -> bool:
    """A failed launch whose only problem was the rendezvous port: EADDRINUSE before any training step."""
    text = " ".join(str(e) for e in out.get("errors", [])) + " " + str(out.get("detail", ""))
    return out.get("status") != "ok" and "EADDRINUSE" in text and not out.get("ranks")


def _worker_env(torch_compile: bool, case: Case | None = None) -> tuple[dict, dict]:
    """(the workers' environment, where its allocator setting came from). Set before the workers start,
    hence before CUDA initialises in them."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NCCL_NVLS_ENABLE": "0",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")}
    if not torch_compile:
        env["TORCHDYNAMO_DISABLE"] = "1"  # megatron's jit_fuser (torch.compile) functions run eagerly
    sources = {}
    conf, sources["PYTORCH_CUDA_ALLOC_CONF"] = allocator_conf(case)
    if conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    return env, sources


def allocator_conf(case: Case | None) -> tuple[str | None, str]:
    """(PYTORCH_CUDA_ALLOC_CONF for the workers, where it comes from): the user's, when set in this
    environment; else what slime's recipe for the layout sets (recipes.slime_command.slime_env), the
    one place that value is written."""
    user = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if user is not None:
        return user, "user: PYTORCH_CUDA_ALLOC_CONF was set in the runner's environment"
    if case is None:
        return None, "none: no case to take the recipe's environment from"
    from recipes.slime_command import slime_env

    conf = slime_env(case.layout, case.gpu).get("PYTORCH_CUDA_ALLOC_CONF")
    if conf is None:
        return None, "none: the recipe's environment sets none"
    return conf, "recipe: recipes.slime_command.slime_env (what slime's recipes run with)"


def detect_stack(backend: str = "auto") -> Stack:
    """What the megatron runner can run in this Python, found without importing torch: DeepEP for the
    flex dispatcher; Transformer Engine for the precision-aware optimizer (TE's FusedAdam: without it
    bf16 moments are not applied, train_loop.build_optimizer) and for CP (torch-native and local refuse
    CP > 1, torch_native.unsupported); no MLA (not wired, ibid.); fla for the Gated DeltaNet kernels
    (without it megatron's torch rule runs); optimizer offload through megatron's HybridDeviceOptimizer."""
    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    te = found("transformer_engine")
    return Stack(deepep=found("deep_ep"), transformer_engine=te, precision_aware_optimizer=te,
                 context_parallel=te and backend in ("auto", "te"), mla=False, gdn_kernels=found("fla"),
                 optimizer_offload=True, frameworks=("megatron",), dynamic_batching=False,
                 source=f"the megatron runner, backend {backend}, in {sys.executable}")


# ================================================================================ the runner
@dataclass
class MegatronRunner(TrialRunner):
    """Runs a trial on the local GPUs with megatron-core (see the package docstring).

    layers: None -> the largest count the cost model predicts to fit; replace_gdn: Gated DeltaNet
    layers become full attention (only when asked: by default they are megatron's GatedDeltaNet)."""

    layers: int | None = None
    replace_gdn: bool = False
    backend: str = "auto"
    launcher: str = "auto"          # auto: mp; "ray" only when asked for and importable
    timeout_s: float = 300.0
    hang_timeout_s: float = 120.0   # silence allowed once training steps run
    startup_grace_s: float = STARTUP_GRACE_S  # silence allowed before the first step (loading takes minutes)
    nccl_timeout_s: float | None = None   # None: hang_timeout_s - 15 (>= 30), so a stuck collective reports first
    seed: int = DEFAULT_SEED
    lr: float = DEFAULT_LR
    rows_file: str | None = None
    cpu_init: bool = False          # same initial weights whatever the layout (for convergence arms)
    sdpa_backend: str = "auto"      # torch-native attention kernel (torch_native.SDPA_BACKENDS)
    log_dir: str | None = None
    torch_compile: bool = False
    scale_batch_to_budget: bool = True
    name: str = field(default=RUNNER_NAME, init=False)
    truncates_layers = True     # TrialRunner's declarations (class attributes, not fields)
    prices_own_run = True

    # ------------------------------------------------------------------ what it runs, what it predicts
    @property
    def stack(self) -> Stack:
        return detect_stack(self.backend)

    def model_run(self, model):
        """The model a trial trains: the first `layers` layers (GDN replaced when asked). With layers
        None the runner picks the count per layout (auto_layers), so this is the whole model."""
        return trial_model(model, self.layers, self.replace_gdn)

    def predict(self, case: Case, profile=None):
        """The runner's own prediction (predict_run: no precision-aware optimizer without TE) for its
        model run at the case's global batch; InvalidLayout when PP x VPP does not divide its layers or the global
        batch does not split into its micro-batches."""
        run = self.model_run(case.model)
        layout = case.layout
        _check_split(run, layout)
        refusal = microbatch_refusal(layout, case.workload.global_batch)   # what the trial would refuse at set-up
        if refusal:
            raise InvalidLayout(f"the megatron runner cannot split the global batch: {refusal}")
        run_case = case.replace(model=run, workload=replace(case.workload, framework="megatron"))
        if profile is None:
            return predict_run(run_case)
        from cost_model.predict import predict

        return predict(run, case.gpu, run_case.workload, layout, profile=profile,
                       precision_aware_optimizer=importlib.util.find_spec("transformer_engine") is not None)

    # ------------------------------------------------------------------ plan (CPU only)
    def plan(self, spec: TrialSpec) -> dict:
        """Everything decided before spawning: the model run, the global batch, the prediction for
        the model run, the notes. Raises InvalidLayout/ValueError for configurations that cannot run."""
        run, how, notes = self._model_run(spec)
        unit = _batch_unit(spec.case, notes)
        gb = spec.case.workload.global_batch
        prediction = _prediction(spec.case, run, gb)
        if self.scale_batch_to_budget and "step_time_s" in prediction:
            new = self._rows_in_budget(spec, prediction, unit)
            if new < gb:
                slow = BUDGET_SLOWDOWN.get(self.backend, 3.0)
                notes.append(f"global batch scaled down from {gb} to {new} rows to fit the {self.timeout_s:.0f} s "
                             f"budget ({spec.steps} steps, predicted {prediction['step_time_s']:.2f} s/step x {slow})")
                gb = new
                prediction = _prediction(spec.case, run, gb)
        return {"model": run, "layers_how": how, "global_batch": gb, "notes": notes, "prediction": prediction}

    def _model_run(self, spec: TrialSpec):
        """(the model run, how its layer count was chosen, notes on what differs from the catalog model)."""
        layout = spec.case.layout
        if self.layers is None:
            n, how = auto_layers(spec.case, self.replace_gdn)
        else:
            n, how = self.layers, "--layers"
        run = trial_model(spec.case.model, n, self.replace_gdn)
        notes = trial_model_notes(spec.case.model, run, how)
        _check_split(run, layout)
        return run, how, notes

    def _rows_in_budget(self, spec: TrialSpec, prediction: dict, unit: int) -> int:
        """The largest global batch (a multiple of `unit`) whose steps fit the trial's time budget at
        the predicted step time, slowed down for this backend."""
        gb = spec.case.workload.global_batch
        per_row = prediction["step_time_s"] * BUDGET_SLOWDOWN.get(self.backend, 3.0) / gb
        budget = max(1.0, self.timeout_s - STARTUP_ALLOWANCE_S)
        fit_rows = int(budget / max(spec.steps, 1) / per_row) if per_row > 0 else gb
        return max(unit, (fit_rows // unit) * unit)

    # ------------------------------------------------------------------ run
    def run(self, spec: TrialSpec) -> TrialResult:
        layout = spec.case.layout
        t0 = time.time()
        try:
            plan = self.plan(spec)
        except (InvalidLayout, ValueError, NotImplementedError, ModelError) as e:
            return self._failed("invalid_config", str(e), spec)
        visible = visible_gpus()
        if visible < layout.world_size:
            return self._failed("invalid_config", f"needs {layout.world_size} GPU(s), {visible} visible", spec, plan)
        launcher = self._launcher(plan)
        log_dir = self.log_dir or tempfile.mkdtemp(prefix="attune-megatron-")
        window = _window(spec.steps, spec.window)
        out = self._launch(spec, plan, log_dir, launcher)
        wall = time.time() - t0
        if out["status"] != "ok":
            extras = self._extras(spec, plan, launcher, log_dir, window)
            extras["errors"] = out.get("errors", [])
            extras["progress"] = out.get("progress", {})
            extras.update(_oom_details(extras["errors"]))
            return self._result(status="failed", source=self._source(None, spec, launcher),
                                failure_class=out["failure_class"], detail_text=out["detail"], extras=extras,
                                gpu_hours=metrics.gpu_hours(layout.world_size, wall))
        return self._summarize(spec, plan, out["ranks"], launcher, log_dir, window, wall)

    def _launcher(self, plan: dict) -> str:
        launcher = "mp" if self.launcher == "auto" else self.launcher
        if launcher == "ray" and not ray_available():
            launcher = "mp"
            plan["notes"].append("launcher: ray requested but not importable; torch.multiprocessing spawn used")
        return launcher

    def _launch(self, spec: TrialSpec, plan: dict, log_dir: str, launcher: str) -> dict:
        """Run the job; once more on a fresh port when the rendezvous port was taken between `free_port`
        picking it and rank 0 binding it (seen on H200: EADDRINUSE at init, no step run)."""
        out = {}
        for _ in range(2):
            out = run_job(self._job(spec, plan, log_dir), spec.case.layout.world_size, launcher, self.timeout_s,
                          self.hang_timeout_s, startup_grace_s=self.startup_grace_s)
            if not port_taken(out):
                break
        return out

    def _job(self, spec: TrialSpec, plan: dict, log_dir: str) -> dict:
        """What every worker gets (pickled to it): the model run, the layout, the data and the limits."""
        env, plan["env_sources"] = _worker_env(self.torch_compile, spec.case)
        plan["env"] = {k: v for k, v in env.items() if k != "MASTER_PORT"}
        return {"model": plan["model"], "layout": spec.case.layout, "workload": spec.case.workload,
                "steps": spec.steps, "global_batch": plan["global_batch"], "seed": self.seed, "lr": self.lr,
                "backend": self.backend, "rows_file": self.rows_file, "cpu_init": self.cpu_init,
                "sdpa_backend": self.sdpa_backend, "log_dir": log_dir, "env": env,
                "nccl_timeout_s": self.nccl_timeout_s or max(30.0, self.hang_timeout_s - 15.0)}

    # ------------------------------------------------------------------ results
    def _source(self, ranks: dict | None, spec: TrialSpec, launcher: str) -> str:
        if not ranks:
            return (f"megatron-core runner ({launcher}) on {spec.case.gpu.display_name} "
                    f"x{spec.case.layout.world_size}, backend {self.backend}")
        r0 = ranks[min(ranks)]
        kern = r0.get("kernels", {})
        kernels = ", ".join(f"{k} {v}" for k, v in kern.items() if k in ("experts", "attention", "linear_attention"))
        return (f"megatron-core {r0.get('megatron_core')} runner on {r0.get('gpu_name')} x{spec.case.layout.world_size}, "
                f"backend {r0.get('backend')}, kernels {kernels}")

    def _extras(self, spec: TrialSpec, plan: dict | None, launcher: str, log_dir: str | None, window) -> dict:
        extras = {"runner": RUNNER_NAME, "launcher": launcher, "layout": spec.case.layout.long_label,
                  "steps_requested": spec.steps, "window": list(window), "log_dir": log_dir}
        if plan:
            m = plan["model"]
            extras.update({"model_run": {"name": m.name, "layers": m.num_hidden_layers,
                                         "layer_types": sorted(set(m.layer_types)), "how": plan["layers_how"]},
                           "global_batch_rows": plan["global_batch"], "seq_len": spec.case.workload.seq_len,
                           "notes": plan["notes"], "prediction_for_model_run": plan["prediction"]})
            if "env" in plan:
                extras.update(env=plan["env"], env_sources=plan["env_sources"])
        return extras

    def _failed(self, cls: str, text: str, spec: TrialSpec, plan: dict | None = None) -> TrialResult:
        return self._result(status="failed", source=self._source(None, spec, self.launcher), failure_class=cls,
                            detail_text=text, extras=self._extras(spec, plan, self.launcher, None,
                                                                  _window(spec.steps, spec.window)))

    def _result(self, *, status: str, source: str, detail_text: str = "", extras: dict | None = None, **kw) -> TrialResult:
        details = json.loads(json.dumps(extras or {}, default=str))  # JSON values only, as stored
        return TrialResult(status=status, kind="measured", source=source, detail=detail_text, runner=RUNNER_NAME,
                           details=details, **kw)

    def _summarize(self, spec: TrialSpec, plan: dict, ranks: dict, launcher: str, log_dir: str, window, wall: float):
        layout, workload, gpu = spec.case.layout, spec.case.workload, spec.case.gpu
        step_times, losses, grad_norms = _per_step(ranks)
        n = len(step_times)
        notes = list(plan["notes"])
        if n < spec.steps:
            notes.append(f"stopped after {n} of {spec.steps} steps (time budget)")
        if n <= window[0]:
            # Only warm-up steps ran (compilation, allocator growth): their time is not the layout's throughput.
            extras = self._extras(spec, plan, launcher, log_dir, window)
            extras.update({"notes": notes, "step_times_s": step_times, "steps_run": n, "trial_wall_s": round(wall, 1)})
            return self._result(status="failed", source=self._source(ranks, spec, launcher), failure_class="too_few_steps",
                                detail_text=f"stopped after {n} of {spec.steps} steps (time budget), before the timing "
                                            f"window {window[0]}-{window[1]}: only warm-up steps ran, nothing measured",
                                extras=extras, gpu_hours=metrics.gpu_hours(layout.world_size, wall))
        w1 = min(window[1], n - 1)
        w0 = min(window[0], w1)
        win = step_times[w0:w1 + 1]
        mean = sum(win) / len(win)
        tps = plan["global_batch"] * workload.seq_len * len(win) / sum(win) / layout.world_size
        cv = (statistics.pstdev(win) / mean * 100) if len(win) > 1 else None
        r0 = ranks[min(ranks)]
        peak, allocated, memory = _memory_summary(ranks)
        extras = self._extras(spec, plan, launcher, log_dir, (w0, w1))
        kernels = _kernels(r0, plan["model"], self.replace_gdn)
        if plan["model"].count(LINEAR_ATTENTION):
            notes.append(f"gdn kernel: {kernels['linear_attention']}")
        extras.update({
            "notes": notes, "backend": r0["backend"], "backend_reason": r0["backend_reason"],
            "kernels": kernels, "kernels_ran": r0["kernels_ran"], "optimizer": r0["optimizer"],
            "grad_norms": grad_norms, "num_microbatches": r0["num_microbatches"], **memory,
            "params_per_rank": [ranks[r]["params_local"] for r in sorted(ranks)],
            "torch": r0["torch"], "megatron_core": r0["megatron_core"], "gpu_name": r0["gpu_name"],
            "trial_wall_s": round(wall, 1), "steps_run": n,
        })
        extras.update({k: r0[k] for k in ("env_seen", "fla", "fla_dispatch") if r0.get(k) is not None})
        return self._result(
            status="ok", source=self._source(ranks, spec, launcher), extras=extras,
            tokens_per_s_per_gpu=tps, step_time_s=mean, peak_memory_gib=peak, peak_memory_gib_per_rank=allocated,
            mfu=metrics.format_mfu(plan["model"].params.active_non_embedding, tps, gpu),
            usd_per_million_tokens=metrics.usd_per_million_tokens(gpu.usd_per_gpu_hour, tps),
            step_times_s=tuple(step_times), losses=tuple(losses), step_time_cv_percent=cv,
            gpu_hours=metrics.gpu_hours(layout.world_size, wall))


DEVICE_BASIS = "device (cuda mem_get_info)"
ALLOCATOR_BASIS = "allocator (max_memory_allocated)"


def _memory_summary(ranks: dict) -> tuple[float, tuple, dict]:
    """(the trial's peak memory: the largest device-level peak over the ranks when every rank measured
    one, else the largest allocator peak; max_memory_allocated by rank; the memory details)."""
    mem = {r: ranks[r]["memory_gib"] for r in sorted(ranks)}
    allocated = tuple(round(m["peak_allocated"], 2) for m in mem.values())
    device = [m.get("device_peak") for m in mem.values()]
    measured = all(d is not None for d in device)
    peak = max(device) if measured else max(m["peak_allocated"] for m in mem.values())
    details = {
        "memory_gib_per_rank": {str(r): {k: round(v, 2) for k, v in m.items()} for r, m in mem.items()},
        "max_memory_allocated_gib_per_rank": list(allocated),
        "peak_memory_basis": DEVICE_BASIS if measured else ALLOCATOR_BASIS}
    churn = {str(r): ranks[r]["allocator_churn"] for r in sorted(ranks) if ranks[r].get("allocator_churn")}
    if churn:   # per step from step 2 on (see experiments/megatron/memory.py churn_report)
        details["allocator_churn_per_rank"] = churn
    return peak, allocated, details


def _kernels(r0: dict, run, replaced: bool) -> dict:
    """The kernels a rank reported, with what ran for the linear-attention layers."""
    kernels = dict(r0["kernels"])
    if "linear_attention" not in kernels:
        kernels["linear_attention"] = ("none: Gated DeltaNet layers replaced by full attention (replace_gdn)"
                                       if replaced and "gdn->full" in run.name else
                                       "none: no Gated DeltaNet layer in the model run")
    return kernels


def _oom_details(errors: list[dict]) -> dict:
    """A CUDA OOM's figures per rank: PyTorch's message parsed, and what the rank said about its memory."""
    from experiments.megatron.memory import parse_oom

    per_rank, memory = {}, {}
    for e in errors:
        if e.get("failure_class") != "cuda_oom":
            continue
        figures = parse_oom(str(e.get("message") or ""))
        if figures:
            per_rank[str(e.get("rank"))] = figures
        if e.get("memory_gib"):
            memory[str(e.get("rank"))] = e["memory_gib"]
    out = {}
    if per_rank:
        out["oom_per_rank"] = per_rank
    if memory:
        out["memory_gib_per_rank_at_failure"] = memory
    return out


def _batch_unit(case: Case, notes: list[str]) -> int:
    """The rows the global batch must be a multiple of (DP x rows per micro-batch, x PP for the
    interleaved schedule); raises InvalidLayout when the case's global batch is not, or the
    dispatcher cannot run here."""
    layout, workload = case.layout, case.workload
    expected = rows_per_microbatch(layout.max_tokens_per_gpu, layout.cp, workload.seq_len)
    if layout.rows_per_microbatch != expected:
        notes.append(f"rows_per_microbatch {layout.rows_per_microbatch} differs from slime's max_tokens_per_gpu "
                     f"rule ({expected}); ran {layout.rows_per_microbatch} rows per micro-batch")
    if layout.dispatcher == "flex":
        import importlib.util
        if importlib.util.find_spec("deep_ep") is None:
            raise InvalidLayout("the flex dispatcher needs DeepEP, which is not importable here "
                                "(megatron: 'DeepEP is not installed', token_dispatcher.py _DeepepManager)")
    refusal = microbatch_refusal(layout, workload.global_batch)
    if refusal:
        raise InvalidLayout(refusal)
    unit = layout.dp * layout.rows_per_microbatch
    if layout.vpp > 1:
        unit *= layout.pp  # the interleaved schedule wants the micro-batch count a multiple of PP
    return unit


def _prediction(case: Case, run, rows: int) -> dict:
    """The cost model's figures for the model run at a global batch of `rows` rows (or the error)."""
    try:
        p = predict_run(case.replace(model=run, workload=replace(case.workload, global_batch=rows,
                                                                  framework="megatron")))
    except Exception as e:  # noqa: BLE001 - a prediction is a courtesy, not a requirement
        return {"error": f"{type(e).__name__}: {e}"}
    c = default_constants()
    return {"fits": p.fits, "fit_verdict": p.fit_verdict, "fit_probability": round(p.fit_probability, 4),
            "reasons": list(p.reasons), "peak_memory_gib": round(p.peak_memory_gib, 2),
            "step_time_s": round(p.step_time_s, 4), "tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu, 1),
            "memory_gib": {k: round(v, 2) for k, v in p.memory.as_dict().items()},
            "global_batch": rows, "framework": "megatron", "source": p.source,
            # what benchmarks/runner_activation_fit.py refits these activations from (a dense-MLP layer is counted
            # tensor by tensor, activations.runner_dense_layer_bytes: no factor)
            "unfused_activation_factors": {"dense": None, "moe": c.unfused_moe_activation_factor}}


def _per_step(ranks: dict) -> tuple[list[float], list[float], list]:
    """Per step over the steps every rank ran: the slowest rank's time, the ranks' mean loss (NaN when
    none has one), the first gradient norm reported."""
    n = min(len(r["step_times_s"]) for r in ranks.values())
    step_times = [max(r["step_times_s"][i] for r in ranks.values()) for i in range(n)]
    losses = []
    for i in range(n):
        vals = [r["losses"][i] for r in ranks.values() if r["losses"][i] is not None]
        losses.append(sum(vals) / len(vals) if vals else float("nan"))
    grad_norms = [next((r["grad_norms"][i] for r in ranks.values() if r["grad_norms"][i] is not None), None)
                  for i in range(n)]
    return step_times, losses, grad_norms


def _check_split(run, layout) -> None:
    """The runner's model run splits over the layout's pipeline stages as Megatron would split it (evenly,
    or with the layout's first/last stage layers); InvalidLayout naming the numbers where it does not."""
    try:
        run.layout_stage_layers(layout)
    except ModelError as e:
        raise InvalidLayout(f"the megatron runner's {run.num_hidden_layers} layers do not split over "
                            f"{layout.label}: {e}") from None
