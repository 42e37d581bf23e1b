"""SlimeRunner: the command it submits, and end to end on a real local Ray cluster (CPU only) with the slime
stand-in (tests/slime_standin.py, a test double of slime's train entry) in place of slime.

The Ray cluster is started once for the module (tests/ray_head.py: `ray start --head --block` in its own process
group, ports free below the ephemeral range, a private temp dir, dashboard on 127.0.0.1, proven by a first job)
and stopped by signalling that process group. If Ray or its Jobs API cannot start, these tests fail (they are
never skipped).

A loaded machine starts Ray jobs slowly: the end-to-end runs get a generous start-up grace (job start to the
first step line) apart from their step-hang timeout, the stand-in hangs only after step 1, and elapsed
seconds are checked only against generous upper bounds. The watch's limits themselves are tested on a
simulated clock.
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from cost_model.nouns.case import Case
from cost_model.nouns.workload import Workload
from experiments.runner import allocator_retries_per_step
from experiments.runner import FAILURE_CLASSES, TrialSpec
from experiments.slime.cluster import ClusterConfig
from experiments.slime.log import SlimeLog
from experiments.slime.runner import (ASYNC_ENTRY, HOOK_PATH, MODEL_ARGS_MARK, STARTUP_GRACE_S, RunnerError,
                                      SlimeRunner)
from experiments.slime.sft_rows import build_rows, write_rows
from experiments.slime.summary import RunEnd, summarize
from experiments.slime.watch import JobWatch, Limits
from recipes.slime_command import NVLS_EXPR, slime_run
from cost_model.nouns.layout import Layout
from ray_head import start_proven_head
from toy_tokenizer import ToyTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "slime_standin.py")
REFERENCE_LAYOUT = Layout(world_size=8, tp=1, pp=1, cp=1, ep=8, etp=1, max_tokens_per_gpu=8192,
                          recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
SMALL = Workload(seq_len=64, global_batch=4)
STEPS, WINDOW = 8, (2, 6)
# End to end on a loaded machine: Ray job start and Python imports may take long before the first step line.
STARTUP_GRACE, HANG, OVERALL = 300, 8, 300   # the stand-in logs a step every 0.05 s: 8 s between lines is a hang


# --- the command ------------------------------------------------------------------------------------------


class _NoClient:
    def list_jobs(self):
        return []


def _runner(tmp_path, limits=None, **kw):
    paths = dict(hf_checkpoint="/ckpt/hf", torch_dist="/ckpt/dist", sft_data="/data/rows.jsonl", profile_dir="/prof")
    paths.update(kw)
    return SlimeRunner(ClusterConfig(ray_address="127.0.0.1:1", slime_dir=str(tmp_path), **paths), limits,
                       client=_NoClient())


def _reference_words(run_text: str, runner: SlimeRunner) -> list[str]:
    """The recipe's command words, with the $VARS replaced by the runner's paths (test-side only)."""
    body = run_text.split("\n\n", 1)[1].replace("\\\n", " ")
    subst = {"$HF_CKPT": runner.paths["HF_CKPT"], "$TORCH_DIST": runner.paths["TORCH_DIST"],
             "$SFT_DATA": runner.paths["SFT_DATA"], "$PROFILE_DIR": runner.paths["PROFILE_DIR"]}
    return [subst.get(w, w) for w in shlex.split(body)]


# What the job does with the format's shorthand, written out here independently of the runner.
FORMAT_HEAD = ["python3", "-m", "<slime", "entry", "module>", "--async"]
REPLACED = {"--moe-enable-deepep": ["--moe-flex-dispatcher-backend", "deepep"]}
TRAIN_ENV = ["--train-env-vars", '{"NCCL_NVLS_ENABLE": "$NCCL_NVLS_ENABLE"}']


@pytest.mark.parametrize("layout", [
    REFERENCE_LAYOUT,
    Layout(world_size=16, tp=2, pp=2, vpp=2, cp=2, ep=8, etp=1, max_tokens_per_gpu=16384,
           recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"),
           optimizer_offload_fraction=1.0, overlap_d2h_h2d=True, dispatcher="flex"),
])
def test_command_is_the_recipes_run_in_the_form_slime_accepts(tmp_path, qwen36, h200, workload, layout):
    runner = _runner(tmp_path)
    cmd = runner.command(TrialSpec(Case(qwen36, h200, workload, layout)))
    recipe = _reference_words(slime_run(qwen36, h200, workload, layout, num_rollout=20), runner)
    assert recipe[:6] == FORMAT_HEAD
    body = [x for w in recipe[6:] for x in REPLACED.get(w, [w])]
    # `--async` names slime's train_async.py; no --async flag reaches slime
    assert cmd.argv == ["python3", ASYNC_ENTRY, *body, "--custom-megatron-before-train-step-hook-path",
                        HOOK_PATH, *TRAIN_ENV]
    assert "--async" not in cmd.argv and "--moe-enable-deepep" not in cmd.argv
    assert ("--moe-flex-dispatcher-backend" in cmd.argv) is (layout.dispatcher == "flex")
    assert not any("--moe-enable-deepep" in n for n in cmd.notes)   # recipes no longer carry it
    assert cmd.model_script == os.path.join(str(tmp_path), "scripts/models/qwen3.5-35B-A3B.sh")


def test_entry_and_the_synchronous_train(tmp_path, qwen36, h200, workload):
    spec = TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT))
    assert _runner(tmp_path).command(spec).argv_before[:2] == ("python3", "train_async.py")
    cmd = _runner(tmp_path, entry_module="train").command(spec)
    assert cmd.argv_before[:3] == ("python3", "-m", "train")
    assert any("synchronous" in n for n in cmd.notes)


def test_entrypoint_is_shlex_joined_and_splices_model_args(tmp_path, qwen36, h200, workload):
    runner = _runner(tmp_path, sft_data="/data/it's; rm -rf ~.jsonl")
    cmd = runner.command(TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT)))
    words = shlex.split(cmd.entrypoint)
    assert words[:2] == ["bash", "-c"] and words[4] == str(tmp_path)
    assert words[words.index(MODEL_ARGS_MARK) - 1] == "8"           # after --actor-num-gpus-per-node 8
    assert "/data/it's; rm -rf ~.jsonl" in words                      # one word, never shell text
    # NCCL_NVLS_ENABLE is computed by the job on the cluster, never passed to Ray as shell text
    assert "NCCL_NVLS_ENABLE" not in cmd.env and cmd.on_cluster == (("NCCL_NVLS_ENABLE", NVLS_EXPR),)
    assert cmd.env["RAY_DEDUP_LOGS"] == "0" and all("$(" not in v for v in cmd.env.values())
    assert "nvidia-smi topo -m" in words[2]
    given = _runner(tmp_path, env={"NCCL_NVLS_ENABLE": "0"}).command(TrialSpec(Case(qwen36, h200, workload,
                                                                                     REFERENCE_LAYOUT)))
    assert given.env["NCCL_NVLS_ENABLE"] == "0" and given.on_cluster == ()
    assert "nvidia-smi" not in given.entrypoint and "--train-env-vars" not in given.argv


def _run_wrapper(tmp_path, cmd, nvidia_smi: str | None):
    """Run the job's entrypoint here with bash: PATH has a fake nvidia-smi printing `nvidia_smi` (none when
    None); the entry prints its argv and NCCL_NVLS_ENABLE as JSON."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    smi = fake_bin / "nvidia-smi"
    if nvidia_smi is None:
        smi.unlink(missing_ok=True)
    else:
        smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{nvidia_smi}\nEOF\n")
        smi.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(cmd.entrypoint, shell=True, env=env, capture_output=True, text=True, timeout=60)


