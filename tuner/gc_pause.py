"""Python's cyclic garbage collector paused while the tuner scores a space or builds the agent's table, and what they
built kept out of its later scans.

Both allocate millions of small objects that reference counting frees, beside memos of hundreds of thousands of
entries: the cyclic collector, run every few hundred allocations, scans those memos again and again for cycles this
work does not make (8% of scoring the default space, 17% of the agent's build). It is back on, as it was, after; and
what is alive then (the scored space, the memos, the agent's table: kept until tune exits) is frozen (gc.freeze), so
the collections of the trials that follow do not scan it again (the default job's collections 0.6 -> 0.13 s).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def kept_work():
    """The block runs without the cyclic collector; on leaving it (an exception too) everything alive is frozen and
    the collector is on again if it was.

    Process-wide, as the collector is: every thread's allocations go uncollected while the block runs, and
    gc.freeze moves every object alive at its end, not only this block's, out of the collector's sight for good
    (cyclic garbage among them, or cycles among them that die later, are freed only at exit; reference counting
    still frees the rest). Right for tune, whose scored space and memos live until it exits; a long-lived process
    calling this many times keeps such cycles (gc.unfreeze hands them back)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
