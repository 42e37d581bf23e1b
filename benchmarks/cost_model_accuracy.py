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
import math
import re
import statistics
import sys
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.public_data import DEFAULT, Case, load_cases, reference_cases  # noqa: E402
from cost_model.constants import Constants  # noqa: E402
from cost_model.memory import GIB  # noqa: E402
from cost_model.predict import predict  # noqa: E402

TIE_FRACTION = 0.01  # pairs whose published throughputs differ by at most 1% are not ordered


# ------------------------------------------------------------------------------------------ metrics
def evaluate(cases: list[Case], constants: Constants | None = None) -> dict:
    """Predict each case once and score the predictions.

    Returns {median_ape (percent), pairs_ordered, pairs_total, per_case: [dict per case]}; each
    per-case dict has name, case, prediction, predicted, measured, ape (percent), fits, peak_gib.
    median_ape is nan when `cases` is empty; pairs are counted within Case.group (see `ordered_pairs`).
    """
    per_case = []
    for case in cases:
        p = predict(case.model, case.gpu, case.workload, case.layout, constants)
        measured = case.measured_tokens_per_s_per_gpu
        per_case.append(dict(
            name=case.name, case=case, prediction=p, predicted=p.tokens_per_s_per_gpu, measured=measured,
            ape=abs(p.tokens_per_s_per_gpu - measured) / measured * 100, fits=p.fits, peak_gib=p.peak_memory_gib,
            group=case.group, precision=case.workload.precision, vlm=case.vlm))
    ordered, total, _ = ordered_pairs(per_case)
    return dict(median_ape=median_ape(per_case), pairs_ordered=ordered, pairs_total=total, per_case=per_case)


def median_ape(per_case: list[dict]) -> float:
    return statistics.median(r["ape"] for r in per_case) if per_case else math.nan


def ordered_pairs(per_case: list[dict]) -> tuple[int, int, list[tuple[dict, dict, bool]]]:
    """Pairs of rows of one group whose published throughputs differ by more than 1% and whose
    layouts differ: (correctly ordered by the prediction, total, the pairs with their verdict)."""
    by_group = defaultdict(list)
    for r in per_case:
        by_group[r["group"]].append(r)
    pairs = []
    for rows in by_group.values():
        for a, b in combinations(rows, 2):
            ma, mb = a["measured"], b["measured"]
            if abs(ma - mb) <= TIE_FRACTION * max(ma, mb):
                continue
            if a["case"].layout == b["case"].layout:
                continue  # same layout: the difference is software, not layout
            right = (a["predicted"] - b["predicted"]) * (ma - mb) > 0
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


def memory_verdict(stated: tuple[str, float | None, str], r: dict) -> str:
    kind, gib, _ = stated
    peak, cap = r["peak_gib"], r["prediction"].gpu_memory_gib
    if kind == "oom":
        return "agrees (predicted not to fit)" if not r["fits"] else f"DISAGREES: predicted to fit ({peak:.1f} GiB)"
    if kind == "below":
        return "agrees" if peak < gib else f"DISAGREES: predicted {peak - gib:+.1f} GiB over the stated bound"
    err = peak / gib - 1
    return f"{err:+.0%} vs stated"


# ------------------------------------------------------------------------------------------ printing
def _fmt_case(r: dict) -> str:
    c: Case = r["case"]
    lay = c.layout
    extra = [f"mbs{lay.rows_per_microbatch}"]
    if lay.recompute_granularity:
        extra.append("rc " + lay.recompute_label.replace("selective ", "sel "))
    extra.append(lay.dispatcher)
    label = f"{lay.label} {' '.join(extra)}"
    flags = (" vlm" if c.vlm else "") + ("" if c.workload.precision == "bf16" else " fp8")
    fit = f"{'fits' if r['fits'] else 'OOM '} {r['peak_gib']:5.1f}"
    return (f"{c.name:32s} {c.model.display_name:19s} {c.gpu.display_name + ' x' + str(lay.world_size):11s} "
            f"{label:58s} {r['predicted']:9,.0f} {r['measured']:9,.0f} {r['ape']:6.1f}  {fit}{flags}")


HEADER = (f"{'case':32s} {'model':19s} {'GPUs':11s} {'layout':58s} {'predicted':>9s} {'published':>9s} "
          f"{'APE %':>6s}  fits/peak GiB")


def _top_terms(breakdown: dict, n: int = 5) -> str:
    total = sum(breakdown.values()) or 1.0
    terms = sorted(breakdown.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.2f}s ({v / total:.0%})" for k, v in terms if v > 0)


def _subset(per_case, pred) -> str:
    rows = [r for r in per_case if pred(r)]
    return f"{median_ape(rows):5.1f}% (n={len(rows)})" if rows else "   n/a (n=0)"


