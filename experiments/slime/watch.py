"""Watching a submitted slime job: stream its log into a `SlimeLog` and stop it when it passes a limit.

Three limits, each settable (`Limits`):
- start-up grace: from the job's start (Ray reports it RUNNING) to its first `step N:` line. A real slime
  job pulls its image, starts its Ray actors and loads the model first, which takes minutes;
- step-hang timeout: from one new step line to the next (a collective that never completes);
- overall timeout: from submission to the end, whatever the job printed.
A job the runner stopped that still has not ended after `STOP_GRACE_S` is given up on.

The clock and the sleep are injected, so that the limits can be tested without waiting for them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from experiments.runner import RunnerError
from experiments.slime.log import SlimeLog

STOP_GRACE_S = 120.0
# An unreachable cluster is tolerated this long (or 12 polls, when longer) before the trial is given up.
LOST_CLUSTER_S = 60.0


@dataclass(frozen=True)
class Limits:
    """When the runner stops a job (seconds)."""
    startup_grace_s: float       # job started -> first step line (image pull, actor start, model load)
    hang_timeout_s: float        # one step line -> the next
    timeout_s: float             # submission -> end
    poll_interval_s: float = 5.0


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
    status: object = None        # the last JobStatus seen
    stopped: str | None = None   # why the runner stopped the job; None while it has not
    _parts: list[str] = field(default_factory=list)
    _seen: int = 0
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
            self.sleep(self.limits.poll_interval_s)
        return self.status

    def drain(self) -> str:
        """Read what the job printed last, close the log and return its whole text."""
        self._read_log()
        self.log.feed_text("", final=True)
        return self.text

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
        try:
            logs = self.client.get_job_logs(self.job_id)
        except Exception:          # the next poll reads it again
            return
        if len(logs) > self._seen:
            chunk = logs[self._seen:]
            self._seen = len(logs)
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