def test_the_prelude_computes_nvls_as_slime_scripts_do_and_passes_it_to_the_actors(tmp_path, qwen36, h200,
                                                                                      workload):
    import json
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "scripts" / "models" / "qwen3.5-35B-A3B.sh").write_text('MODEL_ARGS=(\n  --num-layers 40\n)\n')
    entry = tmp_path / "echo_entry.py"
    entry.write_text("import json, os, sys\nprint(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
                     "'nvls': os.environ.get('NCCL_NVLS_ENABLE')}))\n")
    runner = SlimeRunner(ClusterConfig(ray_address="127.0.0.1:1", slime_dir=str(slime), entry_module=str(entry),
                                       python=sys.executable, hf_checkpoint="/h", torch_dist="/t", sft_data="/s",
                                       profile_dir="/p"), client=_NoClient())
    cmd = runner.command(TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT)))
    topo = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X "
    for smi, expected in ((topo, "1"), ("\tGPU0\nGPU0\t X ", "0"), (None, "0")):
        done = _run_wrapper(tmp_path, cmd, smi)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.splitlines()[-1])
        assert out["nvls"] == expected and out["cwd"] == str(slime)
        argv = out["argv"]
        assert argv[argv.index("--actor-num-gpus-per-node") + 2:][:2] == ["--num-layers", "40"]   # MODEL_ARGS
        assert argv[-2:] == ["--train-env-vars", json.dumps({"NCCL_NVLS_ENABLE": expected})]
    (slime / "scripts" / "models" / "qwen3.5-35B-A3B.sh").unlink()
    done = _run_wrapper(tmp_path, cmd, topo)
    assert done.returncode == 2 and done.stdout.count("\n") == 1          # only the prelude's line
    assert done.stderr.strip() == (f"attune: the slime checkout {slime} has no "
                                   f"{slime}/scripts/models/qwen3.5-35B-A3B.sh (the model's MODEL_ARGS script)")


