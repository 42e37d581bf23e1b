"""slime's log lines, the failure classes, the peak-memory hook, the SFT row builder and the pre-tokenized
rollout function. No Ray, no GPU, no slime: the lines are produced with slime's own format strings
(THUDM/slime @624b824):

- slime/observability/logging_utils.py:21   format=f"[%(asctime)s{prefix}] %(filename)s:%(lineno)d - %(message)s",
                                            datefmt="%Y-%m-%d %H:%M:%S" (prefix "")
- slime/backends/megatron_utils/model.py:918 logger.info(f"{role_tag}step {accumulated_step_id}: {log_dict}")
- slime/observability/train_metric_utils.py:401 logger.info(f"perf {rollout_id}: {log_dict}")
- slime/observability/train_metric_utils.py:135 logger.info(f"{metric_name} {rollout_id}: {reduced_log_dict}")
- slime/observability/timer.py:32            logger.info(f"Timer {name} end (elapsed: {elapsed_time:.1f}s)")
- Ray's worker-output prefix, as Ray 2.60 wrote it in a job log here:
  "\\x1b[36m(MegatronTrainRayActor pid=16376)\\x1b[0m ".
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import struct
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from experiments.slime import pretokenized_sft_rollout as rollout_mod
from experiments.slime.hooks import peak_memory_hook as hook_mod
from experiments.slime.log import (MetricsEvent, PeakMemoryEvent, PerfEvent, SlimeLog, StepEvent, TimerEvent,
                                  WindowError, classify_failure, failure_evidence, parse_dict, parse_line,
                                  step_time_cv_percent)
from experiments.slime.sft_rows import (RowsError, build_rows, qwen3_5_loss_mask, rows_sha256, segment_loss_mask,
                                        write_rows)
from toy_tokenizer import ToyTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAY_PREFIX = "\x1b[36m(MegatronTrainRayActor pid=16376)\x1b[0m "

# --- slime's formats, reproduced with the logging module ----------------------------------------------------

_FORMATTER = logging.Formatter(fmt="[%(asctime)s] %(filename)s:%(lineno)d - %(message)s", datefmt="%Y-%m-%d %H:%M:%S")


def slime_line(msg: str, path: str, lineno: int, when: float = 1791878462.0) -> str:
    record = logging.LogRecord("slime", logging.INFO, path, lineno, msg, None, None)
    record.created = when
    return _FORMATTER.format(record)


def step_line(step: int, log_dict: dict, role_tag: str = "", **kw) -> str:
    return slime_line(f"{role_tag}step {step}: {log_dict}", "/root/slime/slime/backends/megatron_utils/model.py",
                      918, **kw)


def perf_line(rollout_id: int, log_dict: dict, **kw) -> str:
    return slime_line(f"perf {rollout_id}: {log_dict}", "/root/slime/slime/observability/train_metric_utils.py", 401,
                      **kw)


def timer_line(name: str, elapsed_time: float, **kw) -> str:
    return slime_line(f"Timer {name} end (elapsed: {elapsed_time:.1f}s)", "/root/slime/slime/observability/timer.py",
                      32, **kw)


def sft_step_dict(step, loss=1.2345, grad_norm=0.5):
    # the keys model.py:train logs for --loss-type sft_loss with one param group
    return {"train/loss": loss, "train/grad_norm": grad_norm, "train/lr-pg_0": 9.5e-06, "train/lr-pg_1": 9.5e-06,
            "train/global_batch_size": 128, "train/step": step}


def perf_dict(train_wait, train, actor_train=None, tok=1e5):
    actor_train = train - 0.2 if actor_train is None else actor_train
    d = {"perf/train_wait_time": train_wait, "perf/data_preprocess_time": 0.05, "perf/actor_train_time": actor_train,
         "perf/train_time": train, "perf/actor_train_tflops": 123.4, "perf/actor_train_tok_per_s": tok}
    d["perf/step_time"] = train_wait + train
    d["perf/wait_time_ratio"] = train_wait / (train_wait + train)
    return d


# --- parse_line -----------------------------------------------------------------------------------------------


def test_step_line_exactly_as_slime_prints_it():
    line = RAY_PREFIX + step_line(7, sft_step_dict(7))
    assert line.startswith(RAY_PREFIX + "[2026-10-13 ") and " model.py:918 - step 7: {'train/loss': 1.2345" in line
    e = parse_line(line)
    assert isinstance(e, StepEvent) and e.step == 7 and e.role == "actor"
    assert e.metrics == sft_step_dict(7) and e.source == "model.py:918"
    assert e.actor == "MegatronTrainRayActor pid=16376" and e.timestamp.year == 2026


def test_nan_and_inf_tokens_and_critic_role():
    line = step_line(3, {"train/loss": float("nan"), "train/grad_norm": float("inf"), "train/x": -float("inf")},
                     role_tag="critic-")
    assert "'train/loss': nan" in line and "'train/grad_norm': inf" in line and "-inf" in line
    e = parse_line(line)
    assert e.role == "critic" and math.isnan(e.metrics["train/loss"])
    assert e.metrics["train/grad_norm"] == math.inf and e.metrics["train/x"] == -math.inf


def test_perf_timer_and_metrics_lines():
    p = parse_line(RAY_PREFIX + perf_line(4, perf_dict(1.5, 12.3)))
    assert isinstance(p, PerfEvent) and p.rollout == 4 and p.metrics["perf/step_time"] == pytest.approx(13.8)
    t = parse_line("(MegatronTrainRayActor pid=88, ip=10.0.0.2) " + timer_line("actor_train", 12.34) +
                   " [repeated 7x across cluster]")
    assert isinstance(t, TimerEvent) and t.name == "actor_train" and t.elapsed_s == 12.3
    assert t.actor == "MegatronTrainRayActor pid=88, ip=10.0.0.2"
    m = parse_line(slime_line(f"rollout 2: {{'rollout/response_lengths': 8191.0, 'rollout/rewards': 0.0}}",
                              "/x/train_metric_utils.py", 135))
    assert isinstance(m, MetricsEvent) and m.kind == "rollout" and m.index == 2


def test_numpy_reprs_and_non_literal_values():
    assert parse_dict("{'a': np.float64(1.5), 'b': np.int64(3)}") == {"a": 1.5, "b": 3}
    assert parse_dict("{'train/loss': 2.5, 'train/grad_norm': tensor(0.5, device='cuda:0')}") == {"train/loss": 2.5}


def test_other_lines_are_not_events():
    for line in ["", "Timer actor_train start", slime_line("Timer actor_train start", "/x/timer.py", 24),
                 slime_line("import pretokenized_sft_rollout.generate_rollout as generate_rollout function.",
                            "/x/rollout.py", 396),
                 "2026-11-29 21:28:50,021\tINFO worker.py:1691 -- Using address 192.0.2.2:26379",
                 "[rank0]:[E1129 21:36:15.123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught ..."]:
        assert parse_line(line) is None


def test_peak_memory_line_round_trip(monkeypatch, capsys):
    monkeypatch.setattr(hook_mod, "_memory_stats", lambda: (5 * 2 ** 30, 6 * 2 ** 30, 3, 7))
    monkeypatch.setattr(hook_mod, "_rank", lambda: 11)
    args = SimpleNamespace(rollout_batch_size=256, n_samples_per_prompt=1, global_batch_size=128)
    line = hook_mod.record_peak_memory(args, 4, 1, None, None, None)
    assert capsys.readouterr().out == line + "\n"
    e = parse_line(RAY_PREFIX + line)
    assert isinstance(e, PeakMemoryEvent)
    assert (e.rank, e.rollout, e.step_id, e.step, e.device) == (11, 4, 1, 9, 3)
    assert (e.allocated_bytes, e.reserved_bytes, e.alloc_retries) == (5 * 2 ** 30, 6 * 2 ** 30, 7)
    # a line from a hook before the allocator's count: no retries field, read as unknown
    old = parse_line(RAY_PREFIX + line.replace(" alloc_retries=7", ""))
    assert old.alloc_retries is None and old.allocated_bytes == e.allocated_bytes


def test_hook_without_cuda_prints_nothing(capsys):
    # torch here is a CPU build: no CUDA, so no line and no error
    assert hook_mod.record_peak_memory(SimpleNamespace(), 0, 0, None, None, None) is None
    assert capsys.readouterr().out == ""


def test_hook_and_rollout_modules_import_without_torch_or_slime():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['slime'] = None\n"
            "import experiments.slime.hooks.peak_memory_hook as h, experiments.slime.pretokenized_sft_rollout as r\n"
            "print(h.record_peak_memory(object(), 0, 0, None, None, None))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_hook_signature_matches_slimes_call():
    # model.py:561: custom_before_train_step_hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)
    import inspect
    from experiments.slime.runner import HOOK_PATH, SHIPPED_FILES
    params = list(inspect.signature(hook_mod.record_peak_memory).parameters)
    assert params == ["args", "rollout_id", "step_id", "model", "optimizer", "opt_param_scheduler"]
    module, _, func = HOOK_PATH.rpartition(".")        # slime's load_function: import_module + getattr
    assert func == hook_mod.HOOK_FUNCTION and SHIPPED_FILES[module + ".py"] == hook_mod.__file__


# --- SlimeLog ---------------------------------------------------------------------------------------------


def _run_text(steps=20, per_step_s=2, waits=None, with_perf=True, peak=True):
    lines = []
    t0 = 1791878400.0
    for k in range(steps):
        t = t0 + 30 + per_step_s * k
        if peak:
            for rank in range(8):
                lines.append(RAY_PREFIX + hook_mod.format_line(rank, k, 0, k, (rank + 1 + k) * 2 ** 28,
                                                               (rank + 2 + k) * 2 ** 28, rank))
        lines.append(RAY_PREFIX + step_line(k, sft_step_dict(k, loss=3.0 - 0.1 * k), when=t))
        if with_perf:
            wait = (waits or {}).get(k, 0.4)
            lines.append(RAY_PREFIX + timer_line("actor_train", per_step_s - 0.5, when=t))
            lines.append(RAY_PREFIX + perf_line(k, perf_dict(wait, per_step_s - wait + (0.1 if k % 2 else 0)),
                                                when=t))
    return "\n".join(lines) + "\n"


def test_window_throughput_from_perf_timers():
    log = SlimeLog.from_text(_run_text())
    assert log.last_step == 19 and log.steps_per_rollout() == 1 and len(log.losses()) == 20
    stats = log.window_stats(global_batch=128, seq_len=8192, gpus=8)
    times = [2 + (0.1 if k % 2 else 0) for k in range(5, 20)]
    assert stats.time_source == "perf/step_time" and stats.step_times_s == pytest.approx(times)
    assert stats.tokens == 15 * 128 * 8192 == 15_728_640
    assert stats.tokens_per_s_per_gpu == pytest.approx(15_728_640 / sum(times) / 8)
    assert log.window_throughput(128, 8192, 8) == pytest.approx(stats.tokens_per_s_per_gpu)
    assert stats.step_time_cv_percent == pytest.approx(step_time_cv_percent(times))
    assert len(log.timers) == 20


def test_window_from_timestamps_when_there_are_no_perf_lines():
    log = SlimeLog.from_text(_run_text(with_perf=False, per_step_s=3))
    stats = log.window_stats(128, 8192, 8, window=(5, 19))
    assert stats.time_source == "log timestamps" and stats.step_times_s == (3.0,) * 15
    assert stats.step_time_cv_percent == 0.0
    with pytest.raises(WindowError, match="perf/step_time"):
        log.step_times(5, 19, source="perf")


def test_window_errors():
    log = SlimeLog.from_text(_run_text(steps=12))
    with pytest.raises(WindowError, match="12..19"):
        log.window_stats(128, 8192, 8)
    with pytest.raises(WindowError):
        log.window_stats(128, 8192, 8, window=(0, 5))


def test_chunked_feeding_and_peak_memory():
    text = _run_text(steps=6)
    log = SlimeLog()
    for i in range(0, len(text), 37):           # lines split across chunks
        log.feed_text(text[i:i + 37])
    log.feed_text("", final=True)
    ref = SlimeLog.from_text(text)
    assert log.steps.keys() == ref.steps.keys() and log.perf.keys() == ref.perf.keys()
    per_rank = log.peak_memory_gib_per_rank()
    assert list(per_rank) == list(range(8))
    assert per_rank[7] == pytest.approx((8 + 5) / 4) and log.peak_memory_gib() == per_rank[7]
    assert log.peak_memory_gib(reserved=True) == pytest.approx((9 + 5) / 4)


def test_cv_percent():
    assert step_time_cv_percent([2.0]) is None
    assert step_time_cv_percent([1.0, 3.0]) == pytest.approx(50.0)


# --- failure classes ------------------------------------------------------------------------------------------

CUDA_OOM = (RAY_PREFIX + "Traceback (most recent call last):\n"
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::MegatronTrainRayActor.train() "
            "(pid=16376, ip=10.0.0.1)\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.59 GiB. GPU 3 has a total capacity of "
            "139.81 GiB of which 3.12 GiB is free.\n")
HOST_OOM = ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
            "Memory on the node (IP: 10.0.0.1, ID: 2c9e) where the task (actor ID: 8f2a, name=MegatronTrainRayActor"
            ".__init__, pid=4321, memory used=1843.20GB) was running was 1943.40GB / 2015.60GB (0.964180), which "
            "exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 77ab) because it was the most "
            "recently scheduled task\n")
NCCL = ("[rank4]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
        "Timeout(ms)=600000) ran for 600099 milliseconds before timing out.\n")
ARGPARSE = ("usage: train.py [-h] [--tensor-model-parallel-size TENSOR_MODEL_PARALLEL_SIZE]\n"
            "train.py: error: argument --tensor-model-parallel-size: invalid int value: 'two'\n")
ASSERT_IN_VALIDATION = ('Traceback (most recent call last):\n  File "/root/slime/train.py", line 59, in <module>\n'
                        '  File "/root/Megatron-LM/megatron/training/arguments.py", line 412, in validate_args\n'
                        "    assert args.num_attention_heads % args.tensor_model_parallel_size == 0\n"
                        "AssertionError\n")


@pytest.mark.parametrize("text, exit_status, expected", [
    (CUDA_OOM, 1, "cuda_oom"),
    (CUDA_OOM + NCCL, 1, "cuda_oom"),                 # the OOM made the others time out
    ("RuntimeError: Triton Error [CUDA]: out of memory\n", 1, "cuda_oom"),   # fla's GDN kernels (1 x H100)
    (HOST_OOM, 1, "host_oom"),                        # not cuda_oom, though it is an OutOfMemoryError
    ("Killed\n", 137, "host_oom"),
    ("", -9, "host_oom"),
    ("OSError: [Errno 12] Cannot allocate memory\n", 1, "host_oom"),
    ("(raylet) Workers (tasks / actors) killed due to memory pressure (OOM), 1 worker(s)\n", 1, "host_oom"),
    (NCCL + "terminate called after throwing an instance of 'c10::DistBackendError'\n", -6, "nccl_timeout"),
    ("RuntimeError: NCCL timeout in all_to_all\n", 1, "nccl_timeout"),
    (ARGPARSE, 2, "invalid_config"),
    ("train.py: error: unrecognized arguments: --bogus\n", 2, "invalid_config"),
    (ASSERT_IN_VALIDATION, 1, "invalid_config"),
    (step_line(0, sft_step_dict(0)) + "\n" + ASSERT_IN_VALIDATION, 1, "crash"),   # after training began
    ("AssertionError: loss mask length 3 != response length 4\n", 1, "crash"),     # not argument validation
    ('  File "/root/slime/slime/utils/arguments.py", line 1980, in slime_validate_args\n'
     "ValueError: global_batch_size 100 is not divisible by rollout_batch_size\n", 1, "invalid_config"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered\n", 1, "crash"),
    ("", None, "crash"),
    (step_line(0, sft_step_dict(0)), 0, None),
])
def test_classify_failure(text, exit_status, expected):
    assert classify_failure(text, exit_status) == expected


def test_failure_evidence():
    assert failure_evidence(CUDA_OOM, "cuda_oom").startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert failure_evidence(ARGPARSE, "invalid_config").startswith("train.py: error: argument")
    assert failure_evidence("foo\nRuntimeError: boom\nbar\n", "crash") == "RuntimeError: boom"


# --- the row builder ----------------------------------------------------------------------------------------




def conv(i, assistant=True):
    msgs = [{"role": "user", "content": f"q{i}" * (1 + i % 3)}]
    if assistant:
        msgs.append({"role": "assistant", "content": f"a{i}" * (1 + i % 4)})
    return msgs


def _stream(convs, order, tok=ToyTokenizer()):
    ids, mask = [], []
    for n, i in enumerate(order):
        if n:
            ids.append(tok.eos_token_id)
            mask.append(0)
        t, m = segment_loss_mask(tok, convs[i])
        ids += t
        mask += m
    return ids, mask


def test_rows_follow_the_permutation_with_eos_between_conversations():
    import random
    convs = [conv(i) for i in range(30)]
    result = build_rows(convs, ToyTokenizer(), row_tokens=16, seed=3)
    order = list(range(30))
    random.Random(3).shuffle(order)
    ids, mask = _stream(convs, order)
    n = len(ids) // 16
    cut = [(ids[16 * k:16 * k + 16], mask[16 * k:16 * k + 16]) for k in range(n)]
    kept = [(t, m) for t, m in cut if any(m[1:])]
    assert [(r.tokens.tolist(), list(r.loss_mask)) for r in result.rows] == kept
    assert result.skipped_rows == n - len(kept)
    assert result.dropped_tail_tokens == len(ids) - 16 * n and result.padding_tokens == 0
    assert ids.count(0) == 29                 # one EOS between each two of the 30 conversations (never 0 otherwise)
    assert ids[0] != 0 and ids[-1] != 0       # none before the first or after the last
    assert all(m == 0 for t, m in zip(ids, mask) if t == 0)
    assert any(0 in r.tokens for r in result.rows)
    assert result.conversations_used == 30
    assert result.rows_sha256 == rows_sha256((r.tokens, r.loss_mask) for r in result.rows)


def test_rows_are_deterministic_by_seed():
    convs = [conv(i) for i in range(40)]
    a = build_rows(convs, ToyTokenizer(), row_tokens=32, seed=42)
    b = build_rows(iter(convs), ToyTokenizer(), row_tokens=32, seed=42)     # any iterable
    c = build_rows(convs, ToyTokenizer(), row_tokens=32, seed=43)
    assert a.rows_sha256 == b.rows_sha256 and a.rows == b.rows
    assert a.rows_sha256 != c.rows_sha256


def test_rows_without_targets_are_skipped():
    # 20 user-only conversations first (no assistant turn), then 10 full ones; seed order is fixed by the
    # test: use a sequence whose permutation we know by building it the same way
    import random
    convs = [conv(i, assistant=i >= 20) for i in range(30)]
    result = build_rows(convs, ToyTokenizer(), row_tokens=8, seed=1)
    order = list(range(30))
    random.Random(1).shuffle(order)
    ids, mask = _stream(convs, order)
    rows = [(ids[8 * k:8 * k + 8], mask[8 * k:8 * k + 8]) for k in range(len(ids) // 8)]
    kept = [r for r in rows if any(r[1][1:])]
    assert result.skipped_rows == len(rows) - len(kept) > 0
    assert [r.tokens.tolist() for r in result.rows] == [r[0] for r in kept]
    assert result.supervised_tokens == sum(sum(m) for _, m in kept)
    assert result.supervised_token_ratio == pytest.approx(result.supervised_tokens / (8 * len(kept)))
    with pytest.raises(RowsError, match="no 8-token row"):
        build_rows([conv(i, assistant=False) for i in range(10)], ToyTokenizer(), row_tokens=8)


def test_max_rows_and_empty_conversations():
    convs = [conv(i) for i in range(40)] + [[]]
    assert len(build_rows(convs, ToyTokenizer(), row_tokens=16, seed=5, max_rows=3).rows) == 3
    full = build_rows(convs, ToyTokenizer(), row_tokens=16, seed=5)
    assert full.empty_conversations == 1 and full.conversations_used == 40 and full.conversations == 41


def test_rows_sha256_byte_layout_is_fixed():
    convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]] * 3
    result = build_rows(convs, ToyTokenizer(), row_tokens=6, seed=0)
    digest = hashlib.sha256()
    for r in result.rows:
        digest.update(struct.pack(f"<{len(r.tokens)}I", *r.tokens))
        digest.update(bytes(r.loss_mask))
    assert result.rows_sha256 == digest.hexdigest()
    # 3 x "<user>hi|<assistant>yo|" with EOS between, cut every 6 tokens: only the rows holding "yo|" are kept
    assert [r.tokens.tolist() for r in result.rows] == [ToyTokenizer().encode("t>yo|") + [0]] * 2
    assert [list(r.loss_mask) for r in result.rows] == [[0, 0, 1, 1, 1, 0]] * 2
    assert result.skipped_rows == 9 and result.dropped_tail_tokens == 71 - 66
    # frozen, so that a change of the byte layout (or of the build) shows
    assert result.rows_sha256 == "8d1c66388466379050b7da235fdf8f52c671d2b6b2f3600111806e684605fb1d"


def test_write_rows_jsonl_and_manifest(tmp_path):
    convs = [conv(i) for i in range(40)]
    result = build_rows(convs, ToyTokenizer(), row_tokens=16, seed=2)
    out = tmp_path / "rows.jsonl"
    manifest = write_rows(result, str(out), tokenizer="toy", loss_mask="segments")
    lines = out.read_text().splitlines()
    assert len(lines) == len(result.rows) == manifest["rows"]
    back = [json.loads(l) for l in lines]
    assert list(back[0]) == ["tokens", "loss_mask"]
    assert rows_sha256((b["tokens"], b["loss_mask"]) for b in back) == result.rows_sha256 == manifest["rows_sha256"]
    assert manifest["jsonl_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert manifest["jsonl_bytes"] == out.stat().st_size and manifest["padding_tokens"] == 0
    assert manifest["row_tokens"] == 16 and manifest["seed"] == 2
    assert json.loads((tmp_path / "rows.jsonl.manifest.json").read_text()) == manifest


class FakeQwenTokenizer:
    """Character-level stand-in for a Hugging Face fast tokenizer with Qwen's chat template (tests only)."""

    eos_token_id = 0

    def apply_chat_template(self, messages, tokenize=False, tools=None):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text if not tokenize else self(text)["input_ids"]

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        out = {"input_ids": [1 + ord(c) % 1000 for c in text]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out


def test_qwen3_5_loss_mask_covers_assistant_content_and_end_marker():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nok</think>\nyo"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "no", "step_loss_mask": 0}]
    tok = FakeQwenTokenizer()
    ids, mask = qwen3_5_loss_mask(tok, msgs)
    text = tok.apply_chat_template(msgs)
    supervised = "".join(c for c, m in zip(text, mask) if m)
    assert len(ids) == len(mask) == len(text)
    assert supervised == "ok</think>\nyo<|im_end|>\n"


def test_cli_needs_transformers(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": conv(1)}) + "\n")
    out = subprocess.run([sys.executable, "-m", "experiments.slime.sft_rows", "--input", str(tmp_path / "c.jsonl"),
                          "--tokenizer", str(tmp_path), "--out", str(tmp_path / "rows.jsonl")],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        import transformers  # noqa: F401
    except ImportError:
        assert out.returncode == 2
        assert out.stderr.strip().splitlines() == [
            "sft_rows: --tokenizer needs the 'transformers' package for the chat template (pip install transformers)"]


# --- the rollout function -------------------------------------------------------------------------------------


class StandInSample:
    """The fields of slime.utils.types.Sample that generate_rollout sets (tests only)."""

    class Status:
        PENDING, COMPLETED = "pending", "completed"

    def __init__(self):
        self.group_index = self.index = self.rollout_id = None
        self.tokens, self.response_length, self.loss_mask, self.reward = [], 0, None, None
        self.status, self.metadata = self.Status.PENDING, {}


@pytest.fixture
def rows_file(tmp_path):
    result = build_rows([conv(i) for i in range(60)], ToyTokenizer(), row_tokens=12, seed=4, max_rows=10)
    path = tmp_path / "rows.jsonl"
    write_rows(result, str(path))
    return str(path), result


def test_rollout_reads_rows_in_order_and_cycles(rows_file):
    path, result = rows_file
    args = SimpleNamespace(prompt_data=path, rollout_batch_size=4, n_samples_per_prompt=1)
    seen = []
    for rollout_id in range(4):
        groups = rollout_mod.generate_rollout(args, rollout_id, None, evaluation=False, sample_cls=StandInSample)
        assert len(groups) == 4 and all(len(g) == 1 for g in groups)
        for (s,) in groups:
            row = result.rows[s.metadata["row"]]
            assert s.tokens == row.tokens.tolist()
            assert s.response_length == len(s.tokens) - 1 == 11     # the first token is never a target
            assert s.loss_mask == list(row.loss_mask)[1:] and len(s.loss_mask) == s.response_length
            assert s.reward == 0 and s.status == StandInSample.Status.COMPLETED
            seen.append(s.metadata["row"])
    assert seen == [k % 10 for k in range(16)]
    # slime's get_responses (cp=1): logits[start-1:end-1] with start = end - response_length must not start at -1
    assert all(len(s.tokens) - s.response_length >= 1 for g in groups for s in g)


def test_rollout_groups_and_evaluation(rows_file):
    path, _ = rows_file
    args = SimpleNamespace(prompt_data=path, rollout_batch_size=3, n_samples_per_prompt=2)
    groups = rollout_mod.generate_rollout(args, 1, None, sample_cls=StandInSample)
    assert [len(g) for g in groups] == [2, 2, 2]
    assert [s.index for g in groups for s in g] == list(range(6, 12))
    assert [g[0].metadata["row"] for g in groups] == [3, 4, 5]
    with pytest.raises(ValueError, match="evaluation"):
        rollout_mod.generate_rollout(args, 0, None, evaluation=True, sample_cls=StandInSample)


def test_rollout_needs_slime_only_when_called(rows_file, monkeypatch):
    path, _ = rows_file
    monkeypatch.setitem(sys.modules, "slime", None)
    with pytest.raises(ImportError):
        rollout_mod.generate_rollout(SimpleNamespace(prompt_data=path, rollout_batch_size=1), 0, None)


def test_rollout_notices_a_rewritten_file(rows_file, tmp_path):
    path, _ = rows_file
    args = SimpleNamespace(prompt_data=path, rollout_batch_size=2)
    first = rollout_mod.generate_rollout(args, 0, None, sample_cls=StandInSample)
    time.sleep(0.01)
    with open(path, "w") as f:
        f.write(json.dumps({"tokens": [5, 6, 7], "loss_mask": [0, 1, 1]}) + "\n")
    second = rollout_mod.generate_rollout(args, 0, None, sample_cls=StandInSample)
    assert first[0][0].tokens != second[0][0].tokens and second[1][0].tokens == [5, 6, 7]


def test_allocator_retries_per_step_from_the_hook_lines():
    """The hook's cumulative retry count, read before each step, gives each step's retries (from the second step
    logged on); the summary puts them where the megatron runner does, so the tuner reads both alike."""
    from experiments.runner import allocator_retries_per_step
    lines = [RAY_PREFIX + hook_mod.format_line(rank, k, 0, k, 2 ** 30, 2 ** 31, rank, 16 * k if rank == 1 else 0)
             for k in range(1, 6) for rank in range(2)]
    log = SlimeLog.from_text("\n".join(lines) + "\n")
    assert log.allocator_retries_per_rank() == {0: [0, 0, 0], 1: [16, 16, 16]}
    details = {"allocator_churn_per_rank": {str(r): {"alloc_retries": [float(x) for x in v]}
                                            for r, v in log.allocator_retries_per_rank().items()}}
    assert allocator_retries_per_step(details) == 16.0
    plain = SlimeLog.from_text(RAY_PREFIX + hook_mod.format_line(0, 1, 0, 1, 1, 2, 0) + "\n")
    assert plain.allocator_retries_per_rank() == {}


def test_a_setup_fault_the_entrypoint_named_is_the_failures_evidence():
    """A slime checkout without the model's MODEL_ARGS script failed as a bare "crash: exit code 2": the entrypoint's
    own line (and the shell's for a missing folder) is the reason a user needs; its informational lines are not."""
    from experiments.slime.log import failure_evidence

    log = ("attune: NCCL_NVLS_ENABLE=1 computed on the cluster\n"
           "attune: the slime checkout /s has no scripts/models/q.sh (the model's MODEL_ARGS script)\n")
    assert failure_evidence(log, "crash") == \
        "attune: the slime checkout /s has no scripts/models/q.sh (the model's MODEL_ARGS script)"
    assert failure_evidence("bash: line 3: cd: /nope: No such file or directory\n", "crash") == \
        "bash: line 3: cd: /nope: No such file or directory"
    assert failure_evidence("attune: NCCL_NVLS_ENABLE=0 computed on the cluster\nValueError: x\n", "crash") == \
        "ValueError: x"
