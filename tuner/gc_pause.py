"""Python's cyclic garbage collector paused while the tuner scores a space or builds the agent's table.

Both allocate millions of small objects that reference counting frees, beside memos of hundreds of thousands of
entries: the cyclic collector, run every few hundred allocations, scans those memos again and again for cycles this
work does not make (8% of scoring the default space, 17% of the agent's build). It is back on, as it was, after.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def no_cyclic_gc():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
