"""Parse what a slime run prints: per-step metrics, per-rollout perf timers, rank-0 timer lines and our
peak-memory hook's lines; classify a failed run's output into a failure class.

Line shapes, as slime prints them (THUDM/slime @624b824, see ../shared/reference/slime-megatron.md A5):

- logger format (`slime/observability/logging_utils.py:21`, `configure_logger`):
  `[%(asctime)s] %(filename)s:%(lineno)d - %(message)s` with datefmt `%Y-%m-%d %H:%M:%S`
  (one-second resolution), e.g. `[2026-10-13 08:01:02] model.py:918 - step 7: {...}`.
- per optimizer step (`slime/backends/megatron_utils/model.py:918`):
  `logger.info(f"{role_tag}step {accumulated_step_id}: {log_dict}")`, role_tag "" for the actor,
  "critic-" for the critic; accumulated_step_id = rollout_id x steps_per_rollout + step_id, from 0.
- per rollout (`slime/observability/train_metric_utils.py:401`, `log_perf_data`):
  `logger.info(f"perf {rollout_id}: {log_dict}")`, keys `perf/<timer>_time`, `perf/actor_train_tflops`,
  `perf/actor_train_tok_per_s`, `perf/step_time` (= train_wait + train), `perf/wait_time_ratio`.
  Other reducers print `rollout {id}: {...}`, `multi_turn {id}: {...}`, `passrate {id}: {...}` (line 135).
- rank 0's timers (`slime/observability/timer.py:32`): `Timer {name} end (elapsed: {elapsed_time:.1f}s)`.
- Ray prefixes worker output with `(ClassName pid=N)` or `(ClassName pid=N, ip=A.B.C.D)`, coloured with ANSI
  escapes, and may append ` [repeated Nx across cluster]` when log deduplication is on.
- our hook (`experiments/slime/hooks/peak_memory_hook.py`) prints, per rank and step, a line without the logger
  format: `attune-peak-memory rank=R rollout=I step_id=J step=K allocated_bytes=A reserved_bytes=B device=D`.

The dicts are Python reprs; bare `nan`/`inf` tokens are read as floats before `ast.literal_eval`.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from cost_model.nouns.errors import AttuneError

PEAK_MEMORY_TAG = "attune-peak-memory"
GIB = 2 ** 30

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\s*\((?P<actor>[^()]*?pid=\d+[^()]*)\)\s?")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_LOGGER = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] (?P<file>[^\s:]+):(?P<lineno>\d+) - (?P<msg>.*)$")
_STEP = re.compile(r"^(?P<role>[A-Za-z0-9_]+-)?step (?P<n>\d+): (?P<dict>\{.*\})\s*$")
_METRICS = re.compile(r"^(?P<kind>[A-Za-z_][\w/-]*) (?P<n>\d+): (?P<dict>\{.*\})\s*$")
_TIMER_END = re.compile(r"^Timer (?P<name>\S+) end \(elapsed: (?P<s>[0-9.]+(?:[eE][-+]?\d+)?)s\)\s*$")
_PEAK = re.compile(PEAK_MEMORY_TAG + r"((?:\s+\w+=\S+)+)")
_KV = re.compile(r"(\w+)=(\S+)")
# A bare nan / inf value inside a dict repr (after ": ", ", " or "[" and before ",", "}" or "]").
_BARE_NONFINITE = re.compile(r"(?:(?<=: )|(?<=, )|(?<=\[))(-?)(nan|inf)(?=\s*[,}\]])")
_NUMPY_SCALAR = re.compile(r"\bnp\.\w+\(([^()]*)\)")
_NAN_SENTINEL = "__attune_nan__"
# Fallback when the dict is not a literal (a tensor repr, say): the plain 'key': number pairs.
_PAIR = re.compile(r"'([^']+)': (-?(?:nan|inf|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))")


# --- events -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Event:
    timestamp: datetime | None = None    # the logger's timestamp (None for lines printed without it)
    actor: str | None = None             # Ray's prefix without the parentheses, e.g. "MegatronTrainRayActor pid=12"
    source: str | None = None            # "model.py:918", the logger's filename:lineno


@dataclass(frozen=True, kw_only=True)
class StepEvent(Event):
    step: int                            # slime's accumulated step id (train/step), from 0
    metrics: dict
    role: str = "actor"                  # "actor", or the role tag without its dash ("critic")


@dataclass(frozen=True, kw_only=True)
class PerfEvent(Event):
    rollout: int
    metrics: dict


@dataclass(frozen=True, kw_only=True)
class MetricsEvent(Event):
    kind: str                            # rollout, multi_turn, passrate, ...
    index: int
    metrics: dict


@dataclass(frozen=True, kw_only=True)
class TimerEvent(Event):
    name: str
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class PeakMemoryEvent(Event):
    rank: int
    step: int | None                     # accumulated step id before which the figures were read
    rollout: int | None
    step_id: int | None
    allocated_bytes: int                 # torch.cuda.max_memory_allocated() so far (never reset)
    reserved_bytes: int                  # torch.cuda.max_memory_reserved() so far
    device: int | None = None
    alloc_retries: int | None = None     # the caching allocator's retries so far (hook lines before it: None)


def strip_prefixes(line: str) -> tuple[str, str | None]:
    """The line without ANSI escapes, Ray's `(Actor pid=N)` prefix and dedup suffix; and the actor text."""
    line = _ANSI.sub("", line).rstrip("\r\n")
    if "\r" in line:                      # a progress bar redrawn in place: keep the last state
        line = line.rsplit("\r", 1)[-1]
    actor = None
    m = _RAY_PREFIX.match(line)
    if m:
        actor = m.group("actor").strip()
        line = line[m.end():]
    line = _REPEATED.sub("", line)
    return line, actor