def test_model_scripts_are_checked_against_slimes_list(tmp_path, qwen36, h200, workload):
    from cost_model.nouns.model_spec import load_model
    from experiments.slime.model_scripts import SLIME_COMMIT, SLIME_MODEL_SCRIPTS
    from recipes.slime_command import _MODEL_SCRIPTS
    assert len(SLIME_MODEL_SCRIPTS) == 39 and "scripts/models/qwen3.5-35B-A3B.sh" in SLIME_MODEL_SCRIPTS
    missing = sorted(n for n, s in _MODEL_SCRIPTS.items() if s not in SLIME_MODEL_SCRIPTS)
    assert missing == ["qwen3.5-397b-a17b"]                  # on a pull-request branch only
    big = load_model("qwen3.5-397b-a17b")
    layout = Layout(world_size=64, ep=64, recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=1)
    with pytest.raises(RunnerError, match=r"^slime @624b824 has no scripts/models/qwen3.5-397B-A17B.sh "):
        _runner(tmp_path).command(TrialSpec(Case(big, h200, workload, layout)))
    with pytest.raises(RunnerError, match="qwen3.5-397B-A17B.sh"):
        _runner(tmp_path, slime_commit=SLIME_COMMIT[:9]).check_model(big)
    _runner(tmp_path, slime_commit="abcdef0").check_model(big)   # another checkout: checked on the cluster
    _runner(tmp_path).check_model(qwen36)


def test_deprecated_replacements_agree_with_megatrons_own_table():
    import json
    from recipes.slime_command import DEPRECATED_FLAGS
    data = json.loads(open(os.path.join(HERE, "data", "slime_megatron_args.json")).read())
    for old, (flag, value) in DEPRECATED_FLAGS.items():
        assert data["deprecated"][old] == f"{flag}={value}"
        assert value in data["options"][flag]["choices"]


def test_job_request_is_what_submit_sends(tmp_path, qwen36, h200, workload):
    from experiments.slime.runner import SHIPPED_FILES

    class Recorder(_NoClient):
        def submit_job(self, **kw):
            import pathlib
            self.kw = kw
            self.files = sorted(p.name for p in pathlib.Path(kw["runtime_env"]["working_dir"]).iterdir())
            return kw["submission_id"]

    runner = _runner(tmp_path, env={"HF_TOKEN": "secret", "WANDB_MODE": "offline"})
    runner.client = Recorder()
    spec = TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT))
    cmd = runner.command(spec)
    request = runner.job_request(spec, cmd)
    runner.submit(spec, cmd)
    sent = runner.client.kw
    assert sent["entrypoint"] == request["entrypoint"] == cmd.entrypoint
    assert sent["runtime_env"]["env_vars"] == cmd.env and sent["metadata"] == request["metadata"]
    assert request["runtime_env"]["env_vars"] == dict(cmd.env, HF_TOKEN="<redacted>")
    assert runner.client.files == sorted(SHIPPED_FILES) == sorted(request["working_dir_files"])
    assert list(request["computed_on_cluster"]) == ["NCCL_NVLS_ENABLE"]


def test_submit_waits_for_a_starting_head_nodes_job_agent_and_no_longer(tmp_path, qwen36, h200, workload, monkeypatch):
    """Ray answers 500 'No available agent to submit job' until a fresh head node's job agent is up: the submission
    is retried then (bounded by SUBMIT_AGENT_WAIT_S); any other error, or the agent still missing after it, is one
    RunnerError line."""
    import experiments.slime.runner as slime_runner
    monkeypatch.setattr(slime_runner.time, "sleep", lambda s: None)

    class Starting(_NoClient):
        def __init__(self, fails, message="Request failed with status code 500: No available agent to submit job"):
            self.fails, self.message, self.calls = fails, message, 0

        def submit_job(self, **kw):
            self.calls += 1
            if self.calls <= self.fails:
                raise RuntimeError(self.message)
            return kw["submission_id"]

    runner = _runner(tmp_path)
    spec = TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT))
    cmd = runner.command(spec)
    runner.client = Starting(fails=3)
    assert runner.submit(spec, cmd).job_id.startswith("attune-tp1-pp1-ep8-dp8-")
    assert runner.client.calls == 4
    runner.client = Starting(fails=1, message="Request failed with status code 400: bad runtime_env")
    with pytest.raises(RunnerError, match="^cannot submit to the Ray cluster at .*400: bad runtime_env$"):
        runner.submit(spec, cmd)
    assert runner.client.calls == 1
    monkeypatch.setattr(slime_runner, "SUBMIT_AGENT_WAIT_S", 0.0)
    runner.client = Starting(fails=10)
    with pytest.raises(RunnerError, match="No available agent"):
        runner.submit(spec, cmd)
    assert runner.client.calls == 1


def test_recorded_env_hides_credentials():
    from experiments.slime.runner import _redacted
    env = {"HF_TOKEN": "hf_x", "WANDB_API_KEY": "k", "NCCL_NVLS_ENABLE": "1"}
    assert _redacted(env) == {"HF_TOKEN": "<redacted>", "WANDB_API_KEY": "<redacted>", "NCCL_NVLS_ENABLE": "1"}