def report(csv_path: Path, verbose: bool = False, out=sys.stdout) -> dict:
    def say(*a):
        print(*a, file=out)

    cases, unusable = load_cases(csv_path)
    result = evaluate(cases)
    per_case = result["per_case"]
    refs = evaluate(reference_cases())

    say(f"Public measurements: {len(cases)} usable rows of {len(cases) + len(unusable)} ({csv_path})")
    say(HEADER)
    for r in per_case:
        say(_fmt_case(r))
        if verbose:
            c = r["case"]
            say(f"{'':34s}routing {c.workload.routing}, {c.workload.precision}, seq {c.workload.seq_len}, "
                f"gbs {c.workload.global_batch}; {r['prediction'].num_microbatches} microbatches; "
                f"{_top_terms(r['prediction'].breakdown)}")
            for note in c.notes:
                say(f"{'':34s}note: {note}")
    say("")
    say("Reference recipes (slime, measured by this project)")
    say(HEADER)
    for r in refs["per_case"]:
        say(_fmt_case(r))
        if verbose:
            say(f"{'':34s}{_top_terms(r['prediction'].breakdown)}")
    say(f"median APE of the reference recipes: {refs['median_ape']:.1f}%")

    say("")
    say("Accuracy on the public rows")
    say(f"  median APE, all usable BF16+FP8 rows: {_subset(per_case, lambda r: True)}")
    say(f"  median APE, BF16 rows:                {_subset(per_case, lambda r: r['precision'] == 'bf16')}")
    say(f"  median APE, FP8 rows:                 {_subset(per_case, lambda r: r['precision'] == 'fp8')}")
    say(f"  median APE, excluding VLM rows:       {_subset(per_case, lambda r: not r['vlm'])}")
    under = sum(r["predicted"] < r["measured"] for r in per_case)
    say(f"  predicted below published: {under} of {len(per_case)}; "
        f"median predicted/published {statistics.median(r['predicted'] / r['measured'] for r in per_case):.2f}"
        if per_case else "  no usable rows")
    ordered, total, pairs = ordered_pairs(per_case)
    share = f"{ordered / total:.0%}" if total else "n/a"
    groups = len({a['group'] for a, _, _ in pairs})
    say(f"  correctly ordered pairs within a group: {ordered} of {total} ({share}) over {groups} group(s); "
        f"pairs within {TIE_FRACTION:.0%} or with identical layouts skipped")
    if verbose:
        for a, b, ok in pairs:
            say(f"    {'ok ' if ok else 'BAD'} {a['name']} vs {b['name']}: published {a['measured']:,.0f} vs "
                f"{b['measured']:,.0f}, predicted {a['predicted']:,.0f} vs {b['predicted']:,.0f}")

    say("")
    say("Largest misses")
    for r in sorted(per_case, key=lambda r: -r["ape"])[:3]:
        p = r["prediction"]
        c = r["case"]
        say(f"  {c.name}: predicted {r['predicted']:,.0f} vs published {r['measured']:,.0f} "
            f"({r['predicted'] / r['measured'] - 1:+.0%}); step {p.step_time_s:.2f} s, {p.num_microbatches} "
            f"microbatches, MFU {p.mfu:.0%}")
        say(f"    {_top_terms(p.breakdown, 6)}")
        say(f"    notes: {c.row.get('notes', '')[:200]}")

    say("")
    say("Memory verdicts (rows whose notes state a peak memory or an OOM)")
    by_index = {r["case"].index: r for r in per_case}
    found = 0
    for row, why in [(c.row, None) for c in cases] + list(unusable):
        stated = stated_memory(row.get("notes", ""))
        if not stated:
            continue
        found += 1
        label = f"{row['model']} {row['gpu']} x{row['num_gpus']}"
        if why is not None:
            say(f"  {label}: states '{stated[2]}'; row unusable ({why})")
            continue
        r = next(r for r in by_index.values() if r["case"].row is row)
        say(f"  {r['name']}: states '{stated[2]}'; predicted peak {r['peak_gib']:.1f} GiB of "
            f"{r['prediction'].gpu_memory_gib:.1f} usable -> {memory_verdict(stated, r)}")
    if not found:
        say("  none")
    oom = [r for r in per_case if not r["fits"]]
    say(f"  published runs (all of which ran) predicted not to fit: {len(oom)} of {len(per_case)}")
    for r in oom:
        say(f"    {r['name']}: predicted peak {r['peak_gib']:.1f} GiB of {r['prediction'].gpu_memory_gib:.1f} usable "
            f"({r['case'].layout.label} mbs{r['case'].layout.rows_per_microbatch}, "
            f"rc {r['case'].layout.recompute_label})")

    say("")
    say(f"Unusable rows: {len(unusable)}")
    for why, n in Counter(why for _, why in unusable).most_common():
        say(f"  {n:3d}  {why}")
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT, help="published measurements (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="per-case breakdown, mapping notes and pair verdicts")
    args = parser.parse_args(argv)
    report(args.csv, args.verbose)


if __name__ == "__main__":
    main()
