"""Many tuners on one study: N `tune` processes at once on one storage (SQLite file, PostgreSQL server).

Prints, per storage: workers, trials asked, completed trials, distinct layouts among them, duplicates,
lost claims (layouts another tuner claimed first: recorded, not run), workers that crashed (exit != 0
or a traceback), trials whose rationale does not name their own layout, and the wall time. Last line:
one JSON object with those figures.

    python benchmarks/concurrent_workers.py [--workers 4] [--trials 200] [--storage sqlite|postgresql|both]
                                            [--proposer agent|random|tpe]

tests/test_concurrent_workers.py runs the same scenarios small (fewer trials, a smaller space); this is their full
size: the default (4 x 200 agent trials, Qwen3.6-35B-A3B on 8 x H200) and, with `--workers 3 --proposer random
--storage sqlite`, many sampler workers on one file. The paused-claim scenario runs every claim step under both
proposers with `ATTUNE_TEST_ALL_PAUSES=1 pytest tests/test_concurrent_workers.py -k paused` (the suite: each step once).

PostgreSQL: a throwaway server is started (tests/postgres_server.py; Debian's postgresql package).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODEL, GPU, STUDY = "qwen3.6-35b-a3b", "h200", "conc"


def run_workers(url: str, workers: int, trials: int, cwd: Path, model: str = MODEL,
                extra: tuple[str, ...] = ()) -> list[dict]:
    """Start `workers` tune processes at once on study STUDY of `url`; their exit codes and stderr."""
    cmd = [sys.executable, "-m", "tuner", "--model", model, "--gpu", GPU, "--trials", str(trials), "--study", STUDY,
           "--storage", url, "--no-progress", "--top", "0", *extra]
    procs = [subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(workers)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=3600)
        out.append({"rc": p.returncode, "stderr": stderr, "stdout": stdout})
    return out


def judge(url: str, runs: list[dict]) -> dict:
    """What the study holds after the workers: completed, distinct, duplicates, lost claims, bad rationales."""
    import optuna

    from cost_model.nouns.layout_codec import layout_from_stored
    from tuner.trial_claims import is_lost_claim

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY, storage=url)
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state.name == "COMPLETE"]
    keys = Counter(t.user_attrs.get("layout_key") for t in done)
    misattributed = []
    for t in done:
        layout = layout_from_stored(t.user_attrs["layout"])
        if layout.long_label not in t.user_attrs.get("rationale", ""):   # the agent names the whole layout
            misattributed.append(t.number)
    crashed = [i for i, r in enumerate(runs) if r["rc"] != 0 or "Traceback" in r["stderr"]]
    return {"trials": len(trials), "complete": len(done), "distinct": len(keys),
            "duplicates": sum(n - 1 for n in keys.values()), "lost_claims": sum(map(is_lost_claim, trials)),
            "running_left": sum(1 for t in trials if t.state.name == "RUNNING"),
            "crashed_workers": crashed, "misattributed_rationales": misattributed,
            "crash_lines": [runs[i]["stderr"].strip().splitlines()[-1][:300] for i in crashed if runs[i]["stderr"].strip()]}


def measure(kind: str, workers: int, trials: int, proposer: str = "agent") -> dict:
    with tempfile.TemporaryDirectory(prefix="attune-conc-") as tmp:
        server = None
        if kind == "sqlite":
            url = f"sqlite:///{tmp}/study.db"
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            import postgres_server

            reason = postgres_server.why_not()
            if reason:
                return {"storage": kind, "skipped": reason}
            server = postgres_server.Server()
            url = server.start()
        try:
            start = time.perf_counter()
            runs = run_workers(url, workers, trials, Path(tmp), extra=("--proposer", proposer))
            figures = judge(url, runs)
        finally:
            if server is not None:
                server.stop()
    return {"storage": kind, "workers": workers, "trials_each": trials,
            "wall_s": round(time.perf_counter() - start, 1), **figures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--storage", choices=("sqlite", "postgresql", "both"), default="both")
    p.add_argument("--proposer", choices=("agent", "random", "tpe"), default="agent")
    args = p.parse_args(argv)
    kinds = ("sqlite", "postgresql") if args.storage == "both" else (args.storage,)
    results = []
    for kind in kinds:
        r = measure(kind, args.workers, args.trials, args.proposer)
        results.append(r)
        print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    print(json.dumps({r["storage"]: r for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