def test_command_checks_paths_and_window(tmp_path, qwen36, h200, workload):
    with pytest.raises(RunnerError, match=r"^the slime backend needs the cluster path sft_data \(\$SFT_DATA, "
                                          r"slime's --prompt-data; or --sft-data\)"):
        _runner(tmp_path, sft_data=None).command(TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT)))
    with pytest.raises(RunnerError, match="window"):
        _runner(tmp_path).command(TrialSpec(Case(qwen36, h200, workload, REFERENCE_LAYOUT), steps=5, window=(5, 19)))


@pytest.mark.ray   # the Jobs API client needs ray[default]
def test_unreachable_address_is_a_runner_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RunnerError, match=rf"^cannot reach the Ray cluster at http://127.0.0.1:{port}: "):
        SlimeRunner(ClusterConfig(ray_address=f"127.0.0.1:{port}", slime_dir=str(tmp_path)))


def test_core_ray_without_the_jobs_api_names_ray_default(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else real(name, *a))
    with pytest.raises(RunnerError, match=r"needs ray\[default\] \(missing here: aiohttp\); pip install 'ray\[default\]'"):
        SlimeRunner(ClusterConfig(ray_address="127.0.0.1:1", slime_dir=str(tmp_path)))


def test_summarize_reports_the_window(qwen36, h200):
    spec = TrialSpec(Case(qwen36, h200, SMALL, REFERENCE_LAYOUT), steps=STEPS, window=WINDOW)
    lines = []
    for k in range(STEPS):
        lines.append(f"[2026-10-13 08:00:{10 + 2 * k:02d}] model.py:918 - step {k}: {{'train/loss': {3 - 0.1 * k}, "
                     f"'train/grad_norm': 0.5, 'train/step': {k}}}")
        lines.append(f"[2026-10-13 08:00:{10 + 2 * k:02d}] train_metric_utils.py:401 - perf {k}: "
                     f"{{'perf/train_wait_time': 0.5, 'perf/train_time': {1.5 + 0.1 * (k % 2)}, 'perf/step_time': "
                     f"{2.0 + 0.1 * (k % 2)}}}")
        lines += [f"attune-peak-memory rank={r} rollout={k} step_id=0 step={k} allocated_bytes={(r + 1) * 2 ** 30} "
                  f"reserved_bytes={(r + 2) * 2 ** 30} device={r}" for r in range(8)]
    text = "\n".join(lines) + "\n"
    result = summarize(spec, SlimeLog.from_text(text), text, RunEnd(WINDOW, STEPS, exit_code=0, succeeded=True,
                                                                    stopped=None, wall_s=3600.0), source="test")
    times = [2.0 + 0.1 * (k % 2) for k in range(2, 7)]
    assert result.status == "ok" and result.kind == "measured"
    assert result.tokens_per_s_per_gpu == pytest.approx(5 * 4 * 64 / sum(times) / 8)
    assert result.step_times_s == pytest.approx(times)
    assert result.peak_memory_gib == 8.0 and result.peak_memory_gib_per_rank == tuple(float(r + 1) for r in range(8))
    assert result.gpu_hours == pytest.approx(8.0) and len(result.losses) == STEPS
    failed = summarize(spec, SlimeLog.from_text(text), text, RunEnd((2, 9), 10, exit_code=0, succeeded=True,
                                                                    stopped=None, wall_s=1.0), source="test")
    assert failed.status == "failed" and failed.failure_class == "crash" and "8..9" in failed.detail


# --- the watch's limits, on a simulated clock -------------------------------------------------------------


class _SimulatedJob:
    """A JobSubmissionClient stand-in and a clock: the job starts at `starts_at` and prints a step line at
    each time of `step_at` (step k at step_at[k]); sleeping advances the clock, nothing waits."""

    def __init__(self, step_at=(), starts_at=2.0, ends_at=None):
        self.now, self.starts_at, self.ends_at = 0.0, starts_at, ends_at
        self.step_at, self.stopped_at = list(step_at), None

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def get_job_status(self, job_id):
        from ray.job_submission import JobStatus
        if self.stopped_at is not None:
            return JobStatus.STOPPED
        if self.ends_at is not None and self.now >= self.ends_at:
            return JobStatus.SUCCEEDED
        return JobStatus.RUNNING if self.now >= self.starts_at else JobStatus.PENDING

    def get_job_logs(self, job_id):
        return "".join(f"[2026-10-13 08:00:00] model.py:918 - step {k}: {{'train/loss': 2.0}}\n"
                       for k, t in enumerate(self.step_at) if t <= self.now)

    def stop_job(self, job_id):
        self.stopped_at = self.now


def _watch(job, startup_grace_s=600.0, hang_timeout_s=30.0, timeout_s=3600.0):
    limits = Limits(startup_grace_s=startup_grace_s, hang_timeout_s=hang_timeout_s, timeout_s=timeout_s,
                    poll_interval_s=1.0)
    watch = JobWatch(job, "job-1", limits, submitted=0.0, where="http://head:8265", clock=job.clock,
                     sleep=job.sleep)
    status = watch.follow()
    watch.drain()
    return watch, status