def parse_dict(text: str) -> dict:
    """A logged metrics dict (a Python repr) as a dict; bare nan/inf become floats. Raises ValueError."""
    cleaned = _NUMPY_SCALAR.sub(r"\1", text)
    cleaned = _BARE_NONFINITE.sub(lambda m: f"{m.group(1)}1e999" if m.group(2) == "inf" else repr(_NAN_SENTINEL),
                                  cleaned)
    try:
        value = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pairs = _PAIR.findall(text)
        if not pairs:
            raise ValueError(f"not a metrics dict: {text[:120]!r}") from None
        return {k: float(v) for k, v in pairs}
    if not isinstance(value, dict):
        raise ValueError(f"not a metrics dict: {text[:120]!r}")
    return {k: (math.nan if v == _NAN_SENTINEL else v) for k, v in value.items()}


def parse_line(line: str) -> Event | None:
    """One line of a slime run's output as an event, or None when it is none of the known lines."""
    text, actor = strip_prefixes(line)
    if PEAK_MEMORY_TAG in text:
        m = _PEAK.search(text)
        if m:
            fields = dict(_KV.findall(m.group(1)))
            try:
                return PeakMemoryEvent(
                    actor=actor, rank=int(fields["rank"]), step=_int_or_none(fields.get("step")),
                    rollout=_int_or_none(fields.get("rollout")), step_id=_int_or_none(fields.get("step_id")),
                    allocated_bytes=int(fields["allocated_bytes"]), reserved_bytes=int(fields["reserved_bytes"]),
                    device=_int_or_none(fields.get("device")),
                    alloc_retries=_int_or_none(fields.get("alloc_retries")))
            except (KeyError, ValueError):
                return None
    m = _LOGGER.match(text)
    if not m:
        return None
    timestamp = datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")
    source = f"{m.group('file')}:{m.group('lineno')}"
    msg = m.group("msg")
    common = dict(timestamp=timestamp, actor=actor, source=source)
    sm = _STEP.match(msg)
    if sm:
        try:
            metrics = parse_dict(sm.group("dict"))
        except ValueError:
            return None
        role = (sm.group("role") or "actor-")[:-1]
        return StepEvent(step=int(sm.group("n")), metrics=metrics, role=role, **common)
    tm = _TIMER_END.match(msg)
    if tm:
        return TimerEvent(name=tm.group("name"), elapsed_s=float(tm.group("s")), **common)
    mm = _METRICS.match(msg)
    if mm:
        try:
            metrics = parse_dict(mm.group("dict"))
        except ValueError:
            return None
        if mm.group("kind") == "perf":
            return PerfEvent(rollout=int(mm.group("n")), metrics=metrics, **common)
        return MetricsEvent(kind=mm.group("kind"), index=int(mm.group("n")), metrics=metrics, **common)
    return None


def _int_or_none(value: str | None) -> int | None:
    if value is None or value in ("None", "-1", ""):
        return None
    return int(value)


# --- accumulated log ----------------------------------------------------------------------------------


class WindowError(AttuneError, ValueError):
    """The log does not cover the measurement window (missing steps or timings)."""


