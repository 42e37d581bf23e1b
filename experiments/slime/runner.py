"""The measured runner: one slime training run of a layout on a Ray cluster, submitted through the Ray Jobs API.

What it runs is the reference recipes' command as an argument list: `recipes.slime_command.slime_flag_lines`,
the one builder behind the recipe's `run` text too, so the same flags in the same order, with `$HF_CKPT`,
`$TORCH_DIST`, `$SFT_DATA` and `$PROFILE_DIR` replaced by the cluster's paths (`experiments.slime.cluster`),
`--num-rollout` = the trial's steps (rollout batch = global batch, so one optimizer step per rollout), plus
`--custom-megatron-before-train-step-hook-path peak_memory_hook.record_peak_memory`. The recipe's format is
shorthand in three places, and the job is what slime accepts (recipes.slime_command):
- `python3 -m <entry> --async`: slime has no `--async` flag; it names slime's train_async.py, so the job runs
  `PYTHON train_async.py` (another entry only when asked for);
- `NCCL_NVLS_ENABLE=$(...)`: a shell value is never put in Ray's runtime_env; the job's bash prelude computes
  NVLINK_COUNT from `nvidia-smi topo -m` on the driver's node, as slime's run scripts do, exports the value and
  hands it to slime's training actors with slime's `--train-env-vars` (Ray actors do not inherit the driver's
  environment; the cluster file's env can set it instead);
- a flag current Megatron-LM deprecates (`--moe-enable-deepep`) is passed as its replacement.
A model whose slime MODEL_ARGS script slime does not ship (experiments.slime.model_scripts) is refused
before anything is submitted.

The job's entrypoint is `shlex.join` of an argument list: a fixed bash script (`wrapper_script`) that enters
the slime checkout, sources slime's `scripts/models/*.sh` for MODEL_ARGS (as the recipe's comment says; a
missing script stops the job in one line) and execs `PYTHON ENTRY ARGS...` with `${MODEL_ARGS[@]}` spliced in
where the recipe puts it. Every value reaches the script as a positional argument, never pasted into shell
text. The job's working directory (uploaded by Ray, on PYTHONPATH of the driver and of every actor) holds two
self-contained files: `pretokenized_sft_rollout.py` (the recipe's `--rollout-function-path`) and
`peak_memory_hook.py`. `job_request` is the job as submitted (what `tune trial --dry-run` prints).

A run is: wait for a free cluster, submit, watch (`experiments.slime.watch`: the log streamed with Ray's
`tail_job_logs` into `experiments.slime.log.SlimeLog`, the job stopped when no first step line came within the
start-up grace `startup_grace_s`, no new step line within `hang_timeout_s`, or the run passed `timeout_s`),
then summarise (`experiments.slime.summary.summarize`: the window's throughput, the failure class).

Before submitting it waits until no other job it submitted (metadata `attune_runner`) is PENDING or RUNNING.
An unreachable Ray address raises `RunnerError` at construction, and so does a cluster with Ray token
authentication when the tuner's environment lacks the token (set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, or
~/.ray/auth_token, as for the ray CLI).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass

from cost_model.nouns.stack import Stack
from experiments.runner import RunnerError, TrialResult, TrialRunner, TrialSpec
from experiments.slime.cluster import ClusterConfig, jobs_api_address, missing_paths_message
from experiments.slime.model_scripts import SLIME_COMMIT, listed, same_commit
from experiments.slime.summary import RunEnd, summarize
from experiments.slime.watch import STARTUP_GRACE_S, JobWatch, Limits, one_line
from recipes.slime_command import (ASYNC_ENTRY, MODEL_ARGS, SHELL_ENV_INPUTS, flat, job_entry_words, job_flags,
                                   slime_env, slime_flag_lines, slime_model_script)
from search_space.megatron_args import launch_model_args, model_args
from tuner.storages import masked
from tuner.storages import shown as shown_url

# Seconds a submission waits for the head node's job agent (Ray answers 500 'No available agent' until it is up).
SUBMIT_AGENT_WAIT_S = 60.0


def submit_when_agent_up(client, wait_s: float, poll_s: float, **job) -> tuple[str, float, float]:
    """Submit a job through Ray's JobSubmissionClient; a head node just started answers 500 'No available agent' until
    its job agent is up, so that answer is retried for up to `wait_s` seconds, every `poll_s`, and nothing else is.
    Returns the job id and the wall and monotonic times the accepted attempt started (they start the job's clock)."""
    deadline = time.monotonic() + wait_s
    while True:
        wall, monotonic = time.time(), time.monotonic()
        try:
            return client.submit_job(**job), wall, monotonic
        except Exception as e:
            if "No available agent" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)


