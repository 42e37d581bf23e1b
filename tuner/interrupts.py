"""SIGTERM, SIGINT and SIGHUP end a tuning run the same way, never between a trial's creation and its record.

While a run is on (`as_interrupt`), each raises KeyboardInterrupt, so the running trial is marked
failed ("interrupted") instead of being left RUNNING. Inside `held()` (a trial being created and getting
its owner and first heartbeat) a signal is noted and raised only when the block ends: a trial is then
either not made at all or made with everything the next run needs to recover it. A flag, not
pthread_sigmask: Python runs handlers in the main thread whichever thread the OS picked, so a mask on the
main thread alone would not hold them off while heartbeat threads run.
"""
from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
_state = {"held": 0, "pending": None}


def _handler(signum, frame):
    if _state["held"]:
        _state["pending"] = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def as_interrupt():
    """SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the process was started ignoring stays ignored: `nohup tune` keeps running when the terminal closes,
    # and a job a script put in the background ignores SIGINT, as Unix has it
    previous = {s: signal.signal(s, _handler) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def held():
    """Signals that arrive while the block runs are raised (as KeyboardInterrupt) once it has ended."""
    _state["held"] += 1
    try:
        yield
    finally:
        _state["held"] -= 1
        pending, _state["pending"] = _state["pending"], None
        if pending is not None and not _state["held"]:
            raise KeyboardInterrupt(f"signal {pending}")
        _state["pending"] = pending if _state["held"] else None
