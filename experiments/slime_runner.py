"""The measured runner: one slime training run of a layout on a Ray cluster, submitted through the Ray Jobs API.

What it runs is the reference recipes' command (`recipes.slime_command.slime_run`) as an argument list:
the same flags in the same order, with `$HF_CKPT`, `$TORCH_DIST`, `$SFT_DATA` and `$PROFILE_DIR` replaced by
the runner's paths, `--num-rollout` = the trial's steps (rollout batch = global batch, so one optimizer step
per rollout), plus `--custom-megatron-before-train-step-hook-path peak_memory_hook.record_peak_memory`.

The job's entrypoint is `shlex.join` of an argument list: a fixed bash script (`_WRAPPER`) that enters the
slime checkout, sources slime's `scripts/models/*.sh` for MODEL_ARGS (as the recipe's comment says) and
execs `PYTHON -m ENTRY --async ARGS...` with `${MODEL_ARGS[@]}` spliced in where the recipe puts it. Every
value reaches the script as a positional argument, never pasted into shell text. The job's working
directory (uploaded by Ray, on PYTHONPATH of the driver and of every actor) holds two self-contained files:
`pretokenized_sft_rollout.py` (the recipe's `--rollout-function-path`) and `peak_memory_hook.py`.

The runner polls the job's status and log (`get_job_logs`), feeds new lines to `experiments.slime_log.SlimeLog`,
stops the job (`stop_job`) when no new `step N:` line came within `hang_timeout_s` (first step:
`first_step_timeout_s`) or the run passed `timeout_s`, and turns the log into a TrialResult: tokens/s per GPU
over the window (steps window[0]..window[1], each global_batch rows x seq_len tokens), step times and their
CV, losses, per-rank peak memory from the hook, GPU-hours = GPUs x (finish - submission), and the failure
class (`slime_log.classify_failure`; `hang` when the runner stopped it).

Before submitting it waits until no other job it submitted (metadata `attune_runner`) is PENDING or RUNNING.
An unreachable Ray address raises `RunnerError` at construction, and so does a cluster with Ray token
authentication when the tuner's environment lacks the token (set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, or
~/.ray/auth_token, as for the ray CLI).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass

from experiments.runner import RunnerError, TrialResult, TrialRunner, TrialSpec
from experiments.slime_log import SlimeLog, WindowError, classify_failure, failure_evidence
from recipes.slime_command import (_MISC_LINES, _OPTIMIZER_LINES, NVLS_EXPR, ROLLOUT_FUNCTION, actor_placement,
                                   slime_env, slime_loss_mask_type, slime_model_script)
from search_space.megatron_args import (batch_args, dispatcher_args, model_args, moment_args, offload_args,
                                        parallel_args, recompute_args)

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_PATH = "peak_memory_hook.record_peak_memory"
# Files shipped as the job's working directory: name there -> file here.
SHIPPED_FILES = {
    "pretokenized_sft_rollout.py": os.path.join(HERE, "pretokenized_sft_rollout.py"),
    "peak_memory_hook.py": os.path.join(HERE, "hooks", "peak_memory_hook.py"),
}
METADATA_KEY = "attune_runner"
MODEL_ARGS_MARK = "--attune-model-args-here"

# $1 slime checkout, $2 model script ("" = none), then the command; MODEL_ARGS go where the mark is.
_WRAPPER = r"""set -e
cd -- "$1"
MODEL_ARGS=()
if [ -n "$2" ]; then source "$2"; fi
shift 2
pre=()
while [ "$#" -gt 0 ] && [ "$1" != "__MARK__" ]; do pre+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
exec "${pre[@]}" "${MODEL_ARGS[@]}" "$@"
""".replace("__MARK__", MODEL_ARGS_MARK)




@dataclass(frozen=True)
class SlimeCommand:
    argv_before: tuple[str, ...]        # python -m entry --async --actor-num-nodes N --actor-num-gpus-per-node G
    model_script: str | None            # absolute path on the cluster of slime's MODEL_ARGS script, or None
    model_args: tuple[str, ...]         # MODEL_ARGS given as a list (when there is no script)
    argv_after: tuple[str, ...]         # the rest of the recipe's flags, then the hook flag
    env: dict
    slime_dir: str
    notes: tuple[str, ...] = ()

    @property
    def entrypoint_argv(self) -> list[str]:
        return ["bash", "-c", _WRAPPER, "attune-slime", self.slime_dir, self.model_script or "",
                *self.argv_before, MODEL_ARGS_MARK, *self.model_args, *self.argv_after]

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.entrypoint_argv)

    @property
    def argv(self) -> list[str]:
        """The command as run, with MODEL_ARGS shown as the `${MODEL_ARGS[@]}` the script defines."""
        middle = ["${MODEL_ARGS[@]}"] if self.model_script else list(self.model_args)
        return [*self.argv_before, *middle, *self.argv_after]


class SlimeRunner(TrialRunner):
    """Runs a trial as a slime job on a Ray cluster (see the module docstring)."""

    name = "slime"

    def __init__(self, ray_address: str, slime_dir: str, entry_module: str = "train", *,
                 env: dict | None = None, hang_timeout_s: float = 900, timeout_s: float = 3600,
                 first_step_timeout_s: float | None = None, steps: int | None = None,
                 window: tuple[int, int] | None = None, hf_ckpt: str | None = None, torch_dist: str | None = None,
                 sft_data: str | None = None, profile_dir: str | None = None, python: str = "python3",
                 model_args: list[str] | None = None, poll_interval_s: float = 5.0,
                 queue_timeout_s: float = 3600, log_dir: str | None = None, client=None):
        """ray_address: the cluster's dashboard / Jobs API address (http://HEAD:8265; a bare host:port
        gets http://). slime_dir: the slime checkout on the cluster (where train.py and scripts/models are).
        entry_module: run as `python -m ENTRY` from slime_dir, or a path ending in .py run as a script.
        env: environment overrides for the job (merged over `slime_env`; Ray passes them to the driver and
        every actor). steps / window: override the TrialSpec's when given. hf_ckpt, torch_dist, sft_data,
        profile_dir: the recipe's $HF_CKPT, $TORCH_DIST, $SFT_DATA (pre-tokenized rows JSONL), $PROFILE_DIR on
        the cluster. model_args: MODEL_ARGS as a list instead of sourcing slime's script. log_dir: where to
        save each job's full log (optional). client: a JobSubmissionClient-like object (tests)."""
        self.ray_address = ray_address if "://" in ray_address else f"http://{ray_address}"
        self.slime_dir = slime_dir
        self.entry_module = entry_module
        self.env = dict(env or {})
        self.hang_timeout_s = hang_timeout_s
        self.first_step_timeout_s = first_step_timeout_s if first_step_timeout_s is not None else hang_timeout_s
        self.timeout_s = timeout_s
        self.steps = steps
        self.window = tuple(window) if window is not None else None
        self.paths = {"HF_CKPT": hf_ckpt, "TORCH_DIST": torch_dist, "SFT_DATA": sft_data, "PROFILE_DIR": profile_dir}
        self.python = python
        self.model_args = list(model_args) if model_args is not None else None
        self.poll_interval_s = poll_interval_s
        self.queue_timeout_s = queue_timeout_s
        self.log_dir = log_dir
        self.client = client if client is not None else self._connect()

    # -- connection ----------------------------------------------------------------------------------

    def _connect(self):
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as e:
            raise RunnerError(f"cannot reach the Ray cluster at {self.ray_address}: the ray package is not "
                              f"installed ({e}); pip install 'ray[default]'") from None
        try:
            client = JobSubmissionClient(self.ray_address)
            client.list_jobs()        # an authenticated call: a cluster with token auth refuses it without one
        except Exception as e:  # ConnectionError, requests errors, RuntimeError from the version check, auth
            raise RunnerError(f"cannot reach the Ray cluster at {self.ray_address}: {_one_line(e)}") from None
        return client

    # -- the command ---------------------------------------------------------------------------------

    def trial_steps(self, spec: TrialSpec) -> tuple[int, tuple[int, int]]:
        steps = self.steps if self.steps is not None else spec.steps
        window = self.window if self.window is not None else tuple(spec.window)
        if not (1 <= window[0] <= window[1] < steps):
            raise RunnerError(f"the window {window[0]}..{window[1]} must lie in steps 1..{steps - 1} "
                              f"(steps count from 0; step 0 has no previous step to time it from)")
        return steps, window

    def command(self, spec: TrialSpec) -> SlimeCommand:
        """The slime command for the trial's layout, as argument lists (the recipe's `run`, line for line)."""
        missing = [f"${k}" for k, v in self.paths.items() if not v]
        if missing:
            raise RunnerError(f"SlimeRunner needs the cluster paths for {', '.join(missing)} "
                              f"(hf_ckpt, torch_dist, sft_data, profile_dir)")
        model, gpu, workload, layout = spec.case.model, spec.case.gpu, spec.case.workload, spec.case.layout
        steps, _ = self.trial_steps(spec)
        nodes, per_node = actor_placement(layout, gpu)
        notes = []
        if self.entry_module.endswith(".py"):
            before = [self.python, self.entry_module]
        else:
            before = [self.python, "-m", self.entry_module]
        before += ["--async", "--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node", str(per_node)]
        script = slime_model_script(model)
        if self.model_args is not None:
            script_path, margs = None, tuple(self.model_args)
            notes.append("MODEL_ARGS given to the runner")
        elif script:
            script_path, margs = os.path.join(self.slime_dir, script), ()
        else:
            script_path, margs = None, tuple(model_args(model))
            notes.append(f"slime has no scripts/models script for {model.display_name}: MODEL_ARGS from "
                         f"search_space.megatron_args.model_args (no --spec, RoPE base or router options)")
        after = [
            "--hf-checkpoint", self.paths["HF_CKPT"],
            "--ref-load", self.paths["TORCH_DIST"],
            "--rollout-function-path", ROLLOUT_FUNCTION,
            "--prompt-data", self.paths["SFT_DATA"],
            "--input-key", "messages",
            "--metadata-key", "metadata",
            "--num-rollout", str(steps),
            "--rollout-batch-size", str(workload.global_batch),
            "--global-batch-size", str(workload.global_batch),
            "--loss-type", "sft_loss",
            "--loss-mask-type", slime_loss_mask_type(model),
            "--calculate-per-token-loss",
            "--disable-compute-advantages-and-returns",
            "--debug-train-only",
            *parallel_args(layout),
            *recompute_args(layout),
            *batch_args(layout),
            *[w for line in _OPTIMIZER_LINES for w in line],
            "--use-distributed-optimizer",
            *offload_args(layout),
            "--use-precision-aware-optimizer",
            *moment_args(layout),
            *[w for line in _MISC_LINES for w in line],
            *dispatcher_args(layout),
            "--distributed-timeout-minutes", "30",
            "--tensorboard-dir", self.paths["PROFILE_DIR"],
            "--custom-megatron-before-train-step-hook-path", HOOK_PATH,
        ]
        env, env_notes = self.job_env(spec)
        return SlimeCommand(argv_before=tuple(before), model_script=script_path, model_args=margs,
                            argv_after=tuple(str(a) for a in after), env=env, slime_dir=self.slime_dir,
                            notes=tuple(notes + env_notes))

    def job_env(self, spec: TrialSpec) -> tuple[dict, list[str]]:
        """The job's environment: `slime_env` (NCCL_NVLS_ENABLE resolved from the GPU's NVLink domain unless
        given), the runner's overrides, RAY_DEDUP_LOGS=0 (Ray would fold the per-rank hook lines, which
        differ only in numbers) and PYTHONUNBUFFERED=1."""
        env, notes = {}, []
        for name, value in slime_env(spec.case.layout, spec.case.gpu).items():
            if value == NVLS_EXPR:
                value = "1" if spec.case.gpu.nvlink_domain > 1 else "0"
                if name not in self.env:
                    notes.append(f"{name}={value} from the GPU catalog's NVLink domain "
                                 f"({spec.case.gpu.nvlink_domain} GPUs); the recipe computes it with nvidia-smi")
            env[name] = value
        env.update({str(k): str(v) for k, v in self.env.items()})
        env.setdefault("RAY_DEDUP_LOGS", "0")
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env, notes

    # -- running -------------------------------------------------------------------------------------

    def _our_active_jobs(self) -> list[str]:
        from ray.job_submission import JobStatus
        active = []
        for job in self.client.list_jobs():
            if (job.metadata or {}).get(METADATA_KEY) and job.status in (JobStatus.PENDING, JobStatus.RUNNING):
                active.append(job.submission_id or job.job_id or "?")
        return active

    def wait_for_free_cluster(self) -> float:
        """Wait until none of our jobs is pending or running; returns the seconds waited."""
        start = time.monotonic()
        while True:
            try:
                active = self._our_active_jobs()
            except Exception as e:
                raise RunnerError(f"cannot reach the Ray cluster at {self.ray_address}: {_one_line(e)}") from None
            if not active:
                return time.monotonic() - start
            if time.monotonic() - start > self.queue_timeout_s:
                raise RunnerError(f"the Ray cluster at {self.ray_address} stayed busy with job(s) "
                                  f"{', '.join(active)} for {self.queue_timeout_s:.0f} s")
            time.sleep(self.poll_interval_s)

    def run(self, spec: TrialSpec) -> TrialResult:
        from ray.job_submission import JobStatus
        steps, window = self.trial_steps(spec)
        cmd = self.command(spec)
        queued_s = self.wait_for_free_cluster()
        submission_id = f"attune-{_slug(spec.case.layout.label)}-{uuid.uuid4().hex[:8]}"
        stage = tempfile.mkdtemp(prefix="attune-slime-job-")
        try:
            for name, path in SHIPPED_FILES.items():
                shutil.copyfile(path, os.path.join(stage, name))
            submitted_wall = time.time()
            submitted = time.monotonic()
            try:
                job_id = self.client.submit_job(
                    entrypoint=cmd.entrypoint, submission_id=submission_id,
                    runtime_env={"working_dir": stage, "env_vars": cmd.env},
                    metadata={METADATA_KEY: self.name, "layout": spec.case.layout.key()[:200]})
            except Exception as e:
                raise RunnerError(f"cannot submit to the Ray cluster at {self.ray_address}: {_one_line(e)}") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)

        log = SlimeLog()
        text_parts: list[str] = []
        seen = 0
        stopped: str | None = None
        stop_requested = 0.0
        running_since = None
        last_progress = None
        last_step = None
        status = None
        lost_since = None
        while True:
            try:
                status = self.client.get_job_status(job_id)
                lost_since = None
            except Exception as e:     # the cluster may be briefly unreachable; give up after a while
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > max(60.0, 12 * self.poll_interval_s):
                    raise RunnerError(f"lost the Ray cluster at {self.ray_address} while job {job_id} ran: "
                                      f"{_one_line(e)}") from None
                time.sleep(self.poll_interval_s)
                continue
            now = time.monotonic()
            try:
                logs = self.client.get_job_logs(job_id)
            except Exception:
                logs = None
            if logs is not None and len(logs) > seen:
                chunk = logs[seen:]
                seen = len(logs)
                text_parts.append(chunk)
                log.feed_text(chunk)
            if log.last_step is not None and log.last_step != last_step:
                last_step, last_progress = log.last_step, now
            if status.is_terminal():
                break
            if status == JobStatus.RUNNING and running_since is None:
                running_since = last_progress = now
            if stopped is None:
                if now - submitted > self.timeout_s:
                    stopped = (f"stopped at the overall limit of {self.timeout_s:.0f} s "
                               f"({_steps_text(last_step)} logged)")
                elif running_since is not None:
                    limit = self.hang_timeout_s if last_step is not None else self.first_step_timeout_s
                    if now - last_progress > limit:
                        what = f"step {last_step}" if last_step is not None else "the job started"
                        stopped = f"no new step line for {limit:.0f} s after {what}; stopped"
                if stopped is not None:
                    stop_requested = now
                    try:
                        self.client.stop_job(job_id)
                    except Exception:
                        pass
            if stopped is not None and now - stop_requested > 120:
                break                      # the job ignores the stop: give up on it
            time.sleep(self.poll_interval_s)
        finished_wall = time.time()
        try:
            logs = self.client.get_job_logs(job_id)
            if len(logs) > seen:
                text_parts.append(logs[seen:])
                log.feed_text(logs[seen:])
        except Exception:
            pass
        log.feed_text("", final=True)
        info = None
        try:
            info = self.client.get_job_info(job_id)
        except Exception:
            pass
        exit_code = getattr(info, "driver_exit_code", None)
        start_ms, end_ms = getattr(info, "start_time", None), getattr(info, "end_time", None)
        wall_s = (end_ms - start_ms) / 1000 if start_ms and end_ms and end_ms >= start_ms else \
            finished_wall - submitted_wall
        text = "".join(text_parts)
        details = {
            "job_id": job_id, "ray_address": self.ray_address, "job_status": str(getattr(status, "value", status)),
            "exit_code": exit_code, "job_message": _one_line(getattr(info, "message", "") or "")[:500],
            "queued_s": round(queued_s, 3), "wall_s": round(wall_s, 3), "steps_requested": steps,
            "window": list(window), "entrypoint_argv": cmd.argv, "env": _redacted(cmd.env), "notes": list(cmd.notes),
        }
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            path = os.path.join(self.log_dir, f"{job_id}.log")
            with open(path, "w") as f:
                f.write(text)
            details["log_path"] = path
        return summarize(spec, log, text, window=window, steps=steps, exit_code=exit_code,
                         succeeded=status == JobStatus.SUCCEEDED and stopped is None, stopped=stopped,
                         wall_s=wall_s, source=f"slime on Ray at {self.ray_address}, job {job_id}",
                         runner=self.name, details=details)


