"""How long `tune` takes to answer, on this machine, from the default job up to large clusters.

    python benchmarks/scale.py [--cap-s 180] [--skip-large]

Runs `tune` as a user would (a subprocess, the embedded cost model, a fresh SQLite study in a temporary folder)
and prints, beside the figure issue 27 recorded before the work on it ("then", 2-core machine) and its target:

- the default main job end to end (`tune --model qwen3.6-35b-a3b --gpu h200`) and when its first line appeared;
- a resume: the same command again on the same study;
- DeepSeek-V3 on 256 x B200 and Qwen3-235B-A22B on 1,024 x H100 up to the first proposal (`--trials 1`), with the
  process's peak resident memory; a case that runs past --cap-s is stopped and printed as "> cap"; DeepSeek-V3 again
  with `--ray-address local` (its space is pruned, and a pruned space is scored in tune's process, not as Ray tasks:
  tuner.space_pruning);
- layouts scored per second on the default space (tuner.study_commands.score_space): the median of three cold runs,
  this process's and two fresh ones.

Every figure is measured here, now; the machine's load changes them (say what else ran when quoting them).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

DEFAULT = ["--model", "qwen3.6-35b-a3b", "--gpu", "h200"]
LARGE = {"DeepSeek-V3 on 256 x B200": ["--model", "deepseek-v3", "--gpu", "b200", "--gpus", "256", "--trials", "1"],
         "Qwen3-235B-A22B on 1,024 x H100": ["--model", "qwen3-235b-a22b", "--gpu", "h100", "--gpus", "1024",
                                             "--trials", "1"],
         # with --ray-address local: a pruned space (this one) is scored in tune's process, the local result; a space
         # that is not pruned would go out as Ray tasks (peak RSS is tune's own process, not the Ray workers')
         "DeepSeek-V3 on 256 x B200, Ray local": ["--model", "deepseek-v3", "--gpu", "b200", "--gpus", "256",
                                                  "--trials", "1", "--ray-address", "local"]}
# issue 27's figures before the work on it, and its targets
THEN = {"main job": "85-103 s", "first line": "-", "resume": "69 s", "DeepSeek-V3 on 256 x B200": "> 24 min, > 9 GB",
        "Qwen3-235B-A22B on 1,024 x H100": "not measured", "layouts/s": "1,300-1,800",
        "DeepSeek-V3 on 256 x B200, Ray local": "-"}
TARGET = {"main job": "<= 10 s", "first line": "<= 1 s", "resume": "<= 5 s",
          "DeepSeek-V3 on 256 x B200": "<= 60 s, <= 2 GB", "Qwen3-235B-A22B on 1,024 x H100": "<= 60 s",
          "layouts/s": ">= 50,000", "DeepSeek-V3 on 256 x B200, Ray local": "(no target)"}


def peak_rss_gib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2 ** 20
    except OSError:
        return None
    return None


def run_tune(args: list[str], workdir: Path, cap_s: float, until: str | None = None) -> dict:
    """Run tune; the seconds to its first stderr/stdout line, to a line containing `until` (if given), to exit;
    its peak RSS. Stopped at `cap_s`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", *args, "--storage", str(workdir / "studies.db")],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    out = {"first_line_s": None, "until_s": None, "exit_s": None, "rc": None, "peak_rss_gib": None, "capped": False}
    rss = [0.0]

    def watch():
        while proc.poll() is None:
            r = peak_rss_gib(proc.pid)
            if r:
                rss[0] = max(rss[0], r)
            time.sleep(0.2)
    threading.Thread(target=watch, daemon=True).start()
    # at the cap its whole process group goes (a local Ray cluster it started too)
    timer = threading.Timer(cap_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    tail = []
    for line in proc.stdout:
        now = time.monotonic() - started
        if out["first_line_s"] is None:
            out["first_line_s"] = now
        if until and out["until_s"] is None and until in line:
            out["until_s"] = now
        tail = (tail + [line.rstrip()])[-3:]
    proc.wait()
    timer.cancel()
    out["exit_s"] = time.monotonic() - started
    out["rc"] = proc.returncode
    out["capped"] = out["exit_s"] >= cap_s - 0.5 and proc.returncode < 0
    out["peak_rss_gib"] = rss[0] or None
    out["tail"] = tail
    return out


def layouts_per_s(whole: bool = True) -> tuple[int, float, float | None]:
    """(the default space's layouts, layouts answered per second as `tune` scores it (pruned: what cannot matter is
    left unscored, tuner.space_pruning), layouts scored per second scoring every one of them right after (`whole`,
    else None))."""
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload
    from search_space.enumerate import enumerate_layouts
    from tuner import space_scoring
    from tuner.study import StudyConfig
    from tuner.study_commands import score_space
    from experiments.predicted_runner import PredictedRunner

    config = StudyConfig(load_model("qwen3.6-35b-a3b"), load_gpu("h200"), 8, Workload())
    total = sum(1 for _ in enumerate_layouts(config.model, 8, config.workload, config.stack, config.options))
    rates = []
    for prune_above in (space_scoring.PRUNE_ABOVE, 10 ** 12)[:2 if whole else 1]:
        before, space_scoring.PRUNE_ABOVE = space_scoring.PRUNE_ABOVE, prune_above
        try:
            started = time.monotonic()
            score_space(config, PredictedRunner())
            rates.append(total / (time.monotonic() - started))
        finally:
            space_scoring.PRUNE_ABOVE = before
    return total, rates[0], rates[1] if whole else None


def fmt_s(x, capped=False, cap=None) -> str:
    if capped:
        return f"> {cap:.0f} s (stopped)"
    return "-" if x is None else f"{x:.1f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-s", type=float, default=180.0, help="stop a large case after this many seconds")
    ap.add_argument("--skip-large", action="store_true", help="only the default job, its resume and layouts/s")
    ap.add_argument("--rate-only", action="store_true", help=argparse.SUPPRESS)   # one cold layouts/s, as JSON
    args = ap.parse_args(argv)
    if args.rate_only:
        total, rate, _ = layouts_per_s(whole=False)
        print(json.dumps({"layouts": total, "answered": rate}))
        return 0
    rows, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        main_job = run_tune(DEFAULT, work, args.cap_s)
        rows.append(("main job", fmt_s(main_job["exit_s"], main_job["capped"], args.cap_s)))
        rows.append(("first line", fmt_s(main_job["first_line_s"])))
        resume = run_tune(DEFAULT, work, args.cap_s)
        rows.append(("resume", fmt_s(resume["exit_s"], resume["capped"], args.cap_s)))
        figures.update(main_job_s=main_job["exit_s"], first_line_s=main_job["first_line_s"], resume_s=resume["exit_s"],
                       main_job_rc=main_job["rc"], resume_rc=resume["rc"])
        if not args.skip_large:
            for k, (name, cmd) in enumerate(LARGE.items()):
                sub = work / f"large-{k}"
                sub.mkdir()
                r = run_tune(cmd, sub, args.cap_s, until="trial 0:")
                rss = f", peak RSS {r['peak_rss_gib']:.1f} GB" if r["peak_rss_gib"] else ""
                if r["until_s"] is not None or r["capped"]:
                    shown = f"first proposal {fmt_s(r['until_s'], r['until_s'] is None, args.cap_s)}{rss}"
                else:   # it ended without proposing: say how (a refusal is a figure too)
                    shown = f"no proposal: exit {r['rc']} after {r['exit_s']:.1f} s{rss}"
                    print(f"{name}: {r['tail'][-1] if r['tail'] else ''}", file=sys.stderr)
                rows.append((name, shown))
                figures[name] = {"first_proposal_s": r["until_s"], "stopped_at_cap": r["capped"], "rc": r["rc"],
                                 "exit_s": r["exit_s"], "peak_rss_gib": r["peak_rss_gib"],
                                 "last_line": r["tail"][-1] if r["tail"] else ""}
    total, rate, whole = layouts_per_s()
    # the same, cold, in fresh processes: this machine's speed drifts by a fifth from one minute to the next
    again = [json.loads(subprocess.run([sys.executable, __file__, "--rate-only"], capture_output=True, text=True,
                                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout)
             for _ in range(2)]
    rates = sorted([rate] + [a["answered"] for a in again])
    rows.append(("layouts/s", f"{rates[1]:,.0f} answered, median of 3 cold runs ({rates[0]:,.0f}-{rates[2]:,.0f}; "
                              f"{total:,} layouts of the default space, pruned as tune does; {whole:,.0f}/s scoring "
                              f"every one right after, the cost model's memos warm)"))
    figures.update(layouts_per_s=rates[1], layouts_per_s_runs=rates, layouts_per_s_whole=whole,
                   default_space_layouts=total, cap_s=args.cap_s)
    print(f"measured on this machine ({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d %H:%M')}:")
    print(f"{'':34} {'now':46} {'then (issue 27)':22} target")
    for name, now in rows:
        print(f"{name:34} {now:46} {THEN.get(name, ''):22} {TARGET.get(name, '')}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
