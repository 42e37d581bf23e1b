"""Start one worker per GPU and watch them: the torch.multiprocessing and Ray launchers, and the monitor.

The monitor tells four endings apart: every rank's result; a reported error (the peers get a few
seconds to report theirs); a rank that died without a report; and silence. Silence is judged in
two regimes: before the first training step a real job imports torch and megatron, initialises
NCCL, builds and shards the model and warms up (minutes at full size), so start-up has its own
generous grace; once steps run, a step that reports nothing for the hang timeout is a hang.
"""
from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
from pathlib import Path

from experiments.megatron.failures import classify_exit, most_telling
from experiments.megatron.worker import worker

STARTUP_GRACE_S = 600.0     # silence allowed before the first training step (the trial timeout still applies)
EXIT_REPORT_WAIT_S = 3.0    # a rank that exited: its last reports had time to arrive
PEER_ERROR_WAIT_S = 8.0     # after the first error, let the peers report their side
POLL_S = 0.5


# ================================================================================ launchers
class _MpHandle:
    """One spawned process per GPU (torch.multiprocessing, spawn)."""

    def __init__(self, job: dict, world: int, target=None):
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        self.queue = ctx.Queue()
        self.procs = [ctx.Process(target=target or worker, args=(r, world, job, self.queue, r), daemon=False)
                      for r in range(world)]
        saved = {k: os.environ.get(k) for k in job["env"]}
        os.environ.update(job["env"])  # set before the children import torch
        try:
            for p in self.procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def get(self, timeout: float):
        try:
            return self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            return None

    def exited(self) -> dict[int, int]:
        return {r: p.exitcode for r, p in enumerate(self.procs) if p.exitcode is not None}

    def stop(self, grace_s: float = 5.0) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        end = time.time() + grace_s
        for p in self.procs:
            p.join(max(0.0, end - time.time()))
            if p.is_alive():
                p.kill()
                p.join(2.0)
        self.queue.close()


class _RayHandle:
    """A Ray placement group with one single-GPU actor per rank (STRICT_PACK, one node)."""

    def __init__(self, job: dict, world: int, target=None, gpus_per_worker: int = 1):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.ray = ray
        bundle = {"CPU": 1, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.pg = placement_group([bundle] * world, strategy="STRICT_PACK")
        ray.get(self.pg.ready(), timeout=120)
        self.queue = Queue()
        actor_cls = ray.remote(num_gpus=gpus_per_worker, num_cpus=1)(_RayWorker)
        self.actors = [actor_cls.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                                 placement_group_bundle_index=r),
            runtime_env={"env_vars": dict(job["env"])}).remote() for r in range(world)]
        self.refs = [a.run.remote(r, world, job, self.queue, target) for r, a in enumerate(self.actors)]

    def get(self, timeout: float):
        from ray.util.queue import Empty
        try:
            return self.queue.get(timeout=timeout)
        except Empty:
            return None

    def exited(self) -> dict[int, int]:
        done, _ = self.ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        out = {}
        for r, ref in enumerate(self.refs):
            if ref in done:
                try:
                    self.ray.get(ref)
                    out[r] = 0
                except Exception:  # noqa: BLE001 - the actor died
                    out[r] = 1
        return out

    def stop(self, grace_s: float = 5.0) -> None:
        from ray.util.placement_group import remove_placement_group
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        try:
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.queue.shutdown()
        except Exception:  # noqa: BLE001
            pass


class _RayWorker:
    def run(self, rank: int, world: int, job: dict, report, target=None):
        # Ray sets CUDA_VISIBLE_DEVICES to the actor's one GPU: it is device 0 here.
        (target or worker)(rank, world, job, report, 0)
        return rank


