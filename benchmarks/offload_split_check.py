"""The offloaded optimizer's GPU share, predicted against every stored offload run's optimizer build.

    python benchmarks/offload_split_check.py

With optimizer offload, megatron's HybridDeviceOptimizer keeps an fp32 copy of each tensor it leaves on the GPU
(cost_model.memory.OffloadSplit). The megatron runner records the memory allocated after the model build and after
the optimizer build, so their difference is that copy, measured: 4 bytes per parameter the stepping optimizer keeps,
plus the first build's when it was not collected yet. Runs from v12 on collect the first build before sampling;
earlier ones left it to Python's cyclic collector, which sometimes ran first (both readings are printed, the closer
one is judged). Measured figures only; prints a table and a last line of JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.runner_accuracy import DEFAULT  # noqa: E402
from cost_model.memory import _rank_layer_indices, offload_split  # noqa: E402
from cost_model.nouns.model_spec import load_model  # noqa: E402
from cost_model.stages import layout_rank_layers  # noqa: E402
from experiments.megatron.model_run import trial_model  # noqa: E402
from experiments.megatron.suite import parse_suite  # noqa: E402

GIB = 2 ** 30


def builds(grids=DEFAULT) -> list[dict]:
    """One row per stored offload run that recorded its optimizer build (first line of each trial)."""
    out, seen = [], set()
    for suite, results in grids:
        trials = {t.name: t for t in parse_suite(str(suite))[0]}
        for text in results.read_text().splitlines():
            line = json.loads(text)
            t = trials.get(line.get("trial"))
            details = line.get("details") or {}
            mem = (details.get("memory_gib_per_rank") or {}).get("0") or {}
            if t is None or not t.layout.offloaded or "after_optimizer" not in mem or (results.name, t.name) in seen:
                continue
            seen.add((results.name, t.name))
            model = trial_model(load_model(t.model), t.layers if isinstance(t.layers, int) else None, t.replace_gdn)
            ranks = layout_rank_layers(model, t.layout)
            split = offload_split(model, _rank_layer_indices(model, t.layout, len(ranks))[0], ranks[0], t.layout, True)
            stepped, first = 4 * split.stepped_on_gpu / GIB, 4 * split.first_copy_on_gpu / GIB
            collected = "first offload build collected" in str(details.get("optimizer", ""))
            readings = {"stepping build": stepped} if collected else {"both builds": stepped + first,
                                                                       "stepping build": stepped}
            measured = mem["after_optimizer"] - mem["after_build"]
            which = min(readings, key=lambda k: abs(readings[k] - measured))
            out.append({"results": results.name, "trial": t.name, "measured_gib": round(measured, 2),
                        "predicted_gib": round(readings[which], 2), "reading": which,
                        "error_gib": round(readings[which] - measured, 2)})
    return out


def main() -> int:
    rows = builds()
    print("optimizer build on the GPU (after_optimizer - after_build), measured vs predicted from the offload split")
    for r in rows:
        print(f"  {r['results'][:44]:44s} {r['trial']:28s} measured {r['measured_gib']:6.2f}  predicted "
              f"{r['predicted_gib']:6.2f} GiB ({r['reading']})  {r['error_gib']:+.2f}")
    worst = max((abs(r["error_gib"]) for r in rows), default=0.0)
    print(f"{len(rows)} offload runs: worst error {worst:.2f} GiB")
    print(json.dumps({"runs": len(rows), "max_abs_error_gib": worst}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