def summarize(spec: TrialSpec, log: SlimeLog, text: str, *, window: tuple[int, int], steps: int,
              exit_code: int | None, succeeded: bool, stopped: str | None, wall_s: float, source: str,
              runner: str = "slime", details: dict | None = None) -> TrialResult:
    """A finished run's TrialResult from its parsed log (no Ray needed; the runner and tests use it)."""
    gpus = spec.case.layout.world_size
    details = dict(details or {})
    per_rank = log.peak_memory_gib_per_rank()
    reserved = log.peak_memory_gib_per_rank(reserved=True)
    details.update(steps_logged=len(log.steps), last_step=log.last_step,
                   peak_reserved_gib_per_rank={str(k): round(v, 3) for k, v in reserved.items()},
                   peak_memory_ranks=len(per_rank))
    common = dict(
        kind="measured", source=source, runner=runner,
        losses=log.losses(), peak_memory_gib=max(per_rank.values()) if per_rank else None,
        peak_memory_gib_per_rank=tuple(per_rank[k] for k in sorted(per_rank)),
        gpu_hours=gpus * wall_s / 3600.0,
    )
    if per_rank:
        details["peak_memory_rank_ids"] = sorted(per_rank)
    failure = None
    detail = ""
    if stopped is not None:
        failure, detail = "hang", stopped
    elif not succeeded:
        failure = classify_failure(text, exit_code) or "crash"
        evidence = failure_evidence(text, failure)
        detail = f"exit code {exit_code}" + (f": {evidence}" if evidence else "")
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
        step_times = ()
        try:
            partial = log.step_times(1, log.last_step) if log.last_step and log.last_step >= 1 else ((), "")
            step_times = partial[0]
        except WindowError:
            pass
        return TrialResult(status="failed", failure_class=failure, detail=detail, step_times_s=step_times,
                           details=details, **common)
    tps = stats.tokens_per_s_per_gpu
    details.update(window_tokens=stats.tokens, window_wall_s=round(stats.wall_s, 3), time_source=stats.time_source,
                   grad_norms=list(log.grad_norms()))
    peak = spec.case.gpu.peak_tflops(spec.case.workload.precision) * 1e12
    mfu = 6 * spec.case.model.params.active_non_embedding * tps / peak if peak else None
    usd = spec.case.gpu.usd_per_gpu_hour / (tps * 3600) * 1e6 if tps > 0 else None
    return TrialResult(status="ok", tokens_per_s_per_gpu=tps, step_time_s=stats.wall_s / stats.steps,
                       step_times_s=stats.step_times_s, step_time_cv_percent=stats.step_time_cv_percent,
                       mfu=mfu, usd_per_million_tokens=usd, details=details, **common)


def _tail(text: str, lines: int = 40, chars: int = 6000) -> str:
    tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    return tail[-chars:]


def _steps_text(last_step: int | None) -> str:
    return "no step" if last_step is None else f"steps up to {last_step}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "trial"


def _redacted(env: dict) -> dict:
    """The env for the record, without the values of credential-like variables (tokens, keys, passwords)."""
    secret = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(?:^|_)KEY(?:$|_)|API_KEY", re.IGNORECASE)
    return {k: ("<redacted>" if secret.search(k) else v) for k, v in env.items()}


def _one_line(e) -> str:
    return " ".join(str(e).split())


__all__ = ["SlimeRunner", "SlimeCommand", "RunnerError", "summarize", "HOOK_PATH", "SHIPPED_FILES"]