HERE = os.path.dirname(os.path.abspath(__file__))
HOOK_PATH = "peak_memory_hook.record_peak_memory"
# Files shipped as the job's working directory: name there -> file here.
SHIPPED_FILES = {
    "pretokenized_sft_rollout.py": os.path.join(HERE, "pretokenized_sft_rollout.py"),
    "peak_memory_hook.py": os.path.join(HERE, "hooks", "peak_memory_hook.py"),
}
METADATA_KEY = "attune_runner"
# what ray[default] adds that the Jobs SDK needs (core ray has neither the dashboard client nor its HTTP stack)
JOBS_API_MODULES = ("aiohttp", "requests")
MODEL_ARGS_MARK = "--attune-model-args-here"
# slime's flag for the training actors' environment (slime/utils/arguments.py, slime/ray/actor_group.py).
TRAIN_ENV_FLAG = "--train-env-vars"
# The runner's path fields -> the cluster file's.
PATH_FIELDS = {"HF_CKPT": "hf_checkpoint", "TORCH_DIST": "torch_dist", "SFT_DATA": "sft_data",
               "PROFILE_DIR": "profile_dir"}

# $1 slime checkout, $2 model script ("" = none), then the command; MODEL_ARGS go where the mark is.
_WRAPPER_BODY = r"""MODEL_ARGS=()
if [ -n "$2" ]; then
  if [ ! -f "$2" ]; then echo "attune: the slime checkout $1 has no $2 (the model's MODEL_ARGS script)" >&2; exit 2; fi
  source "$2"
fi
shift 2
pre=()
while [ "$#" -gt 0 ] && [ "$1" != "__MARK__" ]; do pre+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
""".replace("__MARK__", MODEL_ARGS_MARK)


def wrapper_script(on_cluster: dict[str, str]) -> str:
    """The job's bash script: the prelude computing `on_cluster` (name -> the format's shell value, one of
    SHELL_ENV_INPUTS: fixed text, never a user's value), then the command, which passes them to slime's
    training actors with --train-env-vars."""
    lines, inputs = ["set -e", 'cd -- "$1"'], []
    for name, expr in on_cluster.items():
        if SHELL_ENV_INPUTS[expr] not in inputs:
            inputs.append(SHELL_ENV_INPUTS[expr])
            lines.append(SHELL_ENV_INPUTS[expr])
        lines += [f"export {name}={expr}", f'echo "attune: {name}=${name} computed on the cluster"']
    run = 'exec "${pre[@]}" "${MODEL_ARGS[@]}" "$@"'
    if on_cluster:
        pairs = ", ".join(f'\\"{name}\\": \\"${name}\\"' for name in on_cluster)
        run += f' {TRAIN_ENV_FLAG} "{{{pairs}}}"'
    return "\n".join(lines) + "\n" + _WRAPPER_BODY + run + "\n"


