"""`tune report`: one study as a self-contained HTML page (DIR/index.html and its PNG figures in DIR).

No JavaScript and no network: the page references its figures by relative path, so the folder can be
copied or attached as it is. Every figure on it says whether it is predicted (the cost model) or measured
(a real run). The trial figures come from tuner.report (trial records, ranked rows, the counts line).

A report is replaced whole (write_report): each figure is named by its content (best-<hash>.png) and written
before the page that points at it is renamed into place, and an earlier report's figures are removed only
after that, so a kill at any point leaves a page whose figures are all its own. Every text from the study
is escaped for HTML and shown without control characters (`_h`).
"""
from __future__ import annotations

import fcntl
import hashlib
import html
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cost_model.nouns.layout_codec import layout_from_stored
from cost_model.nouns.names import printable
from recipes.files import write_atomic
from tuner.options import CliError, writing_user_file
from tuner.interval import Interval
from tuner.report import as_dict, counts_line, ranked_rows, trial_row
from tuner.trial_record import TrialRecord, read_trials

TOP_BREAKDOWN = 5
FIGURES = {"best": "best", "interval": "interval", "pareto_memory": "pareto-memory", "pareto_cost": "pareto-cost",
           "breakdown": "breakdown", "weights": "weights"}   # file stems: a figure is STEM-<hash>.png
PAGE = "index.html"
# The report's own files in its folder: its page, its figures (and those of reports before content names,
# STEM.png), and write_atomic's temporary files of either that a kill left behind.
_OWN = re.compile(r"(?:index\.html|(?:%s)(?:-[0-9a-f]{12})?\.png)" % "|".join(map(re.escape, FIGURES.values())))
_LEFT_BEHIND = re.compile(r"\.(%s)\..+\.tmp" % _OWN.pattern)
SECTIONS = ("1. Best tokens/s/GPU over trials", "2. Predicted interval vs measured, per trial",
            "3. Pareto fronts", "4. Where the time goes: the top layouts",
            "5. Hypothesis weights over trials", "6. The agent's reasons")
STYLE = """body{font-family:sans-serif;max-width:1180px;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ccc}
img{max-width:100%;display:block;margin:.5em 0}.pair{display:flex;gap:12px}.pair>div{flex:1 1 0;min-width:0}
.pair img{width:100%}
p.caption,p.note{color:#444;font-size:.92em}table{border-collapse:collapse;font-size:.85em;width:100%}
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}td.num{text-align:right;
white-space:nowrap}th{background:#f0f0f0}
col.layout{width:24%}col.rationale{width:50%}.predicted{color:#1f5f9f}.measured{color:#b35900;font-weight:bold}
.reason{color:#a00}"""


@dataclass(frozen=True)
class TrialFacts:
    """What the report shows of one trial; `kind` says whether its figures are predicted or measured."""
    number: int
    state: str
    kind: str | None                       # of value / peak / $: the result's when it ran, else the prediction's
    label: str
    short_label: str
    value: float | None                    # tokens/s/GPU
    peak_memory_gib: float | None
    usd_per_million_tokens: float | None
    predicted: float | None                # the prediction's tokens/s/GPU (central)
    interval: Interval | None              # of the predicted tokens/s/GPU, when both its ends were recorded
    measured: float | None                 # a measured run's tokens/s/GPU
    measured_step_s: float | None
    ran: bool                              # the trial has a result (ok or failed)
    breakdown: dict = field(default_factory=dict)   # predicted seconds per term of the step
    weights: dict | None = None            # the proposer's hypothesis weights when it proposed this trial
    rationale: str = ""
    learnt: str = ""
    reason: str = ""
    proposer: str = ""


def trial_facts(r: TrialRecord) -> TrialFacts:
    """A trial as the report draws it; a stored value of the wrong type (a peer's, another program's) is left
    out, as if not recorded, so the figures never meet it."""
    row = trial_row(r)
    prediction, result, interval = r.prediction, r.result, r.interval
    measured = result.kind == "measured" and (result.status or "ok") == "ok"
    return TrialFacts(
        number=r.number, state=row["state"], kind=row["kind"], label=row["label"] or "",
        short_label=_short_label(r.layout), value=row["tokens_per_s_per_gpu"],
        peak_memory_gib=row["peak_memory_gib"], usd_per_million_tokens=row["usd_per_million_tokens"],
        predicted=r.predicted,   # the headline figure the table, `tune show` and the recipes print
        interval=interval if interval is not None and interval.complete else None,
        measured=result.tokens_per_s_per_gpu if measured else None,
        measured_step_s=result.step_time_s if measured else None, ran=result.recorded,
        breakdown=dict(prediction.breakdown or {}), weights=r.hypothesis_weights or None,
        rationale=row["rationale"] or "", learnt=str(r.learnt or ""), reason=row["reason"] or "",
        proposer=str(r.proposer or ""))