@dataclass(frozen=True)
class WindowStats:
    first: int
    last: int
    steps: int
    tokens: int                          # steps x global batch rows x row tokens
    wall_s: float                        # sum of the window's step wall times
    tokens_per_s_per_gpu: float
    step_times_s: tuple[float, ...]
    step_time_cv_percent: float | None
    time_source: str                     # "perf/step_time" or "log timestamps"


def step_time_cv_percent(times) -> float | None:
    """Standard deviation (population, ddof 0) / mean of the step times, in percent; None for < 2 times."""
    times = [float(t) for t in times]
    if len(times) < 2:
        return None
    mean = statistics.fmean(times)
    return 100.0 * statistics.pstdev(times) / mean if mean > 0 else None


@dataclass
class SlimeLog:
    """Events of one run, fed line by line (`feed`) or as text (`feed_text`)."""

    steps: dict[int, StepEvent] = field(default_factory=dict)          # actor steps by step id
    other_steps: list[StepEvent] = field(default_factory=list)          # critic and other roles
    perf: dict[int, PerfEvent] = field(default_factory=dict)            # by rollout id
    metrics: list[MetricsEvent] = field(default_factory=list)
    timers: list[TimerEvent] = field(default_factory=list)
    peak_memory: dict[int, PeakMemoryEvent] = field(default_factory=dict)  # per rank, its highest line
    retries: dict[int, dict[int, int]] = field(default_factory=dict)   # per rank: step -> allocator retries before it
    lines: int = 0
    _pending: str = ""

    @classmethod
    def from_text(cls, text: str) -> "SlimeLog":
        log = cls()
        log.feed_text(text, final=True)
        return log

    def feed_text(self, text: str, final: bool = False) -> list[Event]:
        """Add a chunk of output. An incomplete last line waits for the next chunk unless `final`."""
        data = self._pending + text
        parts = data.split("\n")
        self._pending = "" if final else parts.pop()
        return [e for e in (self.feed(p) for p in parts) if e is not None]

    def feed(self, line: str) -> Event | None:
        self.lines += 1
        event = parse_line(line)
        if isinstance(event, StepEvent):
            if event.role == "actor":
                self.steps[event.step] = event
            else:
                self.other_steps.append(event)
        elif isinstance(event, PerfEvent):
            self.perf[event.rollout] = event
        elif isinstance(event, MetricsEvent):
            self.metrics.append(event)
        elif isinstance(event, TimerEvent):
            self.timers.append(event)
        elif isinstance(event, PeakMemoryEvent):
            if event.alloc_retries is not None and event.step is not None:
                self.retries.setdefault(event.rank, {})[event.step] = event.alloc_retries
            old = self.peak_memory.get(event.rank)
            if old is not None:      # the figures never decrease; keep the highest of each, with the latest step
                event = dataclasses.replace(event, allocated_bytes=max(event.allocated_bytes, old.allocated_bytes),
                                            reserved_bytes=max(event.reserved_bytes, old.reserved_bytes))
            self.peak_memory[event.rank] = event
        return event

    # -- per-step series ------------------------------------------------------------------------------

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.steps else None

    def losses(self, key: str = "train/loss") -> tuple[float, ...]:
        return tuple(float(self.steps[s].metrics[key]) for s in sorted(self.steps) if key in self.steps[s].metrics)

    def grad_norms(self, key: str = "train/grad_norm") -> tuple[float, ...]:
        return tuple(float(self.steps[s].metrics[key]) for s in sorted(self.steps) if key in self.steps[s].metrics)

    def steps_per_rollout(self) -> int | None:
        """1 when every step id has a perf line of the same id and vice versa (rollout batch = global
        batch); None when that cannot be told from the log."""
        if self.steps and self.perf and set(self.steps) == set(self.perf):
            return 1
        return None

    def step_times(self, first: int, last: int, source: str = "auto") -> tuple[tuple[float, ...], str]:
        """Wall time of each step first..last (inclusive) and where it came from.

        - "perf": `perf/step_time` of rollout k (train_wait + train: from the end of training rollout k-1 to
          the end of training rollout k), valid when each rollout is one optimizer step.
        - "timestamps": the gap between the `step k-1` and `step k` lines (one-second resolution).
        - "auto": perf when possible, else timestamps.
        Raises WindowError when the log lacks what the chosen source needs.
        """
        wanted = range(first, last + 1)
        if source in ("auto", "perf") and self.steps_per_rollout() == 1:
            times = [self.perf[k].metrics.get("perf/step_time") if k in self.perf else None for k in wanted]
            if all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times):
                return tuple(float(t) for t in times), "perf/step_time"
            if source == "perf":
                raise WindowError(f"perf/step_time is missing for some of rollouts {first}..{last}")
        elif source == "perf":
            raise WindowError("perf/step_time gives step times only when each rollout is one step")
        missing = [k for k in range(first - 1, last + 1) if k not in self.steps or self.steps[k].timestamp is None]
        if missing:
            raise WindowError(f"the log has no timestamped step line for step(s) {_ranges(missing)} "
                              f"(window {first}..{last} needs steps {first - 1}..{last})")
        times = [(self.steps[k].timestamp - self.steps[k - 1].timestamp).total_seconds() for k in wanted]
        return tuple(times), "log timestamps"

    def window_stats(self, global_batch: int, seq_len: int, gpus: int, window: tuple[int, int] = (5, 19),
                     source: str = "auto") -> WindowStats:
        """Throughput over the window (recipe-format.md): tokens in the window / window wall time / GPUs,
        with each step global_batch rows x seq_len tokens. Raises WindowError when the window is incomplete."""
        first, last = window
        if first < 1 or last < first:
            raise WindowError(f"window must be 1 <= first <= last, got {window}")
        absent = [k for k in range(first, last + 1) if k not in self.steps]
        if absent:
            raise WindowError(f"the log has no step line for step(s) {_ranges(absent)} of the window {first}..{last}")
        times, time_source = self.step_times(first, last, source)
        wall = sum(times)
        if wall <= 0:
            raise WindowError(f"the window {first}..{last} has no measurable wall time (one-second timestamps)")
        steps = last - first + 1
        tokens = steps * global_batch * seq_len
        return WindowStats(first=first, last=last, steps=steps, tokens=tokens, wall_s=wall,
                           tokens_per_s_per_gpu=tokens / wall / gpus, step_times_s=times,
                           step_time_cv_percent=step_time_cv_percent(times), time_source=time_source)

    def window_throughput(self, global_batch: int, seq_len: int, gpus: int, window: tuple[int, int] = (5, 19),
                          source: str = "auto") -> float:
        """Tokens/s per GPU over the window; see `window_stats`."""
        return self.window_stats(global_batch, seq_len, gpus, window, source).tokens_per_s_per_gpu

    # -- memory ---------------------------------------------------------------------------------------

    def peak_memory_gib_per_rank(self, reserved: bool = False) -> dict[int, float]:
        key = "reserved_bytes" if reserved else "allocated_bytes"
        return {rank: getattr(e, key) / GIB for rank, e in sorted(self.peak_memory.items())}

    def allocator_retries_per_rank(self) -> dict[int, list[int]]:
        """Per rank, the allocator's retries in each step between two hook lines of consecutive steps (the hook
        reads the count before each step), from the second step logged on: the first builds the cache."""
        out = {}
        for rank, by_step in sorted(self.retries.items()):
            steps = sorted(by_step)
            deltas = [by_step[b] - by_step[a] for a, b in zip(steps, steps[1:]) if b == a + 1]
            if len(deltas) > 1:
                out[rank] = deltas[1:]
        return out

    def peak_memory_gib(self, reserved: bool = False) -> float | None:
        per_rank = self.peak_memory_gib_per_rank(reserved)
        return max(per_rank.values()) if per_rank else None


