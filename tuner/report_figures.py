"""The PNG figures of `tune report` (matplotlib, Agg backend: no display, no network).

Each function takes the report's trial facts (tuner.report_html.TrialFacts) and returns a Drawn figure (its
PNG bytes and a one-line caption), or None when the study has nothing to draw; tuner.report_html names and
writes the files. Every axis and legend entry says whether its figures are predicted (the cost model) or
measured (a real run). A name from a study (a hypothesis, a step term) is drawn as plain text (`_text`).
"""
from __future__ import annotations

import io
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib import ticker  # noqa: E402

from cost_model.nouns.names import printable  # noqa: E402

COLOR = {"predicted": "tab:blue", "measured": "tab:orange"}
MARKER = {"predicted": "o", "measured": "D"}
WIDTH, DPI = 11.0, 100
TOP_WEIGHTS = 7   # hypotheses drawn one by one; the rest are summed as "others"


class Drawn(NamedTuple):
    caption: str
    png: bytes


def _png(fig) -> bytes:
    try:
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, dpi=DPI, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _text(value) -> str:
    """Stored text as matplotlib draws it literally: no control characters (no font has them) and no $...$
    (read as mathematics: an unbalanced one is an exception, not a figure)."""
    return "\n".join(printable(line) for line in str(value).split("\n")).replace("$", r"\$")


def _tokens_axis(ax, kind: str = "") -> None:
    ax.set_ylabel(f"tokens/s/GPU{f' ({kind})' if kind else ''}")
    ax.yaxis.set_major_formatter(ticker.StrMethodFormatter("{x:,.0f}"))
    ax.grid(True, alpha=0.3)


def _trial_axis(ax) -> None:
    ax.set_xlabel("trial number")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _running_best(points: list[tuple[int, float]], last: int) -> tuple[list[int], list[float]]:
    """The best so far at each trial of `points`, held to trial `last`."""
    xs, ys, best = [], [], None
    for x, y in sorted(points):
        best = y if best is None else max(best, y)
        xs.append(x)
        ys.append(best)
    if xs[-1] < last:
        xs.append(last)
        ys.append(best)
    return xs, ys


def best_over_trials(facts) -> Drawn | None:
    """The best tokens/s/GPU so far, trial by trial: measured when any trial was measured, and predicted."""
    done = [f for f in facts if f.state == "complete"]
    series = {"measured": [(f.number, f.measured) for f in done if f.measured is not None],
              "predicted": [(f.number, f.predicted) for f in done if f.predicted is not None]}
    if not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    captions = []
    for kind, points in series.items():
        if not points:
            continue
        xs, ys = _running_best(points, max(f.number for f in done))
        solid = kind == "measured" or not series["measured"]
        ax.scatter(*zip(*points), color=COLOR[kind], marker=MARKER[kind], alpha=0.35, s=22,
                   label=f"each trial ({kind})")
        ax.step(xs, ys, where="post", color=COLOR[kind], linewidth=2.2 if solid else 1.4,
                linestyle="-" if solid else "--", label=f"best so far ({kind})")
        best_x = min(x for x, y in points if y == ys[-1])
        captions.append(f"best {kind} {ys[-1]:,.0f} tokens/s/GPU (trial {best_x})")
    _trial_axis(ax)
    _tokens_axis(ax)
    ax.set_title("Best tokens/s/GPU over trials")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)   # beside the axes: no point hidden
    return Drawn("; ".join(captions), _png(fig))


def interval_vs_measured(facts) -> Drawn | None:
    """Per trial that ran: the predicted figure, its interval when recorded, and the measured figure."""
    ran = [f for f in facts if f.ran and f.predicted is not None]
    if not ran:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH, 4.6))
    with_interval = [f for f in ran if f.interval is not None]
    if with_interval:
        quantiles = with_interval[0].interval.quantiles
        span = f" {quantiles[0]:.0%}-{quantiles[1]:.0%}" if len(quantiles) >= 2 else ""
        xs = [f.number for f in with_interval]
        ax.vlines(xs, [f.interval.low for f in with_interval], [f.interval.high for f in with_interval],
                  color=COLOR["predicted"], linewidth=1.6, alpha=0.7, label=f"predicted interval{span}")
        for end in ("low", "high"):
            ax.scatter(xs, [getattr(f.interval, end) for f in with_interval], marker="_", s=120,
                       color=COLOR["predicted"])
    ax.scatter([f.number for f in ran], [f.predicted for f in ran], color=COLOR["predicted"], marker="o",
               s=30, zorder=3, label="predicted (central)")
    measured = [f for f in ran if f.measured is not None]
    if measured:
        ax.scatter([f.number for f in measured], [f.measured for f in measured], color=COLOR["measured"],
                   marker="D", s=44, zorder=4, label="measured")
    failed = [f for f in ran if f.state == "failed"]
    if failed:
        ax.scatter([f.number for f in failed], [f.predicted for f in failed], facecolors="none",
                   edgecolors="red", marker="o", s=110, zorder=5, label="failed when run")
    _trial_axis(ax)
    _tokens_axis(ax)
    ax.set_title("Predicted vs measured tokens/s/GPU, per trial")
    ax.legend(loc="best", fontsize=9)
    png = _png(fig)
    parts = [f"{len(ran)} trials predicted", f"{len(with_interval)} with a predicted interval",
             f"{len(measured)} measured"]
    return Drawn(", ".join(parts), png)