def _short_label(stored) -> str:
    if not stored:   # absent, or left out as malformed by trial_record
        return ""
    layout = layout_from_stored(stored)
    return f"{layout.label}\nmt {layout.max_tokens_per_gpu} | rc {layout.recompute_label} | {layout.dispatcher}"


# ---------------------------------------------------------------- the command

def cmd_report(args) -> int:
    from tuner.study_commands import open_existing

    study = open_existing(args)
    out = Path(args.out)
    with writing_user_file(out):
        out.mkdir(parents=True, exist_ok=True)
        page = write_report(study, out)
    print(json.dumps({"study": args.study, "page": str(page)}) if args.json else page)
    return 0


def write_report(study, out: Path) -> Path:
    """Write OUT/index.html and its figures, replacing an earlier report in OUT whole; the page's path."""
    try:
        from tuner import report_figures as figs
    except ImportError as e:
        raise CliError(f"tune report needs matplotlib ({e}); pip install 'matplotlib>=3.8'") from None
    records = read_trials(study)
    facts = [trial_facts(r) for r in records]
    by_number = {f.number: f for f in facts}
    top = [by_number[r.number] for r in ranked_rows(study)[:TOP_BREAKDOWN]]
    capacity = next((r.prediction.gpu_memory_gib for r in records if r.prediction.recorded), None)
    drawn = {
        "best": figs.best_over_trials(facts),
        "interval": figs.interval_vs_measured(facts),
        "pareto_memory": figs.pareto(facts, "peak_memory_gib", "peak memory (GiB)", "tokens/s/GPU vs peak memory",
                                     capacity),
        "pareto_cost": figs.pareto(facts, "usd_per_million_tokens", "$ per 1M tokens",
                                   "tokens/s/GPU vs $ per 1M tokens"),
        "breakdown": figs.breakdown(top),
        "weights": figs.hypothesis_weights(facts),
    }
    # a figure's name is its content's: a new figure never overwrites one the current page shows
    figures = {key: (d.caption, f"{FIGURES[key]}-{hashlib.sha256(d.png).hexdigest()[:12]}.png", d.png)
               for key, d in drawn.items() if d is not None}
    with _only_report_in(out):
        for name in os.listdir(out):   # a planted link would take the write (or a removal) elsewhere
            if _OWN.fullmatch(name) and (out / name).is_symlink():
                raise CliError(f"{out / name} is a symbolic link: the report is not written "
                               f"(remove it or use another --out)")
        new = [name for _, name, _ in figures.values() if not (out / name).exists()]
        try:
            for _, name, png in figures.values():
                write_atomic(out / name, png)
            page = write_atomic(out / PAGE, render_page(study, facts,
                                                        {k: (c, n) for k, (c, n, _) in figures.items()}))
        except BaseException:   # interrupted: no figure is left that no page shows
            for name in new:
                (out / name).unlink(missing_ok=True)
            raise
        # only now that the new page is in place: the earlier reports' figures, and what a killed one left
        keep = {PAGE, *(name for _, name, _ in figures.values())}
        for name in os.listdir(out):
            if (_OWN.fullmatch(name) and name not in keep) or _LEFT_BEHIND.fullmatch(name):
                (out / name).unlink(missing_ok=True)
    return page