def _ranges(values: list[int]) -> str:
    out, start, prev = [], None, None
    for v in sorted(values):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}..{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}..{prev}")
    return ", ".join(out)


# --- failure classes ----------------------------------------------------------------------------------

_HOST_OOM = re.compile(
    r"ray\.exceptions\.OutOfMemoryError"
    r"|killed due to the node running low on memory"
    r"|killed due to memory pressure \(OOM\)"
    r"|Worker exit type: NODE_OUT_OF_MEMORY"
    r"|Ray killed this worker"
    r"|Cannot allocate memory"
    r"|std::bad_alloc")
_CUDA_OOM = re.compile(
    r"CUDA out of memory"
    r"|torch\.(?:cuda\.)?OutOfMemoryError"
    r"|(?<![\w.])OutOfMemoryError: CUDA"
    r"|CUDA error: out of memory"
    r"|Triton Error \[CUDA\]: out of memory"   # a Triton kernel's launch (fla's Gated DeltaNet kernels)
    r"|CUBLAS_STATUS_ALLOC_FAILED")
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout"
    r"|NCCL timeout"
    r"|ProcessGroupNCCL[^\n]*(?:timed out|Timeout\(ms\)=\d+\) ran for)"
    r"|watchdog (?:thread )?got stuck"
    r"|Heartbeat monitor timed out",
    re.IGNORECASE)
