"""How well the cost model predicts published training throughput (and the two reference recipes).

Predicts every usable row of benchmarks/data/public-throughput.csv (see benchmarks/public_data.py
for how rows map to a model, GPU, workload and layout) and prints: each case's prediction against
the published tokens/s per GPU; the median absolute percentage error (APE), overall and by
precision; the share of correctly ordered pairs among rows of one group (same source, model, GPU
and run settings: they differ only in layout); the largest misses with their step-time breakdown;
memory verdicts where a source states a peak or an OOM; and why the other rows are unusable.
Usage: python benchmarks/cost_model_accuracy.py [--csv PATH] [--verbose]
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.public_data import DEFAULT, Measurement, load_cases, reference_cases  # noqa: E402
from cost_model.nouns.case import Case  # noqa: E402
from cost_model.constants import Constants  # noqa: E402
from cost_model.memory import GIB  # noqa: E402
from cost_model.predict import Prediction, predict  # noqa: E402

TIE_FRACTION = 0.01  # pairs whose published throughputs differ by at most 1% are not ordered


# ------------------------------------------------------------------------------------------ metrics
def predict_case(case: Case, constants: Constants | None = None) -> Prediction:
    return predict(case.model, case.gpu, case.workload, case.layout, constants)


def evaluate(cases: list[Measurement], constants: Constants | None = None) -> dict:
    """Predict each case once and score the predictions.

    Returns {median_ape (percent), pairs_ordered, pairs_total, table}; `table` is a DataFrame, one row
    per case, with columns name, measurement, prediction, predicted, measured, ape (percent), fits,
    fit_verdict, peak_gib, group, precision, vlm. median_ape is nan when `cases` is empty; pairs are counted within
    Measurement.group (see `ordered_pairs`).
    """
    predictions = [predict_case(m.case, constants) for m in cases]
    table = pd.DataFrame({
        "name": [m.name for m in cases], "measurement": cases, "prediction": predictions,
        "predicted": [p.tokens_per_s_per_gpu for p in predictions],
        "measured": [m.measured_tokens_per_s_per_gpu for m in cases],
        "fits": [p.fits for p in predictions], "fit_verdict": [p.fit_verdict for p in predictions],
        "peak_gib": [p.peak_memory_gib for p in predictions],
        "group": [m.group for m in cases], "precision": [m.case.workload.precision for m in cases],
        "vlm": [m.vlm for m in cases]})
    table["ape"] = (table.predicted - table.measured).abs() / table.measured * 100
    ordered, total, _ = ordered_pairs(table)
    return dict(median_ape=table.ape.median(), pairs_ordered=ordered, pairs_total=total, table=table)


def ordered_pairs(table: pd.DataFrame) -> tuple[int, int, list[tuple]]:
    """Pairs of rows of one group whose published throughputs differ by more than 1% and whose
    layouts differ: (correctly ordered by the prediction, total, the pairs (a, b, verdict))."""
    # A dict, not DataFrame.groupby: ten times faster, and calibrate.py calls this thousands of times.
    by_group = defaultdict(list)
    for r in table.itertuples(index=False):
        by_group[r.group].append(r)
    pairs = []
    for rows in by_group.values():
        for a, b in combinations(rows, 2):
            if abs(a.measured - b.measured) <= TIE_FRACTION * max(a.measured, b.measured):
                continue
            if a.measurement.case.layout == b.measurement.case.layout:
                continue  # same layout: the difference is software, not layout
            right = (a.predicted - b.predicted) * (a.measured - b.measured) > 0
            pairs.append((a, b, right))
    return sum(ok for *_, ok in pairs), len(pairs), pairs


# ------------------------------------------------------------------------------------------ memory
_PEAK = re.compile(r"peak(?:\s+(?:alloc(?:ated)?|memory|mem))?\s*(<=|<|~|≈)?\s*([\d.]+)\s*(GiB|GB)"
                   r"|([\d.]+)\s*(GiB|GB)\s+peak", re.I)
_OOM = re.compile(r"\bOOM\b|out of memory", re.I)


def stated_memory(notes: str) -> tuple[str, float | None, str] | None:
    """(kind, GiB, text) for a peak memory ('peak alloc <65 GiB', '61.351 GB peak') or an OOM in the notes."""
    m = _PEAK.search(notes)
    if m:
        if m.group(2):
            bound, value, unit = m.group(1) or "", float(m.group(2)), m.group(3)
        else:
            bound, value, unit = "", float(m.group(4)), m.group(5)
        gib = value if unit.lower() == "gib" else value * 1e9 / GIB
        return ("below" if bound.startswith("<") else "about", gib, m.group(0))
    if _OOM.search(notes):
        return ("oom", None, "OOM")
    return None


def memory_verdict(stated: tuple[str, float | None, str], r) -> str:
    """How a row of the `evaluate` table's prediction compares with the memory its source states. A stated
    allocator peak ('peak alloc') is compared with the predicted allocator peak, any other with the
    predicted device-level peak (allocated + allocator reserve + memory outside PyTorch)."""
    kind, gib, text = stated
    peak = r.prediction.memory.allocated if "alloc" in text.lower() else r.peak_gib
    if kind == "oom":
        if r.prediction.borderline:
            return f"partly: predicted {r.prediction.fit_label} ({peak:.1f} GiB)"
        return "agrees (predicted not to fit)" if not r.fits else f"DISAGREES: predicted to fit ({peak:.1f} GiB)"
    if kind == "below":
        return "agrees" if peak < gib else f"DISAGREES: predicted {peak - gib:+.1f} GiB over the stated bound"
    err = peak / gib - 1
    return f"{err:+.0%} vs stated"


# ------------------------------------------------------------------------------------------ printing
def _fmt_case(r) -> str:
    m: Measurement = r.measurement
    c, lay = m.case, m.case.layout
    extra = [f"mbs{lay.rows_per_microbatch}"]
    if lay.recompute_granularity:
        extra.append("rc " + lay.recompute_label.replace("selective ", "sel "))
    extra.append(lay.dispatcher)
    label = f"{lay.label} {' '.join(extra)}"
    flags = (" vlm" if m.vlm else "") + ("" if c.workload.precision == "bf16" else " fp8")
    fit = f"{'fits' if r.fits else 'bord' if r.prediction.borderline else 'OOM '} {r.peak_gib:5.1f}"
    return (f"{m.name:32s} {c.model.display_name:19s} {c.gpu.display_name + ' x' + str(lay.world_size):11s} "
            f"{label:58s} {r.predicted:9,.0f} {r.measured:9,.0f} {r.ape:6.1f}  {fit}{flags}")


HEADER = (f"{'case':32s} {'model':19s} {'GPUs':11s} {'layout':58s} {'predicted':>9s} {'published':>9s} "
          f"{'APE %':>6s}  fits/peak GiB")


def _top_terms(breakdown: dict, n: int = 5) -> str:
    total = sum(breakdown.values()) or 1.0
    terms = sorted(breakdown.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.2f}s ({v / total:.0%})" for k, v in terms if v > 0)


def _subset(rows: pd.DataFrame) -> str:
    return f"{rows.ape.median():5.1f}% (n={len(rows)})" if len(rows) else "   n/a (n=0)"


def _say_cases(say, table: pd.DataFrame, verbose: bool) -> None:
    say(HEADER)
    for r in table.itertuples(index=False):
        say(_fmt_case(r))
        if verbose:
            w = r.measurement.case.workload
            say(f"{'':34s}routing {w.routing}, {w.precision}, seq {w.seq_len}, gbs {w.global_batch}; "
                f"{r.prediction.num_microbatches} microbatches; {_top_terms(r.prediction.breakdown)}")
            for note in r.measurement.notes:
                say(f"{'':34s}note: {note}")


def _say_references(say, refs: dict, verbose: bool) -> None:
    say("Reference recipes (slime, measured by this project)")
    say(HEADER)
    for r in refs["table"].itertuples(index=False):
        say(_fmt_case(r))
        if verbose:
            say(f"{'':34s}{_top_terms(r.prediction.breakdown)}")
    say(f"median APE of the reference recipes: {refs['median_ape']:.1f}%")


def _say_accuracy(say, table: pd.DataFrame, verbose: bool) -> None:
    say("Accuracy on the public rows")
    say(f"  median APE, all usable BF16+FP8 rows: {_subset(table)}")
    say(f"  median APE, BF16 rows:                {_subset(table[table.precision == 'bf16'])}")
    say(f"  median APE, FP8 rows:                 {_subset(table[table.precision == 'fp8'])}")
    say(f"  median APE, excluding VLM rows:       {_subset(table[~table.vlm.astype(bool)])}")
    under = (table.predicted < table.measured).sum()
    say(f"  predicted below published: {under} of {len(table)}; "
        f"median predicted/published {(table.predicted / table.measured).median():.2f}"
        if len(table) else "  no usable rows")
    ordered, total, pairs = ordered_pairs(table)
    share = f"{ordered / total:.0%}" if total else "n/a"
    groups = len({a.group for a, _, _ in pairs})
    say(f"  correctly ordered pairs within a group: {ordered} of {total} ({share}) over {groups} group(s); "
        f"pairs within {TIE_FRACTION:.0%} or with identical layouts skipped")
    if verbose:
        for a, b, ok in pairs:
            say(f"    {'ok ' if ok else 'BAD'} {a.name} vs {b.name}: published {a.measured:,.0f} vs "
                f"{b.measured:,.0f}, predicted {a.predicted:,.0f} vs {b.predicted:,.0f}")


def _say_misses(say, table: pd.DataFrame) -> None:
    say("Largest misses")
    for r in table.sort_values("ape", ascending=False, kind="stable").head(3).itertuples(index=False):
        p, m = r.prediction, r.measurement
        say(f"  {m.name}: predicted {r.predicted:,.0f} vs published {r.measured:,.0f} "
            f"({r.predicted / r.measured - 1:+.0%}); step {p.step_time_s:.2f} s, {p.num_microbatches} "
            f"microbatches, MFU {p.mfu:.0%}")
        say(f"    {_top_terms(p.breakdown, 6)}")
        say(f"    notes: {m.row.get('notes', '')[:200]}")


def _say_memory(say, table: pd.DataFrame, unusable: list[tuple[dict, str]]) -> None:
    say("Memory verdicts (rows whose notes state a peak memory or an OOM)")
    found = 0
    for row, r, why in [(r.measurement.row, r, None) for r in table.itertuples(index=False)] + \
            [(row, None, why) for row, why in unusable]:
        stated = stated_memory(row.get("notes", ""))
        if not stated:
            continue
        found += 1
        if r is None:
            say(f"  {row['model']} {row['gpu']} x{row['num_gpus']}: states '{stated[2]}'; row unusable ({why})")
            continue
        alloc = (f"allocator peak {r.prediction.memory.allocated:.1f} GiB, device " if "alloc" in stated[2].lower()
                 else "")
        say(f"  {r.name}: states '{stated[2]}'; predicted {alloc}peak {r.peak_gib:.1f} GiB of "
            f"{r.prediction.gpu_memory_gib:.1f} usable -> {memory_verdict(stated, r)}")
    if not found:
        say("  none")
    oom = table[table.fit_verdict == "does not fit"]
    say(f"  published runs (all of which ran) predicted not to fit: {len(oom)} of {len(table)}")
    for r in table[table.fit_verdict == "borderline"].itertuples(index=False):
        say(f"    borderline (ran): {r.name}: {r.prediction.reasons[-1]}")
    for r in oom.itertuples(index=False):
        lay = r.measurement.case.layout
        say(f"    {r.name}: predicted peak {r.peak_gib:.1f} GiB of {r.prediction.gpu_memory_gib:.1f} usable "
            f"({lay.label} mbs{lay.rows_per_microbatch}, rc {lay.recompute_label})")


def report(csv_path: Path, verbose: bool = False, out=sys.stdout, held_out: bool = False) -> dict:
    def say(*a):
        print(*a, file=out)

    cases, unusable = load_cases(csv_path)
    result = evaluate(cases)
    table = result["table"]
    say(f"Public measurements: {len(cases)} usable rows of {len(cases) + len(unusable)} ({csv_path})")
    _say_cases(say, table, verbose)
    say("")
    _say_references(say, evaluate(reference_cases()), verbose)
    say("")
    _say_accuracy(say, table, verbose)
    say("")
    _say_misses(say, table)
    say("")
    _say_memory(say, table, unusable)
    say("")
    say(f"Unusable rows: {len(unusable)}")
    for why, n in Counter(why for _, why in unusable).most_common():
        say(f"  {n:3d}  {why}")
    megatron_style = [why for _, why in unusable if not why.startswith(("no tokens/s", "FSDP not modelled"))]
    say(f"  Megatron-style rows with a tokens/s figure answered: {len(cases)} of {len(cases) + len(megatron_style)} "
        f"({len(cases) / max(1, len(cases) + len(megatron_style)):.0%})")
    if held_out:
        say("")
        _say_held_out(say, cases)
    return result


def _say_held_out(say, cases) -> None:
    """The out-of-sample figures: nested leave-one-source-out, each fold fitted from a cold start."""
    from benchmarks.calibrate import (TRIM_FACTOR, error_by, fits_megatron_constants,   # calibrate imports this
                                      held_out_table)

    cold = held_out_table(cases, cold=True)
    warm = held_out_table(cases, cold=False)
    pairs = ordered_pairs(cold)
    say("Held out (nested leave-one-source-out: each source predicted by Megatron constants fitted from a cold "
        "start on the other sources' rows, trimmed of those the fold's fit misses by more than "
        f"{TRIM_FACTOR:g}x)")
    say(f"  median APE: {cold.ape.median():.1f}% over {len(cold)} rows in {cold.source.nunique()} sources "
        f"(starting each fold from the shipped, all-data constants instead: {warm.ape.median():.1f}%)")
    fitted = cold.measurement.map(fits_megatron_constants).astype(bool)
    out = cold[~fitted]
    say(f"  rows of the kind the constants are fitted on (full training, text): {_subset(cold[fitted])}; LoRA and "
        f"VLM rows (in no fit): {_subset(out)}"
        + (f", median predicted/published {(out.predicted / out.measured).median():.2f}" if len(out) else ""))
    say(f"  correctly ordered pairs within a group: {pairs[0]} of {pairs[1]}"
        + (f" ({pairs[0] / pairs[1]:.0%})" if pairs[1] else ""))
    for key, frame in error_by(cold).items():
        say(f"  by {key}: " + "; ".join(f"{name} {row['median']:.1f}% (n={int(row['count'])})"
                                        for name, row in frame.iterrows()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT, help="published measurements (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="per-case breakdown, mapping notes and pair verdicts")
    parser.add_argument("--in-sample-only", action="store_true",
                        help="skip the nested leave-one-source-out fits (a few minutes)")
    args = parser.parse_args(argv)
    report(args.csv, args.verbose, held_out=not args.in_sample_only)


if __name__ == "__main__":
    main()
