"""SIGTERM, SIGINT and SIGHUP end a tuning run the same way, never between a trial's creation and its record.

While a run is on (`as_interrupt`), each raises KeyboardInterrupt, so the running trial is marked
failed ("interrupted") instead of being left RUNNING. Inside `held()` (a trial being created and getting
its owner and first heartbeat) a signal is noted and raised only when the block ends: a trial is then
either not made at all or made with everything the next run needs to recover it. Every storage call of the
run is held the same way (`storage_calls_held`): a signal never stops one halfway. A flag, not
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


@contextlib.contextmanager
def storage_calls_held(storage):
    """While the block runs, each call of `storage`'s public methods from the main thread runs inside `held()`: a
    signal is raised once the call has returned, never inside it. Optuna rolls a storage call back on an Exception,
    not on a KeyboardInterrupt, and SQLAlchemy's sessions and pool are not written for an exception raised at any
    bytecode; a call stopped halfway could leave its transaction open, holding the database's write lock. The cost:
    a signal waits for the call in flight (a lock wait included, at most the storage's own timeout)."""
    names = [n for n in dir(type(storage)) if not n.startswith("_") and callable(getattr(type(storage), n, None))]
    for name in names:
        setattr(storage, name, _held_call(getattr(storage, name)))
    try:
        yield storage
    finally:
        for name in names:
            with contextlib.suppress(AttributeError):
                delattr(storage, name)


def _held_call(method):
    def call(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return method(*args, **kwargs)   # held() raises in the thread that ends it: the main thread's alone
        with held():
            return method(*args, **kwargs)
    call.__wrapped__ = method
    return call
