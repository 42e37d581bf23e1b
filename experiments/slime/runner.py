"""The measured runner: one slime training run of a layout on a Ray cluster, submitted through the Ray Jobs API.

What it runs is the reference recipes' command as an argument list: `recipes.slime_command.slime_flag_lines`,
the one builder behind the recipe's `run` text too, so the same flags in the same order, with `$HF_CKPT`,
`$TORCH_DIST`, `$SFT_DATA` and `$PROFILE_DIR` replaced by the runner's paths, `--num-rollout` = the trial's
steps (rollout batch = global batch, so one optimizer step per rollout), plus
`--custom-megatron-before-train-step-hook-path peak_memory_hook.record_peak_memory`.

The job's entrypoint is `shlex.join` of an argument list: a fixed bash script (`_WRAPPER`) that enters the
slime checkout, sources slime's `scripts/models/*.sh` for MODEL_ARGS (as the recipe's comment says) and
execs `PYTHON -m ENTRY --async ARGS...` with `${MODEL_ARGS[@]}` spliced in where the recipe puts it. Every
value reaches the script as a positional argument, never pasted into shell text. The job's working
directory (uploaded by Ray, on PYTHONPATH of the driver and of every actor) holds two self-contained files:
`pretokenized_sft_rollout.py` (the recipe's `--rollout-function-path`) and `peak_memory_hook.py`.

A run is: wait for a free cluster, submit, watch (`experiments.slime.watch`: the log streamed into
`experiments.slime.log.SlimeLog`, the job stopped when no first step line came within the start-up grace
`startup_grace_s`, no new step line within `hang_timeout_s`, or the run passed `timeout_s`), then summarise
(`experiments.slime.summary.summarize`: the window's throughput, the failure class).

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

from experiments.runner import RunnerError, RunnerStack, TrialResult, TrialRunner, TrialSpec
from experiments.slime.summary import summarize
from experiments.slime.watch import JobWatch, Limits, one_line
from recipes.slime_command import (MODEL_ARGS, NVLS_EXPR, entry_words, flat, slime_env, slime_flag_lines,
                                   slime_model_script)
from search_space.megatron_args import model_args

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_PATH = "peak_memory_hook.record_peak_memory"
# Files shipped as the job's working directory: name there -> file here.
SHIPPED_FILES = {
    "pretokenized_sft_rollout.py": os.path.join(HERE, "pretokenized_sft_rollout.py"),
    "peak_memory_hook.py": os.path.join(HERE, "hooks", "peak_memory_hook.py"),
}
METADATA_KEY = "attune_runner"
MODEL_ARGS_MARK = "--attune-model-args-here"
# The least start-up grace by default: a real slime job pulls its image and loads the model first.
STARTUP_GRACE_S = 900.0

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
        middle = [str(MODEL_ARGS)] if self.model_script else list(self.model_args)
        return [*self.argv_before, *middle, *self.argv_after]


@dataclass(frozen=True)
class _Submitted:
    job_id: str
    wall: float                         # time.time() at submission
    monotonic: float                    # time.monotonic() at submission
    queued_s: float                     # waited for a free cluster before it


class SlimeRunner(TrialRunner):
    """Runs a trial as a slime job on a Ray cluster (see the module docstring)."""

    name = "slime"

    @property
    def stack(self) -> RunnerStack:
        """slime's training image: DeepEP, Transformer Engine, the precision-aware optimizer, every feature."""
        return RunnerStack(source="slime's training image")

    def __init__(self, ray_address: str, slime_dir: str, entry_module: str = "train", *,
                 env: dict | None = None, hang_timeout_s: float = 900, timeout_s: float = 3600,
                 startup_grace_s: float | None = None, steps: int | None = None,
                 window: tuple[int, int] | None = None, hf_ckpt: str | None = None, torch_dist: str | None = None,
                 sft_data: str | None = None, profile_dir: str | None = None, python: str = "python3",
                 model_args: list[str] | None = None, poll_interval_s: float = 5.0,
                 queue_timeout_s: float = 3600, log_dir: str | None = None, client=None):
        """ray_address: the cluster's dashboard / Jobs API address (http://HEAD:8265; a bare host:port
        gets http://). slime_dir: the slime checkout on the cluster (where train.py and scripts/models are).
        entry_module: run as `python -m ENTRY` from slime_dir, or a path ending in .py run as a script.
        env: environment overrides for the job (merged over `slime_env`; Ray passes them to the driver and
        every actor). hang_timeout_s: the most seconds between two step lines. startup_grace_s: the most
        seconds from the job's start to its first step line (None: the larger of STARTUP_GRACE_S and
        hang_timeout_s). timeout_s: the most seconds from submission to the end. steps / window: override
        the TrialSpec's when given. hf_ckpt, torch_dist, sft_data, profile_dir: the recipe's $HF_CKPT,
        $TORCH_DIST, $SFT_DATA (pre-tokenized rows JSONL), $PROFILE_DIR on the cluster. model_args:
        MODEL_ARGS as a list instead of sourcing slime's script. log_dir: where to save each job's full log
        (optional). client: a JobSubmissionClient-like object (tests)."""
        self.ray_address = ray_address if "://" in ray_address else f"http://{ray_address}"
        self.slime_dir = slime_dir
        self.entry_module = entry_module
        self.env = dict(env or {})
        self.hang_timeout_s = hang_timeout_s
        # a start (image pull, model load) never gets less time than a step
        self.startup_grace_s = max(STARTUP_GRACE_S, hang_timeout_s) if startup_grace_s is None else startup_grace_s
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
            raise RunnerError(f"cannot reach the Ray cluster at {self.ray_address}: {one_line(e)}") from None
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
        case = spec.case
        steps, _ = self.trial_steps(spec)
        lines = slime_flag_lines(case.model, case.gpu, case.workload, case.layout, num_rollout=steps,
                                 paths=self.paths)
        mark = lines.index((MODEL_ARGS,))
        before = [*entry_words(self.python, self.entry_module), *flat(lines[:mark])]
        after = [*flat(lines[mark + 1:]), "--custom-megatron-before-train-step-hook-path", HOOK_PATH]
        script_path, margs, notes = self._model_flags(case.model)
        env, env_notes = self.job_env(spec)
        return SlimeCommand(argv_before=tuple(before), model_script=script_path, model_args=margs,
                            argv_after=tuple(after), env=env, slime_dir=self.slime_dir,
                            notes=tuple(notes + env_notes))

    def _model_flags(self, model) -> tuple[str | None, tuple[str, ...], list[str]]:
        """Where MODEL_ARGS come from: (slime's script on the cluster or None, the flags as a list, notes)."""
        if self.model_args is not None:
            return None, tuple(self.model_args), ["MODEL_ARGS given to the runner"]
        script = slime_model_script(model)
        if script:
            return os.path.join(self.slime_dir, script), (), []
        return None, tuple(model_args(model)), [
            f"slime has no scripts/models script for {model.display_name}: MODEL_ARGS from "
            f"search_space.megatron_args.model_args (no --spec, RoPE base or router options)"]

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
                raise RunnerError(f"cannot reach the Ray cluster at {self.ray_address}: {one_line(e)}") from None
            if not active:
                return time.monotonic() - start
            if time.monotonic() - start > self.queue_timeout_s:
                raise RunnerError(f"the Ray cluster at {self.ray_address} stayed busy with job(s) "
                                  f"{', '.join(active)} for {self.queue_timeout_s:.0f} s")
            time.sleep(self.poll_interval_s)

    def limits(self) -> Limits:
        return Limits(startup_grace_s=self.startup_grace_s, hang_timeout_s=self.hang_timeout_s,
                      timeout_s=self.timeout_s, poll_interval_s=self.poll_interval_s)

    def run(self, spec: TrialSpec) -> TrialResult:
        """Submit the trial's job, watch it to its end (or stop it), and summarise its log."""
        from ray.job_submission import JobStatus
        steps, window = self.trial_steps(spec)
        cmd = self.command(spec)
        job = self.submit(spec, cmd)
        watch = JobWatch(self.client, job.job_id, self.limits(), submitted=job.monotonic, where=self.ray_address)
        status = watch.follow()
        finished_wall = time.time()
        text = watch.drain()
        info = self._job_info(job.job_id)
        wall_s = _wall_s(info, job.wall, finished_wall)
        details = self._job_facts(job, status, info, wall_s, steps, window, cmd)
        if self.log_dir:
            details["log_path"] = self._save_log(job.job_id, text)
        return summarize(spec, watch.log, text, window=window, steps=steps, exit_code=details["exit_code"],
                         succeeded=status == JobStatus.SUCCEEDED and watch.stopped is None, stopped=watch.stopped,
                         wall_s=wall_s, source=f"slime on Ray at {self.ray_address}, job {job.job_id}",
                         runner=self.name, details=details)

    def submit(self, spec: TrialSpec, cmd: SlimeCommand) -> _Submitted:
        """Wait for a free cluster, then submit the job with the shipped files as its working directory."""
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
                raise RunnerError(f"cannot submit to the Ray cluster at {self.ray_address}: {one_line(e)}") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return _Submitted(job_id=job_id, wall=submitted_wall, monotonic=submitted, queued_s=queued_s)

    def _job_info(self, job_id: str):
        """Ray's JobInfo of the job (exit code, start and end times, message), None when it cannot be read."""
        try:
            return self.client.get_job_info(job_id)
        except Exception:
            return None

    def _job_facts(self, job: _Submitted, status, info, wall_s: float, steps: int, window: tuple[int, int],
                   cmd: SlimeCommand) -> dict:
        """The result's details about the job: its id, status, exit code, times, command and environment."""
        return {
            "job_id": job.job_id, "ray_address": self.ray_address,
            "job_status": str(getattr(status, "value", status)), "exit_code": getattr(info, "driver_exit_code", None),
            "job_message": one_line(getattr(info, "message", "") or "")[:500],
            "queued_s": round(job.queued_s, 3), "wall_s": round(wall_s, 3), "steps_requested": steps,
            "window": list(window), "entrypoint_argv": cmd.argv, "env": _redacted(cmd.env), "notes": list(cmd.notes),
        }

    def _save_log(self, job_id: str, text: str) -> str:
        os.makedirs(self.log_dir, exist_ok=True)
        path = os.path.join(self.log_dir, f"{job_id}.log")
        with open(path, "w") as f:
            f.write(text)
        return path


def _wall_s(info, submitted_wall: float, finished_wall: float) -> float:
    """The job's wall time: Ray's (start to end) when it has both, else submission to the end of the watch."""
    start_ms, end_ms = getattr(info, "start_time", None), getattr(info, "end_time", None)
    if start_ms and end_ms and end_ms >= start_ms:
        return (end_ms - start_ms) / 1000
    return finished_wall - submitted_wall


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "trial"


def _redacted(env: dict) -> dict:
    """The env for the record, without the values of credential-like variables (tokens, keys, passwords)."""
    secret = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(?:^|_)KEY(?:$|_)|API_KEY", re.IGNORECASE)
    return {k: ("<redacted>" if secret.search(k) else v) for k, v in env.items()}


__all__ = ["SlimeRunner", "SlimeCommand", "RunnerError", "summarize", "HOOK_PATH", "SHIPPED_FILES",
           "STARTUP_GRACE_S"]