@contextmanager
def _only_report_in(out: Path):
    """One report at a time into `out` (an exclusive lock on the folder itself): another report's clean-up
    would remove the figures of a page this one has just written."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing the folder's descriptor releases the lock


# ---------------------------------------------------------------- the page

def _h(value) -> str:
    """Text from a study for the page: escaped as HTML (no markup of a peer's), its control characters shown
    as \\x1b (a terminal that prints the file runs none of them)."""
    return html.escape(printable(str(value)))


def render_page(study, facts: list[TrialFacts], figures: dict) -> str:
    """The page; `figures` maps each drawn figure's key to (caption, file name)."""
    e = _h
    proposers = sorted({f.proposer for f in facts if f.proposer})
    proposer_text = f"proposer {', '.join(proposers)}" if proposers else "proposer not recorded"
    no_trial = "no completed trial yet"
    body = [
        f"<h1>attune report: study {e(study.study_name)}</h1>", _summary(study, facts),
        _section(0, [_figure("best", figures, no_trial)],
                 "Solid: the best so far of the kind that decides (measured when any trial was measured). "
                 "Predicted-only studies show the best predicted."),
        _section(1, [_figure("interval", figures, "no trial has run yet")],
                 "Each trial that ran: its predicted tokens/s/GPU (central), the predicted interval as a bar when "
                 "the prediction records one, and the measured figure as a separate marker."
                 + ("" if any(f.interval for f in facts) else " No trial records a predicted interval: points alone.")
                 + ("" if any(f.measured is not None for f in facts) else " No trial was measured.")),
        _section(2, ['<div class="pair">' + _figure("pareto_memory", figures, no_trial)
                     + _figure("pareto_cost", figures, no_trial) + "</div>"],
                 "Completed trials; the Pareto-optimal ones (no other layout of the same kind is both faster and "
                 "cheaper in memory or dollars) are outlined and joined."),
        _section(3, [_figure("breakdown", figures, no_trial)],
                 f"The {TOP_BREAKDOWN} best completed trials: the cost model's predicted seconds per term of one "
                 "step (they sum to the predicted step time); a black tick is a measured step time."),
        _section(4, [_figure("weights", figures, f"no hypothesis weights recorded ({proposer_text})")]),
        _section(5, [_reasons_table(facts)]),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>attune report: {e(study.study_name)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _summary(study, facts: list[TrialFacts]) -> str:
    e = _h
    config = as_dict(study.user_attrs.get("config"))
    lines = []
    if config:
        w = as_dict(config.get("workload"))
        lines.append(f"{e(str(config.get('model')))} on {e(str(config.get('gpus')))} x {e(str(config.get('gpu')))}; "
                     f"sequence {e(str(w.get('seq_len')))}, global batch {e(str(w.get('global_batch')))}, "
                     f"{e(str(w.get('precision')))}, framework {e(str(w.get('framework')))}"
                     + "".join(f", {key.replace('_', ' ')} {e(str(w[key]))}"
                               for key in ("cuda_graphs", "peft", "images_per_row", "image_size") if key in w))
    lines.append(e(counts_line(study)))
    rows = ranked_rows(study)
    if rows:
        best = rows[0]
        lines.append(f"best: trial {best.number}, {_kind_value(best.tokens_per_s_per_gpu, best.kind)} "
                     f"({e(best.layout.long_label)})")
    measured = [r for r in rows if r.kind == "measured"]
    if measured and measured[0] is not rows[0]:
        lines.append(f"best measured: trial {measured[0].number}, "
                     f"{_kind_value(measured[0].tokens_per_s_per_gpu, 'measured')}")
    sources = sorted({r.source for r in rows if r.source})
    lines += [f"figures from: {e(s)}" for s in sources]
    return "<p>" + "<br>\n".join(lines) + "</p>"


def _section(index: int, parts: list[str], caption: str = "") -> str:
    note = f'<p class="note">{html.escape(caption)}</p>' if caption else ""
    return f"<h2>{html.escape(SECTIONS[index], quote=False)}</h2>\n" + "\n".join(parts) + "\n" + note


def _figure(key: str, figures: dict, missing: str) -> str:
    if key not in figures:
        return f'<p class="note">{_h(missing)}</p>'
    caption, name = figures[key]
    return f'<div><img src="{_h(name)}" alt="{_h(key)}"><p class="caption">{_h(caption)}</p></div>'


def _kind_value(value: float | None, kind: str | None) -> str:
    """A figure and whether it is predicted or measured; anything else a study holds there (a peer's
    PostgreSQL study can hold any text) is shown escaped, never as markup."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    label = _h(kind)
    css = kind if kind in ("predicted", "measured") else "other"
    return f'<span class="{css}">{value:,.0f} tokens/s/GPU ({label})</span>'


def _reasons_table(facts: list[TrialFacts]) -> str:
    e = _h
    head = ("trial", "state", "layout", "figures", "tokens/s/GPU", "rationale")
    rows = []
    for f in facts:
        why = e(f.rationale)
        if f.learnt:
            why += f"<br><b>learnt:</b> {e(f.learnt)}"
        if f.reason:
            why += f'<br><span class="reason">{e(f.state)}: {e(f.reason)}</span>'
        rows.append(f"<tr><td class=\"num\">{f.number}</td><td>{e(f.state)}</td><td>{e(f.label)}</td>"
                    f"<td class=\"{e(f.kind or '')}\">{e(f.kind or '-')}</td>"
                    f"<td class=\"num\">{_kind_value(f.value, f.kind)}</td><td>{why}</td></tr>")
    cols = '<colgroup><col><col><col class="layout"><col><col><col class="rationale"></colgroup>'
    return ("<table>" + cols + "<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>\n" + "\n".join(rows) + "</table>")