def pareto_optimal(points: list[tuple[float, float]]) -> list[bool]:
    """Which (cost, tokens/s) points no other point beats on both: lower or equal cost and more tokens/s."""
    flags = []
    for i, (cost, tokens) in enumerate(points):
        beaten = any((c <= cost and t >= tokens) and (c < cost or t > tokens)
                     for j, (c, t) in enumerate(points) if j != i)
        flags.append(not beaten)
    return flags


def pareto(facts, cost: str, xlabel: str, title: str, capacity: float | None = None) -> Drawn | None:
    """Tokens/s/GPU against a cost (peak memory, $ per 1M tokens); each kind's Pareto-optimal points marked."""
    done = [f for f in facts if f.state == "complete" and f.value is not None and getattr(f, cost) is not None]
    if not done:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH / 2, 4.4))
    captions = []
    for kind in ("predicted", "measured"):
        mine = [f for f in done if f.kind == kind]
        if not mine:
            continue
        points = [(getattr(f, cost), f.value) for f in mine]
        optimal = pareto_optimal(points)
        front = sorted(p for p, best in zip(points, optimal) if best)
        ax.scatter(*zip(*points), color=COLOR[kind], marker=MARKER[kind], alpha=0.35, s=24, label=f"{kind}")
        ax.scatter(*zip(*front), color=COLOR[kind], marker=MARKER[kind], edgecolors="black", s=60, zorder=3,
                   label=f"Pareto-optimal ({kind})")
        ax.step(*zip(*front), where="post", color=COLOR[kind], linewidth=1.2)
        numbers = sorted(f.number for f, best in zip(mine, optimal) if best)
        captions.append(f"{kind} Pareto-optimal trials: {', '.join(map(str, numbers))}")
    if capacity:
        ax.axvline(capacity, color="grey", linestyle=":", label=f"GPU memory {capacity:.1f} GiB")
    ax.set_xlabel(xlabel)
    _tokens_axis(ax)
    ax.set_title(title, fontsize=11)
    ax.legend(loc="best", fontsize=8)
    return Drawn("; ".join(captions), _png(fig))


def breakdown(facts) -> Drawn | None:
    """Stacked bars of each layout's predicted step time by term; a measured step time as a black tick."""
    rows = [f for f in facts if f.breakdown]
    if not rows:
        return None
    totals: dict[str, float] = {}
    for f in rows:
        for term, seconds in f.breakdown.items():
            totals[term] = totals.get(term, 0.0) + seconds
    terms = [t for t, s in sorted(totals.items(), key=lambda kv: -kv[1]) if s > 0]
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(WIDTH, 1.2 + 0.85 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for k, term in enumerate(terms):
        widths = [f.breakdown.get(term, 0.0) for f in rows]
        ax.barh(ys, widths, left=left, color=cmap(k % 20), label=_text(term), height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    measured = [(y, f.measured_step_s) for y, f in zip(ys, rows) if f.measured_step_s is not None]
    if measured:
        ax.scatter([s for _, s in measured], [y for y, _ in measured], marker="|", s=500, color="black",
                   zorder=4, label="measured step time")
    ax.set_yticks(ys, [_text(f"#{f.number} {f.short_label}") for f in rows], fontsize=8)
    ax.set_xlabel("predicted step time (s), by term: the cost model's own estimate")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Where the time goes (predicted), best completed layouts first")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=1)
    # The terms are the cost model's point estimate; the tables' figure is the median over its hypotheses
    # (cost_model/hypotheses.py), so a step here need not match it: the caption says so.
    return Drawn(", ".join(f"trial {f.number}: {sum(f.breakdown.values()):.2f} s predicted" for f in rows)
                 + " (the cost model's own terms; the tables' tokens/s is the median over its hypotheses)", _png(fig))


def hypothesis_weights(facts) -> Drawn | None:
    """The proposer's hypothesis weights, normalised to sum 1 in each trial; the heaviest drawn one by one."""
    weighted = [f for f in facts if f.weights]
    if not weighted:
        return None
    shares = []
    for f in weighted:
        total = sum(max(w, 0.0) for w in f.weights.values()) or 1.0
        shares.append({name: max(w, 0.0) / total for name, w in f.weights.items()})
    # by name first: ties keep one order from run to run (a figure is named by its bytes)
    names = sorted(sorted({n for s in shares for n in s}), key=lambda n: -max(s.get(n, 0.0) for s in shares))
    shown, rest = names[:TOP_WEIGHTS], names[TOP_WEIGHTS:]
    xs = [f.number for f in weighted]
    fig, ax = plt.subplots(figsize=(WIDTH, 4.4))
    cmap = plt.get_cmap("tab10")
    for k, name in enumerate(shown):
        ax.plot(xs, [s.get(name, 0.0) for s in shares], marker="o", markersize=4, color=cmap(k % 10), label=_text(name))
    if rest:
        ax.plot(xs, [sum(s.get(n, 0.0) for n in rest) for s in shares], marker="o", markersize=4, color="grey",
                linestyle="--", label=f"others ({len(rest)}), summed")
    _trial_axis(ax)
    ax.set_ylabel("weight (share of the total)")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title("Hypothesis weights over trials")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    png = _png(fig)
    last = shares[-1]
    lead = max(last, key=last.get)
    if max(last.values()) - min(last.values()) < 1e-9:   # no measurement has moved them: no hypothesis leads
        return Drawn(f"{len(weighted)} trials carry weights; at trial {xs[-1]} all {len(last)} weigh the same "
                     f"({last[lead]:.0%} each): nothing measured has told them apart", png)
    return Drawn(f"{len(weighted)} trials carry weights; at trial {xs[-1]} the heaviest is {lead} ({last[lead]:.0%})",
                 png)
