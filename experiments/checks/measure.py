"""What every profile section measures with: torch loaded lazily, timing marks on the device, median
timing of back-to-back calls, figures to 4 significant digits, and failures kept as one-line notes."""
from __future__ import annotations

import math
import statistics
import time
import warnings


def sig(x: float | None, digits: int = 4) -> float | None:
    """x to `digits` significant digits (how every profile figure is written); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}")


def load_torch():
    """torch, imported on first use (the shape grid and the CLI's no-GPU exit need none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
    return torch


def sync(device) -> None:
    if device.type == "cuda":
        load_torch().cuda.synchronize(device)


def mark(device):
    """A point in time on `device`'s current stream (a recorded CUDA event; perf_counter on CPU)."""
    if device.type == "cuda":
        event = load_torch().cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def seconds_between(start, end) -> float:
    """Seconds between two marks (CUDA marks need a synchronize first)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def median_time(fn, device, repeats: int, warmup: int = 3, target_s: float = 1e-3,
                max_inner: int = 32) -> float:
    """Median seconds per call of fn: warm-up, then `repeats` samples of `inner` back-to-back calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = mark(device)
    fn()
    end = mark(device)
    sync(device)
    inner = max(1, min(max_inner, math.ceil(target_s / max(seconds_between(start, end), 1e-7))))
    return statistics.median(batch_times(fn, device, 0, inner, repeats))


def batch_times(fn, device, warmup: int, iters: int, samples: int) -> list[float]:
    """Seconds per call, one figure per sample of `iters` back-to-back calls (as nccl-tests times them).

    Timing calls in batches keeps the host's launch gaps out of the figure; every rank makes the
    same fixed number of calls, as collectives require.
    """
    for _ in range(warmup):
        fn()
    marks = []
    for _ in range(samples):
        start = mark(device)
        for _ in range(iters):
            fn()
        marks.append((start, mark(device)))
    sync(device)
    return [seconds_between(s, e) / iters for s, e in marks]


def synced_times(fn, device, samples: int) -> list[float]:
    """Wall-clock seconds of single calls, each between two device synchronisations.

    Not what training sees (it launches back to back) but what a simple probe measures; kept
    beside the batched figure so the two can be compared.
    """
    out = []
    for _ in range(samples):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def collapse_notes(notes: list[str]) -> list[str]:
    """Keep the first of notes that repeat one section's error (same first word, same error text)."""
    out: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    extra: dict[int, int] = {}
    for note in notes:
        head, _, err = note.partition(": ")
        key = (head.split(" ")[0], err)
        if err and key in seen:
            extra[seen[key]] = extra.get(seen[key], 0) + 1
            continue
        seen[key] = len(out)
        out.append(note)
    return [n + (f" (and {extra[i]} more points with the same error)" if i in extra else "")
            for i, n in enumerate(out)]


def note_failure(notes: list, what: str, err: BaseException) -> None:
    """Record a failure as one note line and release cached GPU memory."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    # a spawned rank's failure carries its traceback: its last line names the error
    text = (lines[-1] if any(line.startswith("Traceback") for line in lines) else lines[0]) if lines else ""
    notes.append(f"{what}: {type(err).__name__}: {text[:300]}")
    torch = load_torch()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

