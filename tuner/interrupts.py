"""SIGTERM, SIGINT and SIGHUP end a tuning run the same way, never between a trial's creation and its record.

While a run is on (`as_interrupt`), each raises KeyboardInterrupt, so the running trial is marked
failed ("interrupted") instead of being left RUNNING. Inside `held()` (a trial being created and getting
its owner and first heartbeat) a signal is noted and raised only when the block ends: a trial is then
either not made at all or made with everything the next run needs to recover it. Every storage call of the
run is held the same way (`storage_calls_held`): a signal never stops one halfway. A flag, not
pthread_sigmask: Python runs handlers in the main thread whichever thread the OS picked, so a mask on the
main thread alone would not hold them off while heartbeat threads run.

A reader that leaves (`tune ... | head`: a broken pipe on stdout or stderr) ends the run the same way: Python ignores
SIGPIPE and raises BrokenPipeError from the write instead, an Exception the trial loop does not treat as an interrupt,
so the running trial was left RUNNING (failed by the next run as stale). While a run is on, the streams are guarded
(`_PipeGuard`): the broken stream is pointed at /dev/null and ReaderLeft, a KeyboardInterrupt, is raised as a signal
would be (held off the same way), so the trial is marked interrupted and `tune` exits quietly (tuner.cli).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())
_state = {"held": 0, "pending": None}
READER_LEFT = "reader left"    # the pending cause of a broken pipe (a signal's is its number)


class ReaderLeft(KeyboardInterrupt):
    """The reader of stdout or stderr left (a broken pipe): the run stops as on a signal, and `tune` says nothing."""


def _interrupt(cause) -> KeyboardInterrupt:
    return ReaderLeft("the reader of the output left") if cause == READER_LEFT else KeyboardInterrupt(f"signal {cause}")


def _handler(signum, frame):
    _stop(signum)


def _stop(cause) -> None:
    """Raise the interrupt now, or note it for the end of `held()`."""
    if _state["held"]:
        _state["pending"] = cause
        return
    raise _interrupt(cause)


@contextlib.contextmanager
def as_interrupt():
    """SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the process was started ignoring stays ignored: `nohup tune` keeps running when the terminal closes,
    # and a job a script put in the background ignores SIGINT, as Unix has it
    previous = {s: signal.signal(s, _handler) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    streams = {name: getattr(sys, name) for name in ("stdout", "stderr") if getattr(sys, name) is not None}
    guards = {name: _PipeGuard(stream) for name, stream in streams.items()}
    for name, guard in guards.items():
        setattr(sys, name, guard)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for name, guard in guards.items():
            if getattr(sys, name) is guard:   # unless someone replaced it meanwhile
                setattr(sys, name, streams[name])


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
            raise _interrupt(pending)
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


class _PipeGuard:
    """A text stream whose broken pipe stops the run as a signal does (`_stop`), instead of raising BrokenPipeError:
    the stream is pointed at /dev/null first, so what is still written (the interrupted trial's record, the buffer
    flushed at exit) goes nowhere quietly. A heartbeat thread's broken pipe is raised by the main thread at the end
    of its next held block (every storage call is one)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._guarded(self._stream.write, text)

    def writelines(self, lines):
        return self._guarded(self._stream.writelines, lines)

    def flush(self):
        return self._guarded(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            _to_devnull(self._stream)
            if threading.current_thread() is threading.main_thread():
                _stop(READER_LEFT)
            else:
                _state["pending"] = _state["pending"] or READER_LEFT
            return None


def _to_devnull(stream) -> None:
    """Point the stream's file descriptor at /dev/null, its buffer emptied there (nothing else can read it now)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