@dataclass(frozen=True)
class SlimeCommand:
    argv_before: tuple[str, ...]        # python train_async.py --actor-num-nodes N --actor-num-gpus-per-node G
    model_script: str | None            # absolute path on the cluster of slime's MODEL_ARGS script, or None
    model_args: tuple[str, ...]         # MODEL_ARGS given as a list (when there is no script)
    argv_after: tuple[str, ...]         # the rest of the recipe's flags, then the hook flag
    env: dict                           # Ray's runtime_env env_vars: literal values only
    slime_dir: str
    notes: tuple[str, ...] = ()
    on_cluster: tuple[tuple[str, str], ...] = ()     # (name, the format's shell value) computed by the prelude

    @property
    def entrypoint_argv(self) -> list[str]:
        return ["bash", "-c", wrapper_script(dict(self.on_cluster)), "attune-slime", self.slime_dir,
                self.model_script or "", *self.argv_before, MODEL_ARGS_MARK, *self.model_args, *self.argv_after]

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.entrypoint_argv)

    @property
    def argv(self) -> list[str]:
        """The command as run, with MODEL_ARGS shown as the `${MODEL_ARGS[@]}` the script defines and the
        values computed on the cluster as `$NAME`."""
        middle = [str(MODEL_ARGS)] if self.model_script else list(self.model_args)
        extra = []
        if self.on_cluster:
            extra = [TRAIN_ENV_FLAG, "{" + ", ".join(f'"{n}": "${n}"' for n, _ in self.on_cluster) + "}"]
        return [*self.argv_before, *middle, *self.argv_after, *extra]


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
    def stack(self) -> Stack:
        """slime's training image: DeepEP, Transformer Engine, the precision-aware optimizer, every feature."""
        return Stack(source="slime's training image")

    def __init__(self, cluster: ClusterConfig, limits: Limits | None = None, *, steps: int | None = None,
                 window: tuple[int, int] | None = None, model_args: list[str] | None = None,
                 queue_timeout_s: float = 3600, client=None, connect: bool = True):
        """cluster: where and how the jobs run (experiments.slime.cluster: ray_address, the Jobs API address, a
        bare host:port gets http://; entry_module None is the recipe's `--async`, slime's train_async.py, a path
        ending in .py is run as a script from slime_dir, anything else as `python -m ENTRY`; env is merged over
        `slime_env`, Ray passes it to the driver and every actor; python defaults to python3; slime_commit, when
        known, checks model scripts against experiments.slime.model_scripts). limits: when a job is stopped
        (experiments.slime.watch.Limits). steps / window: override the TrialSpec's when given. model_args:
        MODEL_ARGS as a list instead of sourcing slime's script. queue_timeout_s: the most seconds to wait for a
        free cluster. client: a JobSubmissionClient-like object (tests); connect=False: no client at all
        (`job_request` only, for a dry run)."""
        self.ray_address = jobs_api_address(cluster.ray_address)
        self.address_shown = shown_url(self.ray_address)    # what messages and records name: no password
        self.slime_dir = cluster.slime_dir
        self.entry_module = cluster.entry_module
        self.env = dict(cluster.env)      # a copy: the runner's own, the cluster config stays as loaded
        self._limits = limits if limits is not None else Limits()
        self.steps = steps
        self.window = tuple(window) if window is not None else None
        self.paths = {"HF_CKPT": cluster.hf_checkpoint, "TORCH_DIST": cluster.torch_dist,
                      "SFT_DATA": cluster.sft_data, "PROFILE_DIR": cluster.profile_dir}
        self.python = cluster.python or "python3"
        self.model_args = list(model_args) if model_args is not None else None
        self.queue_timeout_s = queue_timeout_s
        self.log_dir = cluster.log_dir
        self.slime_commit = cluster.slime_commit
        self.client = client if client is not None or not connect else self._connect()

    # -- connection ----------------------------------------------------------------------------------

    def _connect(self):
        # core ray imports its Jobs SDK without these, then fails inside the client with a connection error
        missing = [m for m in JOBS_API_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            raise RunnerError(f"the slime backend submits through Ray's Jobs API, which needs ray[default] (missing "
                              f"here: {', '.join(missing)}); pip install 'ray[default]' (make setup-ray)")
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as e:
            raise RunnerError(f"cannot reach the Ray cluster at {self.address_shown}: the ray package is not "
                              f"installed ({e}); pip install 'ray[default]'") from None
        try:
            client = JobSubmissionClient(self.ray_address)
            client.list_jobs()        # an authenticated call: a cluster with token auth refuses it without one
        except Exception as e:  # ConnectionError, requests errors, RuntimeError from the version check, auth
            raise RunnerError(self._unreachable(e)) from None
        return client

    def _masked(self, text: str) -> str:
        """An error's line with the address's password (in whatever form the client printed it) as ***."""
        return masked(text, self.ray_address)

    def _unreachable(self, e: Exception) -> str:
        return self._masked(f"cannot reach the Ray cluster at {self.address_shown}: {one_line(e)}")

    # -- the command ---------------------------------------------------------------------------------

    def trial_steps(self, spec: TrialSpec) -> tuple[int, tuple[int, int]]:
        steps = self.steps if self.steps is not None else spec.steps
        window = self.window if self.window is not None else tuple(spec.window)
        if not (1 <= window[0] <= window[1] < steps):
            raise RunnerError(f"the window {window[0]}..{window[1]} must lie in steps 1..{steps - 1} "
                              f"(steps count from 0; step 0 has no previous step to time it from)")
        return steps, window

    def check_paths(self) -> None:
        """RunnerError naming each cluster path (hf_checkpoint, torch_dist, sft_data, profile_dir) not given."""
        missing = [PATH_FIELDS[k] for k, v in self.paths.items() if not v]
        if missing:
            raise RunnerError(missing_paths_message(missing))

    def check_model(self, model) -> None:
        """RunnerError when slime (at the listed commit) has no MODEL_ARGS script the model maps to."""
        script = slime_model_script(model)
        if self.model_args is None and script and same_commit(self.slime_commit) and not listed(script):
            raise RunnerError(
                f"slime @{SLIME_COMMIT[:7]} has no {script} (the MODEL_ARGS of {model.display_name}), so `source` "
                f"would fail on the cluster; if your slime checkout has it, give its commit as slime_commit in "
                f"the --cluster file")

    def command(self, spec: TrialSpec) -> SlimeCommand:
        """The slime command for the trial's layout, as argument lists (the recipe's `run`, line for line,
        in the form slime accepts: see the module docstring)."""
        self.check_paths()
        case = spec.case
        steps, _ = self.trial_steps(spec)
        lines = slime_flag_lines(case.model, case.gpu, case.workload, case.layout, num_rollout=steps,
                                 paths=self.paths)
        mark = lines.index((MODEL_ARGS,))
        before = [*job_entry_words(self.python, self.entry_module), *flat(lines[:mark])]
        after, notes = job_flags([*flat(lines[mark + 1:]), "--custom-megatron-before-train-step-hook-path",
                                  HOOK_PATH])
        if self.entry_module in ("train", "train.py"):
            notes.append("the recipe's --async names train_async.py; slime's synchronous train ran, as asked")
        script_path, margs, model_notes = self._model_flags(case.model)
        env, on_cluster, env_notes = self.job_env(spec)
        return SlimeCommand(argv_before=tuple(before), model_script=script_path, model_args=margs,
                            argv_after=tuple(after), env=env, slime_dir=self.slime_dir,
                            notes=tuple(notes + model_notes + env_notes), on_cluster=tuple(on_cluster.items()))

    def _model_flags(self, model) -> tuple[str | None, tuple[str, ...], list[str]]:
        """Where MODEL_ARGS come from: (slime's script on the cluster or None, the flags as a list, notes)."""
        if self.model_args is not None:
            return None, tuple(self.model_args), ["MODEL_ARGS given to the runner"]
        self.check_model(model)
        script = slime_model_script(model)
        if script:
            return os.path.join(self.slime_dir, script), (), []
        built, missing = launch_model_args(model)
        return None, tuple(model_args(model)), [
            f"slime has no scripts/models script for {model.display_name}: MODEL_ARGS from its config "
            f"(search_space.megatron_args.model_args)" + ("" if built is not None else f"; incomplete: {missing}")]

    def job_env(self, spec: TrialSpec) -> tuple[dict, dict, list[str]]:
        """(Ray's env_vars, the values computed on the cluster, notes): `slime_env` with each shell value of
        the format (NCCL_NVLS_ENABLE) left to the job's prelude unless the runner's env gives it, the
        runner's overrides, RAY_DEDUP_LOGS=0 (Ray would fold the per-rank hook lines, which differ only in
        numbers) and PYTHONUNBUFFERED=1."""
        env, on_cluster, notes = {}, {}, []
        for name, value in slime_env(spec.case.layout, spec.case.gpu).items():
            if name in self.env:
                continue
            if value.startswith("$("):
                if value not in SHELL_ENV_INPUTS:
                    raise RunnerError(f"{name}={value}: no rule to compute it on the cluster; set it in the "
                                      f"cluster file's env")
                on_cluster[name] = value
            else:
                env[name] = value
        env.update({str(k): str(v) for k, v in self.env.items()})
        env.setdefault("RAY_DEDUP_LOGS", "0")
        env.setdefault("PYTHONUNBUFFERED", "1")
        shell = sorted(k for k, v in env.items() if "$(" in v or "`" in v)
        if shell:
            raise RunnerError(f"env {', '.join(shell)}: a shell command would reach Ray's runtime_env as text; "
                              f"give the value")
        return env, on_cluster, notes

    def job_request(self, spec: TrialSpec, cmd: SlimeCommand | None = None) -> dict:
        """The Ray job the trial submits, as JSON-ready data: submit_job's entrypoint, submission_id,
        runtime_env (the working_dir is a folder made at submission holding `working_dir_files`) and
        metadata, plus the command as run and what the prelude computes on the cluster. Credential-like
        env values are shown as <redacted>."""
        cmd = cmd or self.command(spec)
        files = {name: {"from": path, "bytes": os.path.getsize(path), "sha256": _sha256(path)}
                 for name, path in SHIPPED_FILES.items()}
        return {
            "ray_address": self.address_shown,
            "submission_id": f"attune-{_slug(spec.case.layout.label)}-{uuid.uuid4().hex[:8]}",
            "entrypoint": cmd.entrypoint,
            "runtime_env": {"working_dir": "<a folder made at submission holding working_dir_files>",
                            "env_vars": _redacted(cmd.env)},
            "working_dir_files": files,
            "metadata": {METADATA_KEY: self.name, "layout": spec.case.layout.key()},
            "command": " ".join(w if w == str(MODEL_ARGS) else shlex.quote(w) for w in cmd.argv),
            "model_script": cmd.model_script,
            "computed_on_cluster": {name: f"{SHELL_ENV_INPUTS[expr]}; {name}={expr}" for name, expr in cmd.on_cluster},
            "notes": list(cmd.notes),
        }

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
                raise RunnerError(self._unreachable(e)) from None
            if not active:
                return time.monotonic() - start
            if time.monotonic() - start > self.queue_timeout_s:
                raise RunnerError(f"the Ray cluster at {self.address_shown} stayed busy with job(s) "
                                  f"{', '.join(active)} for {self.queue_timeout_s:.0f} s")
            time.sleep(self._limits.poll_interval_s)

    def limits(self) -> Limits:
        return self._limits

    def run(self, spec: TrialSpec) -> TrialResult:
        """Submit the trial's job, watch it to its end (or stop it), and summarise its log."""
        from ray.job_submission import JobStatus
        if self.client is None:
            raise RunnerError("the slime runner was made without a Ray connection (a dry run); it cannot run trials")
        steps, window = self.trial_steps(spec)
        cmd = self.command(spec)
        job = self.submit(spec, cmd)
        watch = JobWatch(self.client, job.job_id, self.limits(), submitted=job.monotonic, where=self.address_shown)
        status = watch.follow()
        finished_wall = time.time()
        text = watch.drain(last_step=window[1])
        info = self._job_info(job.job_id)
        wall_s = _wall_s(info, job.wall, finished_wall)
        details = self._job_facts(job, status, info, wall_s, steps, window, cmd)
        details["log_source"] = watch.log_source
        if self.log_dir:
            details["log_path"] = self._save_log(job.job_id, text)
        succeeded = status == JobStatus.SUCCEEDED and watch.stopped is None
        end = RunEnd(window, steps, details["exit_code"], succeeded, watch.stopped, wall_s)
        return summarize(spec, watch.log, text, end, source=f"slime on Ray at {self.address_shown}, job {job.job_id}",
                         runner=self.name, details=details)

    def submit(self, spec: TrialSpec, cmd: SlimeCommand) -> _Submitted:
        """Wait for a free cluster, then submit `job_request`'s job with the shipped files as its working
        directory."""
        queued_s = self.wait_for_free_cluster()
        request = self.job_request(spec, cmd)
        stage = tempfile.mkdtemp(prefix="attune-slime-job-")
        try:
            for name, path in SHIPPED_FILES.items():
                shutil.copyfile(path, os.path.join(stage, name))
            try:
                job_id, submitted_wall, submitted = submit_when_agent_up(
                    self.client, SUBMIT_AGENT_WAIT_S, self._limits.poll_interval_s,
                    entrypoint=request["entrypoint"], submission_id=request["submission_id"],
                    runtime_env={"working_dir": stage, "env_vars": cmd.env}, metadata=request["metadata"])
            except Exception as e:
                raise RunnerError(self._masked(f"cannot submit to the Ray cluster at {self.address_shown}: "
                                                f"{one_line(e)}")) from None
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
            "job_id": job.job_id, "ray_address": self.address_shown,
            "job_status": str(getattr(status, "value", status)), "exit_code": getattr(info, "driver_exit_code", None),
            "job_message": one_line(getattr(info, "message", "") or "")[:500],
            "queued_s": round(job.queued_s, 3), "wall_s": round(wall_s, 3), "steps_requested": steps,
            "window": list(window), "entrypoint_argv": cmd.argv, "env": _redacted(cmd.env),
            "computed_on_cluster": [name for name, _ in cmd.on_cluster], "notes": list(cmd.notes),
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


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "trial"


def _redacted(env: dict) -> dict:
    """The env for the record, without the values of credential-like variables (tokens, keys, passwords)."""
    secret = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(?:^|_)KEY(?:$|_)|API_KEY", re.IGNORECASE)
    return {k: ("<redacted>" if secret.search(k) else v) for k, v in env.items()}


__all__ = ["SlimeRunner", "SlimeCommand", "RunnerError", "summarize", "HOOK_PATH", "SHIPPED_FILES",
           "STARTUP_GRACE_S", "ASYNC_ENTRY", "wrapper_script"]