def test_a_slow_start_is_not_a_hang():
    # model load takes 500 s, far beyond the 30 s step-hang timeout but within the start-up grace
    job = _SimulatedJob(step_at=[500, 510, 520], ends_at=530)
    watch, status = _watch(job)
    assert status.value == "SUCCEEDED" and watch.stopped is None and job.stopped_at is None
    assert watch.log.last_step == 2


def test_the_start_up_grace_and_the_step_hang_timeout_stop_a_job():
    job = _SimulatedJob(step_at=[])
    watch, status = _watch(job)
    assert watch.stopped == "no new step line for 600 s after the job started; stopped"
    assert status.value == "STOPPED" and job.stopped_at == pytest.approx(2 + 601)
    job = _SimulatedJob(step_at=[400, 410])
    watch, _ = _watch(job)
    assert watch.stopped == "no new step line for 30 s after step 1; stopped"
    assert job.stopped_at == pytest.approx(410 + 31)


def test_the_overall_limit_counts_from_submission():
    job = _SimulatedJob(step_at=[100 + 20 * k for k in range(100)], starts_at=50)
    watch, _ = _watch(job, timeout_s=300)
    assert watch.stopped == "stopped at the overall limit of 300 s (steps up to 10 logged)"
    assert job.stopped_at == pytest.approx(301)


class _StreamingJob:
    """A client whose job streams `chunks` through tail_job_logs (an async generator, as Ray's) and ends;
    `break_at`: the stream fails with Ray's error before that chunk. get_job_logs returns the whole log."""

    def __init__(self, chunks, break_at=None):
        self.chunks, self.break_at = chunks, break_at
        self.finished = threading.Event()
        self.get_job_logs_calls = 0

    def get_job_status(self, job_id):
        from ray.job_submission import JobStatus
        return JobStatus.SUCCEEDED if self.finished.is_set() else JobStatus.RUNNING

    async def tail_job_logs(self, job_id):
        import asyncio
        for i, chunk in enumerate(self.chunks):
            if i == self.break_at:
                threading.Timer(0.3, self.finished.set).start()
                raise RuntimeError("WebSocket connection closed unexpectedly with close code 1006")
            await asyncio.sleep(0.02)
            yield chunk
        self.finished.set()

    def get_job_logs(self, job_id):
        self.get_job_logs_calls += 1
        return "".join(self.chunks) if self.finished.is_set() else "".join(self.chunks[:self.break_at])

    def stop_job(self, job_id):
        raise AssertionError("a job within its limits is never stopped")


def _step_chunks(n):
    return [f"[2026-10-13 08:00:00] model.py:918 - step {k}: {{'train/loss': 2.0}}\n" for k in range(n)]


def test_the_log_is_streamed_not_downloaded_again():
    chunks = _step_chunks(12)
    job = _StreamingJob(chunks)
    watch = JobWatch(job, "job-1", Limits(startup_grace_s=60, hang_timeout_s=30, timeout_s=120, poll_interval_s=0.05),
                     submitted=time.monotonic(), where="http://head:8265")
    t = time.monotonic()
    assert watch.follow().value == "SUCCEEDED"
    assert watch.drain() == "".join(chunks) and watch.log.last_step == 11
    assert job.get_job_logs_calls == 0 and watch.log_source == "tail_job_logs"
    assert time.monotonic() - t < 30
    assert not any(th.name.startswith("attune-log-tail") for th in threading.enumerate())


def test_a_broken_stream_falls_back_to_the_rest_of_the_log():
    chunks = _step_chunks(10)
    job = _StreamingJob(chunks, break_at=4)
    watch = JobWatch(job, "job-1", Limits(startup_grace_s=60, hang_timeout_s=30, timeout_s=120, poll_interval_s=0.05),
                     submitted=time.monotonic(), where="http://head:8265")
    assert watch.follow().value == "SUCCEEDED"
    assert watch.drain() == "".join(chunks)                     # each line once: read on from the offset
    assert watch.log.last_step == 9 and job.get_job_logs_calls >= 1
    assert watch.log_source.startswith("get_job_logs (the stream broke: WebSocket connection closed")


class _EarlyEndingStream(_StreamingJob):
    """Ray's stream ending cleanly with the job, before the job's last lines went out (seen on a loaded machine)."""

    async def tail_job_logs(self, job_id):
        import asyncio
        for chunk in self.chunks[:-2]:
            await asyncio.sleep(0.02)
            yield chunk
        self.finished.set()