def ray_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("ray") is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ================================================================================ the monitor
def run_job(job: dict, world: int, launcher: str = "mp", timeout_s: float = 300.0,
            hang_timeout_s: float = 120.0, target=None, gpus_per_worker: int = 1,
            startup_grace_s: float = STARTUP_GRACE_S) -> dict:
    """Start `world` workers, collect their reports, and return
    {"status": "ok", "ranks": {rank: result}} or {"status": "failed", "failure_class", "detail", ...}.

    Silence fails the trial as a hang after `startup_grace_s` before any rank finished a training
    step, after `hang_timeout_s` once one has; the whole trial after `timeout_s`."""
    start = time.time()
    job = dict(job)
    job["deadline"] = start + timeout_s - 10.0
    log_dir = Path(job["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    handle = (_RayHandle(job, world, target, gpus_per_worker) if launcher == "ray"
              else _MpHandle(job, world, target))
    monitor = _Monitor(world, log_dir, start, timeout_s=timeout_s, hang_timeout_s=hang_timeout_s,
                       startup_grace_s=startup_grace_s)
    try:
        while not monitor.done(handle.get(timeout=POLL_S), handle, time.time()):
            pass
    finally:
        handle.stop()
    return monitor.outcome(time.time() - start)


class _Monitor:
    """What the workers reported so far, and whether the trial is over."""

    def __init__(self, world: int, log_dir: Path, start: float, *, timeout_s: float, hang_timeout_s: float,
                 startup_grace_s: float):
        self.world, self.log_dir, self.start = world, log_dir, start
        self.timeout_s, self.hang_timeout_s, self.startup_grace_s = timeout_s, hang_timeout_s, startup_grace_s
        self.results: dict[int, dict] = {}
        self.errors: list[dict] = []
        self.progress: dict[int, dict] = {}
        self.last_msg = time.time()     # the launcher has started the workers
        self.stepped = False            # a rank finished a training step: start-up is over
        self.error_wait_until = None
        self.dead_since: dict[int, float] = {}
        self.hang = None                # the message of a silent trial

    def done(self, msg: dict | None, handle, now: float) -> bool:
        if msg is not None:
            self._receive(msg, now)
        if len(self.results) == self.world:
            return True
        reported = self._check_exits(handle.exited(), now)
        if self.errors and (now >= self.error_wait_until or len(reported) == self.world):
            return True
        self.hang = self._silence(now)
        return self.hang is not None

    def _receive(self, msg: dict, now: float) -> None:
        self.last_msg = now
        r = msg.get("rank")
        if msg["kind"] == "hb":
            self.progress[r] = msg
            self.stepped = self.stepped or "step" in msg
        elif msg["kind"] == "result":
            self.results[r] = msg
        elif msg["kind"] == "error":
            self._error(msg, now)

    def _error(self, msg: dict, now: float) -> None:
        self.errors.append(msg)
        if self.error_wait_until is None:
            self.error_wait_until = now + PEER_ERROR_WAIT_S

    def _check_exits(self, exited: dict[int, int], now: float) -> set:
        """Ranks that reported a result or an error; a rank dead without a report becomes an error."""
        reported = set(self.results) | {e["rank"] for e in self.errors}
        for r, code in exited.items():
            if r in reported:
                continue
            self.dead_since.setdefault(r, now)
            if now - self.dead_since[r] > EXIT_REPORT_WAIT_S:
                tail = _tail(self.log_dir / f"rank{r}.log")
                self._error({"kind": "error", "rank": r, "phase": self.progress.get(r, {}).get("phase", "?"),
                             "failure_class": classify_exit(code, tail), "type": "exit",
                             "message": f"rank {r} exited with code {code} without a report; log tail: "
                                        + " ".join(tail[-600:].split())}, now)
                reported.add(r)
        return reported

    def _silence(self, now: float) -> str | None:
        """The hang message when the workers have been silent too long, else None."""
        if self.stepped and now - self.last_msg > self.hang_timeout_s:
            return (f"no report from any rank for {self.hang_timeout_s:.0f} s; last progress: "
                    + _progress_text(self.progress))
        if not self.stepped and now - self.last_msg > self.startup_grace_s:
            return (f"no report from any rank for {self.startup_grace_s:.0f} s during start-up (no training "
                    f"step yet); last progress: " + _progress_text(self.progress))
        if now - self.start > self.timeout_s:
            first = ("" if self.stepped else " before any training step finished (a first step compiles kernels: "
                     "on a fresh machine Gated DeltaNet's take minutes, and a second try reuses them)")
            return (f"trial exceeded its {self.timeout_s:.0f} s timeout{first}; last progress: "
                    + _progress_text(self.progress))
        return None

    def outcome(self, wall: float) -> dict:
        progress = {r: {k: v for k, v in p.items() if k != "kind"} for r, p in self.progress.items()}
        if self.errors:
            first = most_telling(self.errors)
            return {"status": "failed", "failure_class": first["failure_class"], "wall_s": wall,
                    "detail": f"rank {first['rank']} ({first.get('phase')}): {first.get('type')}: "
                              f"{first.get('message')}",
                    "errors": [_error_fields(e) for e in self.errors],
                    "progress": progress}
        if self.hang is not None:
            return {"status": "failed", "failure_class": "hang", "detail": self.hang, "wall_s": wall,
                    "progress": progress}
        return {"status": "ok", "ranks": self.results, "wall_s": wall}


def _error_fields(error: dict) -> dict:
    """An error as the result carries it; a rank's memory at a CUDA OOM when it could say."""
    out = {k: error.get(k) for k in ("rank", "phase", "failure_class", "type", "message")}
    if error.get("memory_gib"):
        out["memory_gib"] = error["memory_gib"]
    return out


def _progress_text(progress: dict) -> str:
    if not progress:
        return "none (no worker started)"
    return "; ".join(f"rank {r}: {p.get('phase')}" + (f" step {p['step']}" if "step" in p else "")
                     for r, p in sorted(progress.items()))


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")