_ARGPARSE = re.compile(r"^[^\n:]*: error: (?:unrecognized arguments|argument |the following arguments are required"
                       r"|one of the arguments|not allowed with argument)", re.MULTILINE)
# slime's and Megatron's argument checks raise AssertionError or ValueError (slime/utils/arguments.py,
# megatron/training/arguments.py:validate_args).
_ASSERTION = re.compile(r"^\s*(?:\w+\.)*(?:AssertionError|ValueError)\b", re.MULTILINE)
_VALIDATION_FRAME = re.compile(r'File "[^"]*arguments\.py", line \d+|, in (?:validate_args|parse_args|_validate\w*)\b')


def classify_failure(log_text: str, exit_status: int | None) -> str | None:
    """The failure class of a finished run from its output and exit status; None when it succeeded.

    Checked in this order, the first match wins (an OOM on one rank makes the others time out, so the
    memory classes come before nccl_timeout):
    - host_oom: Ray's memory monitor (`ray.exceptions.OutOfMemoryError`, "killed due to the node running low
      on memory", "Worker exit type: NODE_OUT_OF_MEMORY", "Ray killed this worker"), "Cannot allocate
      memory", std::bad_alloc, or death by SIGKILL (exit 137 / -9: the kernel OOM killer's signature, with or
      without its "Killed" line);
    - cuda_oom: "CUDA out of memory", torch.OutOfMemoryError, "CUDA error: out of memory", a Triton kernel's
      "Triton Error [CUDA]: out of memory";
    - invalid_config: an argparse error ("error: unrecognized arguments", "error: argument ..."), or an
      AssertionError / ValueError raised in argument validation (a traceback frame in *arguments.py, or in
      validate_args / parse_args) before any training step was logged;
    - nccl_timeout: the NCCL watchdog's collective timeout, "NCCL timeout", ProcessGroupNCCL timeouts;
    - crash: any other non-zero exit.
    `hang` is never returned here: the runner decides it (no new step line within its limit).
    """
    text = _ANSI.sub("", log_text or "")
    if _HOST_OOM.search(text):
        return "host_oom"
    if _CUDA_OOM.search(text):
        return "cuda_oom"
    if exit_status in (137, -9):
        return "host_oom"
    if exit_status == 0:
        return None
    trained = any(isinstance(parse_line(l), StepEvent) for l in text.splitlines() if "step " in l)
    if _ARGPARSE.search(text) and not trained:
        return "invalid_config"
    if _ASSERTION.search(text) and _VALIDATION_FRAME.search(text) and not trained:
        return "invalid_config"
    if _NCCL_TIMEOUT.search(text):
        return "nccl_timeout"
    return "crash"


def failure_evidence(log_text: str, failure_class: str | None) -> str:
    """The first output line that made `classify_failure` choose the class ('' when none)."""
    patterns = {"host_oom": _HOST_OOM, "cuda_oom": _CUDA_OOM, "nccl_timeout": _NCCL_TIMEOUT,
                "invalid_config": re.compile(_ARGPARSE.pattern + "|" + _ASSERTION.pattern, re.MULTILINE)}
    text = _ANSI.sub("", log_text or "")
    pattern = patterns.get(failure_class or "")
    lines = text.splitlines()
    if pattern is not None:
        for line in lines:
            if pattern.search(line):
                return strip_prefixes(line)[0].strip()[:500]
    # a setup fault the job's entrypoint or its shell named (a slime checkout without the model's script, a path
    # that is not there) is the reason, whatever followed it
    for line in lines:
        stripped = strip_prefixes(line)[0].strip()
        if (stripped.startswith("attune: ") and " computed on the cluster" not in stripped) or \
                re.search(r"^(?:bash: |.*: line \d+: |cd: ).*(?:No such file or directory|not found)", stripped):
            return stripped[:500]
    # crash and the rest: the last line that looks like an exception
    for line in reversed(lines):
        stripped = strip_prefixes(line)[0].strip()
        if re.match(r"^(?:[\w.]+(?:Error|Exception|Exit)\b|Traceback|terminate called|Segmentation fault)", stripped):
            return stripped[:500]
    return ""