def test_a_stream_that_ends_before_the_needed_step_is_read_on_from_the_whole_log():
    chunks = _step_chunks(8)
    job = _EarlyEndingStream(chunks)
    watch = JobWatch(job, "job-1", Limits(startup_grace_s=60, hang_timeout_s=30, timeout_s=120, poll_interval_s=0.05),
                     submitted=time.monotonic(), where="http://head:8265")
    assert watch.follow().value == "SUCCEEDED"
    assert watch.drain(last_step=7) == "".join(chunks) and watch.log.last_step == 7
    assert job.get_job_logs_calls == 1 and watch.log_source == "tail_job_logs (the end from get_job_logs)"


def test_start_up_grace_defaults_to_at_least_the_step_hang_timeout(tmp_path):
    assert _runner(tmp_path, Limits(hang_timeout_s=60)).limits().startup_grace_s == STARTUP_GRACE_S
    assert _runner(tmp_path, Limits(hang_timeout_s=2 * STARTUP_GRACE_S)).limits().startup_grace_s == 2 * STARTUP_GRACE_S
    assert _runner(tmp_path, Limits(hang_timeout_s=60, startup_grace_s=30)).limits().startup_grace_s == 30


# --- end to end on a local Ray cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray head with the Jobs API (tests/ray_head.py: ports below the ephemeral range, proven by a first job,
    started once more if it fails to come up); yields it (its dashboard address and a client). A head that died while
    the module's tests ran is an error at teardown, with its log's end."""
    try:
        from ray.job_submission import JobSubmissionClient  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the Ray end-to-end tests need ray[default] in the test environment: {e}")
    # Token authentication with a token of our own: Ray 2.60 turns token auth on by itself whenever
    # ~/.ray/auth_token exists (other sessions may create it), and the client must then send the token.
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
    from ray._private.authentication_test_utils import reset_auth_token_state
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": generate_new_authentication_token()}
    saved = {k: os.environ.get(k) for k in (*auth, "RAY_AUTH_TOKEN_PATH")}
    os.environ.update(auth)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    reset_auth_token_state()
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    head = None
    try:
        try:
            head = start_proven_head(env)
        except RuntimeError as e:
            pytest.fail(str(e))
        yield head                                      # its .address (the dashboard) and .client
        died = None if head.alive() else (f"the Ray head exited ({head.proc.poll()}) while the tests ran:\n"
                                          f"{head.log_tail()}")
    finally:
        t = time.monotonic()
        if head is not None:
            head.stop()
            shutil.rmtree(head.temp_dir, ignore_errors=True)
        print(f"ray head stopped in {time.monotonic() - t:.1f} s")
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_auth_token_state()
    if died:
        pytest.fail(died)


@pytest.fixture(scope="module")
def fake_slime(tmp_path_factory):
    """A fake slime checkout (scripts/models/*.sh defining MODEL_ARGS) and pre-tokenized rows."""
    root = tmp_path_factory.mktemp("slime")
    script = root / "scripts" / "models" / "qwen3.5-35B-A3B.sh"
    script.parent.mkdir(parents=True)
    script.write_text('NLAYERS=40\nMODEL_ARGS=(\n   --num-layers "$NLAYERS"\n   --hidden-size 2048\n)\n')
    conversations = [[{"role": "user", "content": f"question {i} " * (1 + i % 5)},
                      {"role": "assistant", "content": f"answer {i} " * (1 + i % 7)}] for i in range(200)]
    result = build_rows(conversations, ToyTokenizer(), row_tokens=SMALL.seq_len, seed=7, max_rows=40)
    rows = str(root / "rows.jsonl")
    write_rows(result, rows)
    return SimpleNamespace(slime_dir=str(root), rows=rows, n_rows=len(result.rows))


def _run(ray_cluster, fake_slime, spec, fail=None, **kw):
    env = {"ATTUNE_STANDIN_STEP_S": "0.05"}
    if fail:
        env["ATTUNE_STANDIN_FAIL"] = fail
    env.update(kw.pop("env", {}))
    cluster = ClusterConfig(ray_address=ray_cluster.address, slime_dir=fake_slime.slime_dir, entry_module=STANDIN,
                            python=sys.executable, env=env, hf_checkpoint="/nonexistent/hf",
                            torch_dist="/nonexistent/dist", sft_data=fake_slime.rows, profile_dir="/nonexistent/prof",
                            log_dir=os.environ.get("ATTUNE_TEST_LOG_DIR"))     # keep the job logs when set
    # drain_s: Ray ends a job's log stream seconds after the job (about 4 s here); these jobs read the rest from
    # get_job_logs at once instead, the path a stream that ends short takes
    limits = dict(startup_grace_s=STARTUP_GRACE, hang_timeout_s=HANG, timeout_s=OVERALL, poll_interval_s=0.25,
                  drain_s=0.5)
    limits.update({k: kw.pop(k) for k in list(kw) if k in limits})
    runner = SlimeRunner(cluster, Limits(**limits), **kw)
    t = time.monotonic()
    result = runner.run(spec)
    return result, time.monotonic() - t


@pytest.fixture(scope="module")
def small_spec(qwen36, h200):
    return TrialSpec(Case(qwen36, h200, SMALL, REFERENCE_LAYOUT), steps=STEPS, window=WINDOW)


@pytest.mark.ray
@pytest.mark.slow
def test_successful_trial_end_to_end(ray_cluster, fake_slime, small_spec):
    result, took = _run(ray_cluster, fake_slime, small_spec)
    print(f"success trial: {took:.1f} s")
    assert result.status == "ok", (result.failure_class, result.detail, result.details.get("log_tail"))
    assert result.kind == "measured" and result.runner == "slime"
    assert result.source.startswith(f"slime on Ray at {ray_cluster.address}, job attune-")
    assert result.tokens_per_s_per_gpu > 0
    assert len(result.step_times_s) == WINDOW[1] - WINDOW[0] + 1
    assert result.details["time_source"] == "perf/step_time"
    window_wall = sum(result.step_times_s)
    assert result.tokens_per_s_per_gpu == pytest.approx(5 * SMALL.global_batch * SMALL.seq_len / window_wall / 8)
    assert result.details["window_tokens"] == 5 * SMALL.global_batch * SMALL.seq_len
    assert len(result.losses) == STEPS and result.losses[0] == pytest.approx(2.5)
    # the hook ran in the Ray actor for all 8 simulated ranks; the last line per rank is step 7's
    assert len(result.peak_memory_gib_per_rank) == 8
    assert result.peak_memory_gib == pytest.approx((40 * 1024 + 64 * 7 + 8 * 7) / 1024)
    assert result.details["peak_reserved_gib_per_rank"]["0"] == pytest.approx((40 * 1024 + 56 + 2048) / 1024, abs=1e-3)
    assert result.gpu_hours > 0 and result.step_time_cv_percent is not None
    assert result.details["exit_code"] == 0
    assert allocator_retries_per_step(result.details) == 0   # the hook counted the allocator's retries: none


@pytest.mark.ray
@pytest.mark.slow
def test_a_slime_trial_short_of_memory_reports_its_allocator_retries(ray_cluster, fake_slime, small_spec):
    """A run whose allocator retried every step says so in the runner's form (the tuner reads it as strained)."""
    result, _ = _run(ray_cluster, fake_slime, small_spec, env={"ATTUNE_STANDIN_RETRIES_PER_STEP": "16"})
    assert result.status == "ok", (result.failure_class, result.detail)
    assert allocator_retries_per_step(result.details) == 16
    assert set(result.details["allocator_churn_per_rank"]) == {str(r) for r in range(8)}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("fail, expected", [
    ("cuda_oom", "cuda_oom"),
    ("host_oom", "host_oom"),
    ("host_oom_kill", "host_oom"),
    ("nccl_timeout", "nccl_timeout"),
    ("crash", "crash"),
    ("invalid_config", "invalid_config"),
    ("invalid_args", "invalid_config"),
])
def test_failure_classes_end_to_end(ray_cluster, fake_slime, small_spec, fail, expected):
    # the host OOMs happen in the driver (Ray's OOM error reaches it; the kernel kills it): no actors needed
    env = {"ATTUNE_STANDIN_RAY": "0"} if fail.startswith("host_oom") else {}
    result, took = _run(ray_cluster, fake_slime, small_spec, fail=fail, env=env)
    print(f"{fail}: {took:.1f} s, exit {result.details.get('exit_code')}: {result.detail[:120]}")
    assert result.status == "failed" and result.kind == "measured"
    assert result.failure_class == expected, (result.detail, result.details.get("log_tail"))
    assert expected in FAILURE_CLASSES and result.gpu_hours > 0


@pytest.mark.ray
@pytest.mark.slow
def test_hang_is_stopped(ray_cluster, fake_slime, small_spec):
    # the stand-in logs steps 0 and 1, then hangs in step 2: the step-hang timeout stops it, not the start-up grace
    result, took = _run(ray_cluster, fake_slime, small_spec, fail="hang", env={"ATTUNE_STANDIN_FAIL_AT": "2"})
    print(f"hang: {took:.1f} s: {result.detail}")
    assert result.status == "failed" and result.failure_class == "hang"
    assert f"no new step line for {HANG} s after step 1" in result.detail
    assert result.details["job_status"] == "STOPPED"
    assert took < 120


@pytest.mark.ray
@pytest.mark.slow
def test_overall_timeout_stops_the_job(ray_cluster, fake_slime, small_spec):
    result, took = _run(ray_cluster, fake_slime, small_spec, fail="hang", hang_timeout_s=60, timeout_s=4,
                        env={"ATTUNE_STANDIN_RAY": "0"})
    print(f"overall timeout: {took:.1f} s: {result.detail}")
    assert result.failure_class == "hang" and "overall limit of 4 s" in result.detail and took < 120


@pytest.mark.ray
@pytest.mark.slow
def test_waits_for_our_running_job(ray_cluster, fake_slime, small_spec):
    from experiments.slime.runner import METADATA_KEY, submit_when_agent_up
    client = ray_cluster.client
    sleeper = shlex.join([sys.executable, "-c", "import time; time.sleep(30)"])
    # the test's own submissions wait for the head node's job agent as the runner's do (a loaded machine brings it
    # up late)
    busy, _, _ = submit_when_agent_up(client, 120, 0.5, entrypoint=sleeper, metadata={METADATA_KEY: "slime"})
    other, _, _ = submit_when_agent_up(client, 120, 0.5, entrypoint=sleeper)
    try:
        deadline = time.monotonic() + 120       # a pending job counts as busy too: this only saves a poll
        while client.get_job_status(busy).value != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        t = time.monotonic()
        with pytest.raises(RunnerError, match=rf"stayed busy with job\(s\) {busy} for 1 s"):
            _run(ray_cluster, fake_slime, small_spec, queue_timeout_s=1)
        assert time.monotonic() - t < 120
    finally:
        client.stop_job(busy)
        client.stop_job(other)
    deadline = time.monotonic() + 120
    while not client.get_job_status(busy).is_terminal() and time.monotonic() < deadline:
        time.sleep(0.2)
    runner = SlimeRunner(ClusterConfig(ray_address=ray_cluster.address, slime_dir=fake_slime.slime_dir),
                         Limits(poll_interval_s=0.2), queue_timeout_s=120)
    assert runner.wait_for_free_cluster() < 120        # the job without our metadata does not count


@pytest.mark.ray
@pytest.mark.slow
def test_cluster_with_token_auth_refuses_a_client_without_the_token(ray_cluster, fake_slime, monkeypatch):
    from ray._private.authentication_test_utils import reset_auth_token_state
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    reset_auth_token_state()
    try:
        with pytest.raises(RunnerError, match=r"^cannot reach the Ray cluster at .*(?i:auth)"):
            SlimeRunner(ClusterConfig(ray_address=ray_cluster.address, slime_dir=fake_slime.slime_dir))
    finally:
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        reset_auth_token_state()
    SlimeRunner(ClusterConfig(ray_address=ray_cluster.address, slime_dir=fake_slime.slime_dir))   # with the token again


class _FlakyRunner(SlimeRunner):
    """The second trial crashes and the third hangs, as real trials do."""

    calls = 0

    def run(self, spec):
        type(self).calls += 1
        self.env.pop("ATTUNE_STANDIN_FAIL", None)
        if self.calls in (2, 3):
            self.env["ATTUNE_STANDIN_FAIL"] = {2: "crash", 3: "hang"}[self.calls]   # in step 2, after step 1
        return super().run(spec)


@pytest.mark.ray
@pytest.mark.slow
def test_study_loop_on_ray_records_failures_and_goes_on(ray_cluster, fake_slime, qwen36, h200, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from candidates import fitting_candidates
    from search_space.enumerate import SpaceOptions
    from cost_model.nouns.stack import Stack
    from tuner.agent import AgentProposer
    from cost_model.nouns.layout_codec import to_optuna_params
    from tuner.study import StudyConfig, load_or_create, open_storage, run_study

    workload = Workload(seq_len=64, global_batch=8)
    config = StudyConfig(qwen36, h200, 8, workload, Stack(), SpaceOptions(), steps=STEPS, window=WINDOW)
    candidates = fitting_candidates(qwen36, h200, workload, every=40)
    study = load_or_create(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "ray", config)
    cluster = ClusterConfig(ray_address=ray_cluster.address, slime_dir=fake_slime.slime_dir, entry_module=STANDIN,
                            python=sys.executable, hf_checkpoint="/n/hf", torch_dist="/n/dist",
                            sft_data=fake_slime.rows, profile_dir="/n/prof",
                            env={"ATTUNE_STANDIN_STEP_S": "0.05", "ATTUNE_STANDIN_FAIL_AT": "2"})
    runner = _FlakyRunner(cluster, Limits(startup_grace_s=STARTUP_GRACE, hang_timeout_s=HANG, timeout_s=OVERALL,
                                          poll_interval_s=0.25, drain_s=0.5))
    # every trial runs (stop_margin=None): this is about failures, not about when the agent stops (test_agent)
    agent = AgentProposer(candidates, to_optuna_params, stop_margin=None)
    summary = run_study(study, config, runner, agent, trials=4, progress=False)
    assert (summary.completed, summary.failed) == (2, 2)
    trials = optuna.load_study(study_name="ray", storage=f"sqlite:///{tmp_path / 's.db'}").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["fail_reason"].startswith("crash")
    assert trials[2].user_attrs["fail_reason"].startswith("hang")
    for t in (trials[0], trials[3]):
        assert t.user_attrs["result"]["kind"] == "measured" and t.user_attrs["backend"] == "slime"
        assert t.user_attrs["prediction"]["kind"] == "predicted"  # measurement and prediction side by side
        assert t.value == t.user_attrs["result"]["tokens_per_s_per_gpu"] > 0
