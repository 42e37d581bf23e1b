"""Progress of the long steps before a study's first trial: scoring the search space, weighing it under the
cost model's hypotheses, saving the scored space.

A large space (thousands of GPUs) takes minutes; it says what it is doing within a second or two, with counts
and a rate. On a terminal the progress is one line on stderr, rewritten in place and erased when the step ends,
so an error found after it (no layout fits) is the only line left. Elsewhere (a log, a pipe) progress lines go
to stdout, one every PROGRESS_LOG_EVERY_S, so stderr still holds one line per error; with --json stdout holds the
JSON alone, and they go to stderr. --no-progress: none at all (stdout then holds the result alone).
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

PROGRESS_AFTER_S = 2.0       # a step's first counts line
PROGRESS_EVERY_S = 2.0       # then one every so often: rewritten in place on a terminal,
PROGRESS_LOG_EVERY_S = 10.0  # a new line in a log or a pipe
ANNOUNCE_AFTER_S = 0.5       # a step still running after this says what it is
_ERASE = "\r\x1b[K"          # to the line's start, then erase it


class Progress:
    def __init__(self, json_out: bool = False, quiet: bool = False):
        self.tty = sys.stderr.isatty()
        self.stream = sys.stderr if self.tty or json_out else sys.stdout
        self.quiet = quiet
        self.last, self.open = -float("inf"), False
        self.lock = threading.Lock()     # an announcement comes from a timer thread

    def __call__(self, line: str, now: bool = False) -> None:
        """`line` as progress; at most one every PROGRESS_EVERY_S (terminal) or PROGRESS_LOG_EVERY_S (log),
        unless `now`."""
        if self.quiet:
            return
        with self.lock:
            t = time.monotonic()
            if not now and t - self.last < (PROGRESS_EVERY_S if self.tty else PROGRESS_LOG_EVERY_S):
                return
            if self.tty:
                print(_ERASE + line, end="", file=self.stream, flush=True)
                self.open = True
            else:
                print(line, file=self.stream, flush=True)
            if not now:
                self.last = t

    def done(self) -> None:
        """Erase a line left in place: what comes next (an error included) starts on a clean line."""
        with self.lock:
            if self.open:
                print(_ERASE, end="", file=self.stream, flush=True)
                self.open = False
            self.last = -float("inf")

    @contextmanager
    def step(self, message: str, after_s: float | None = None):
        """`message` once the block has run `after_s` (ANNOUNCE_AFTER_S) seconds (a quick step says nothing);
        erased at its end."""
        timer = threading.Timer(ANNOUNCE_AFTER_S if after_s is None else after_s, lambda: self(message, now=True))
        timer.daemon = True
        timer.start()
        try:
            yield self
        finally:
            timer.cancel()
            self.done()


class Counter:
    """Counts a step's units of work and reports them (count, time, rate) once the step has run
    PROGRESS_AFTER_S; `what` names the units ("layouts scored")."""

    def __init__(self, progress: Progress | None, what: str, tail=lambda: ""):
        self.progress, self.what, self.tail = progress, what, tail
        self.count, self.started = 0, time.monotonic()

    def add(self, n: int = 1) -> None:
        self.count += n
        if self.progress is not None and self.count % 64 == 0:
            t = time.monotonic() - self.started
            if t >= PROGRESS_AFTER_S:
                self.progress(f"  {self.what}: {self.count:,} in {t:.0f} s ({self.count / t:,.0f}/s){self.tail()}")
