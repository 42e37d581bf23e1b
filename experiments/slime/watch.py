"""Watching a submitted slime job: stream its log into a `SlimeLog` and stop it when it passes a limit.

Three limits, each settable (`Limits`):
- start-up grace: from the job's start (Ray reports it RUNNING) to its first `step N:` line. A real slime
  job pulls its image, starts its Ray actors and loads the model first, which takes minutes;
- step-hang timeout: from one new step line to the next (a collective that never completes);
- overall timeout: from submission to the end, whatever the job printed.
A job the runner stopped that still has not ended after `STOP_GRACE_S` is given up on.

The log is streamed: Ray's `JobSubmissionClient.tail_job_logs` (an async generator over a websocket) runs in a
thread of its own (`LogTail`) and the watch takes what arrived at each poll, so a long log is never
downloaded again. A client without it, or a stream that breaks, falls back to `get_job_logs`, whose text
past what was already read is fed on. The status is polled every `poll_interval_s`; the wait ends early
when the stream ends (the job ended).

The clock and the sleep are injected, so that the limits can be tested without waiting for them (a client
without `tail_job_logs` keeps the watch on them alone).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from experiments.runner import RunnerError
from experiments.slime.log import SlimeLog

# The least start-up grace by default: a real slime job pulls its image and loads the model first.
STARTUP_GRACE_S = 900.0

STOP_GRACE_S = 120.0
# An unreachable cluster is tolerated this long (or 12 polls, when longer) before the trial is given up.
LOST_CLUSTER_S = 60.0
# After the job ended, the most seconds to wait for the log stream to deliver its last lines and close.
DRAIN_S = 30.0


class LogTail:
    """`client.tail_job_logs(job_id)` pumped on an event loop in a daemon thread; chunks wait in a queue."""

    def __init__(self, client, job_id: str):
        self._chunks: queue.SimpleQueue = queue.SimpleQueue()
        self.ended = threading.Event()      # the stream ended: the job ended, it broke, or it was closed
        self.error: str | None = None       # why it broke, if it did
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"attune-log-tail-{job_id}",
                                        daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._pump(client, job_id), self._loop)

    async def _pump(self, client, job_id: str) -> None:
        try:
            async for chunk in client.tail_job_logs(job_id):
                self._chunks.put(chunk)
        except asyncio.CancelledError:
            raise
        except Exception as e:          # a broken stream: the watch falls back to get_job_logs
            self.error = one_line(e) or type(e).__name__
        finally:
            self.ended.set()

    def take(self) -> str:
        """Everything that arrived since the last take."""
        parts = []
        while True:
            try:
                parts.append(self._chunks.get_nowait())
            except queue.Empty:
                return "".join(parts)

    def close(self) -> None:
        """Stop the stream if it still runs (its session closed), then the loop and the thread."""
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(timeout=10)
        except Exception:               # it did not stop in time: the daemon thread is left to the process
            return
        self.ended.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait until they have finished."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class Limits:
    """When the runner stops a job (seconds)."""
    startup_grace_s: float | None = None   # job started -> first step line (image pull, actor start, model load);
    #                                        None: the larger of STARTUP_GRACE_S and hang_timeout_s
    hang_timeout_s: float = 900  # one step line -> the next
    timeout_s: float = 3600      # submission -> end
    poll_interval_s: float = 5.0
    drain_s: float = DRAIN_S     # job ended -> its log stream's end; past it the rest is read from get_job_logs

    def __post_init__(self):
        if self.startup_grace_s is None:   # a start (image pull, model load) never gets less time than a step
            object.__setattr__(self, "startup_grace_s", max(STARTUP_GRACE_S, self.hang_timeout_s))


@dataclass
class JobWatch:
    """Follows one submitted job through a JobSubmissionClient-like `client` (see the module docstring)."""

    client: object
    job_id: str
    limits: Limits
    submitted: float             # clock() at submission
    where: str                   # the cluster's address, for messages
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    log: SlimeLog = field(default_factory=SlimeLog)
    stream: bool = True          # stream the log with tail_job_logs when the client has it
    status: object = None        # the last JobStatus seen
    stopped: str | None = None   # why the runner stopped the job; None while it has not
    log_source: str = "get_job_logs"   # how the log was read (tail_job_logs, or why it fell back)
    _parts: list[str] = field(default_factory=list)
    _seen: int = 0               # characters of the log read so far
    _tail: LogTail | None = None
    _stop_requested: float = 0.0
    _running_since: float | None = None
    _last_progress: float | None = None
    _last_step: int | None = None
    _lost_since: float | None = None

    @property
    def text(self) -> str:
        """The job's log as read so far."""
        return "".join(self._parts)

    def follow(self):
        """Poll until the job ends (or ignores a stop for STOP_GRACE_S); returns its last JobStatus.
        Raises RunnerError when the cluster stays unreachable."""
        if self.stream and self._tail is None and hasattr(self.client, "tail_job_logs"):
            self._tail = LogTail(self.client, self.job_id)
            self.log_source = "tail_job_logs"
        try:
            return self._follow()
        except BaseException:
            self._close_tail()
            raise

    def _follow(self):
        from ray.job_submission import JobStatus
        while True:
            status = self._poll_status()
            if status is None:
                continue
            now = self.clock()
            self._read_log()
            if self.log.last_step is not None and self.log.last_step != self._last_step:
                self._last_step, self._last_progress = self.log.last_step, now
            if status.is_terminal():
                break
            if status == JobStatus.RUNNING and self._running_since is None:
                self._running_since = self._last_progress = now
            if self.stopped is None:
                self.stopped = self._over_limit(now)
                if self.stopped is not None:
                    self._stop(now)
            if self.stopped is not None and now - self._stop_requested > STOP_GRACE_S:
                break                      # the job ignores the stop: give up on it
            self._wait()
        return self.status

    def drain(self, last_step: int | None = None) -> str:
        """Read what the job printed last, close the log and return its whole text. `last_step`: the step line the
        trial needs last; a stream that ended short of it is read on once from get_job_logs (Ray ends the stream
        when the job ends, at times before its last lines went out)."""
        if self._tail is not None:
            ended = self.status is not None and self.status.is_terminal()
            self._tail.ended.wait(self.limits.drain_s if ended else min(1.0, self.limits.drain_s))
            complete = self._tail.ended.is_set()
            self._read_log()           # a broken stream falls back to get_job_logs here
            if self._tail is not None:
                self._close_tail()
                short = last_step is not None and (self.log.last_step is None or self.log.last_step < last_step)
                if not complete or short:   # the stream had not delivered the end: read the rest once
                    self.log_source += " (the end from get_job_logs)"
                    self._read_log()
        else:
            self._read_log()
        self.log.feed_text("", final=True)
        return self.text

    def _wait(self) -> None:
        """A poll interval; it ends early when the log stream ends (the job ended)."""
        if self._tail is not None and not self._tail.ended.is_set():
            self._tail.ended.wait(self.limits.poll_interval_s)
        else:
            self.sleep(self.limits.poll_interval_s)

    def _close_tail(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    def _poll_status(self):
        """The job's status, or None (after a poll interval's sleep) while the cluster is unreachable."""
        try:
            self.status = self.client.get_job_status(self.job_id)
        except Exception as e:     # the cluster may be briefly unreachable; give up after a while
            if self._lost_since is None:
                self._lost_since = self.clock()
            if self.clock() - self._lost_since > max(LOST_CLUSTER_S, 12 * self.limits.poll_interval_s):
                raise RunnerError(f"lost the Ray cluster at {self.where} while job {self.job_id} ran: "
                                  f"{one_line(e)}") from None
            self.sleep(self.limits.poll_interval_s)
            return None
        self._lost_since = None
        return self.status

    def _read_log(self) -> None:
        """Feed what the job printed since the last read: the stream's chunks, or (without a stream, or
        after it broke) get_job_logs' text past what was read."""
        if self._tail is not None:
            self._feed(self._tail.take())
            ended = self.status is not None and self.status.is_terminal()
            if not self._tail.ended.is_set() or (self._tail.error is None and ended):
                return
            why = self._tail.error or "it closed while the job ran"
            self.log_source = f"get_job_logs (the stream broke: {why[:200]})"
            self._close_tail()
        try:
            logs = self.client.get_job_logs(self.job_id)
        except Exception:          # the next poll reads it again
            return
        if len(logs) > self._seen:
            self._feed(logs[self._seen:])

    def _feed(self, chunk: str) -> None:
        if chunk:
            self._seen += len(chunk)
            self._parts.append(chunk)
            self.log.feed_text(chunk)

    def _over_limit(self, now: float) -> str | None:
        """Why the job must be stopped now, or None."""
        limits = self.limits
        if now - self.submitted > limits.timeout_s:
            return (f"stopped at the overall limit of {limits.timeout_s:.0f} s "
                    f"({steps_text(self._last_step)} logged)")
        if self._running_since is None:
            return None
        limit = limits.hang_timeout_s if self._last_step is not None else limits.startup_grace_s
        if now - self._last_progress > limit:
            what = f"step {self._last_step}" if self._last_step is not None else "the job started"
            return f"no new step line for {limit:.0f} s after {what}; stopped"
        return None

    def _stop(self, now: float) -> None:
        self._stop_requested = now
        try:
            self.client.stop_job(self.job_id)
        except Exception:          # it may have ended meanwhile; the next poll tells
            pass


def steps_text(last_step: int | None) -> str:
    return "no step" if last_step is None else f"steps up to {last_step}"


def one_line(e) -> str:
    return " ".join(str(e).split())
