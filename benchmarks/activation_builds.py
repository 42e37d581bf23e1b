"""Each layer kind's saved activation bytes per token, measured on the runner's layer builds, against the memory
model's count.

The layer builds of `tune profile` (experiments.checks.runner_components: 1, 2 or 4 layers of one kind, a 1,024-token
vocabulary, one GPU, 4 or 2 micro-batches a step) record the allocated peak at each token count. Between two builds
of the same layer at the same tokens, the peak differs by the extra layers' parameters, gradients and optimizer state
plus what they save for the backward; its slope over tokens, where both peaks are set by activations (the largest
token counts), is one layer's saved bytes per token. No grid run enters. This prints, per build pair, that slope,
the model's count before its fitted per-MLP-kind factor (cost_model.activations: layer_bytes + unfused_extra_bytes,
what the unfused runner keeps) and as the model uses it (the factor on all but the Gated DeltaNet block, which is
counted from its source: runner_gdn_bytes), and their ratios.

Usage: python benchmarks/activation_builds.py [BUILDS.jsonl ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.built_models import load_built_model  # noqa: E402
from cost_model.activations import (layer_bytes, runner_dense_layer_bytes, runner_gdn_bytes,  # noqa: E402
                                    shared_expert_counts, unfused_extra_bytes, unfused_scaled)
from cost_model.constants import default_constants  # noqa: E402
from cost_model.nouns.layout import Layout  # noqa: E402
from cost_model.nouns.model_spec import MOE  # noqa: E402
from cost_model.runner_components import signature_model  # noqa: E402

R = Path(__file__).resolve().parents[1] / "benchmarks/results"
DEFAULT = [R / "runner-components-h200-2026-12-02/run3-one-build-per-process.jsonl",
           R / "runner-components-h200-2026-12-02b/builds.jsonl",
           R / "runner-components-h200-2026-12-02c/builds.jsonl",
           R / "runner-components-h200-2026-12-04/builds.jsonl",
           R / "runner-components-h200-2026-12-04b/builds.jsonl",
           R / "runner-components-h200-2026-12-04c/builds.jsonl",
           R / "runner-builds-h200-gdn-dense-2026-12-06.jsonl"]
# The host-floor builds name no catalog model: their layer is the named model's at the signature's sizes.
BASE = {"host-floor-llama": "llama3-8b", "host-floor-qwen3": "qwen3-8b",
        "qwen3-30b-a3b-host-floor": "qwen3-30b-a3b", "qwen3.6-35b-a3b-host-floor": "qwen3.6-35b-a3b",
        "qwen3.5-27b-host-floor": "qwen3.5-27b"}


def peaks(build: dict) -> dict[int, float]:
    """tokens -> allocated peak (GiB) of the build's points without recompute."""
    return {int(p["tokens"]): float(p["peak_allocated_gib"]) for p in build["points"]
            if not p["full_recompute"] and p.get("peak_allocated_gib")}


def on_the_line(p: dict[int, float], t0: int, lo: int, hi: int) -> bool:
    """Whether `lo` is past the build's kink: the peak rises from t0 to lo at least 85% as steeply per token as from
    lo to hi (below the kink the optimizer step's transient, the same at every token count, sets the peak)."""
    return (p[lo] - p[t0]) / (lo - t0) >= 0.85 * (p[hi] - p[lo]) / (hi - lo)


def measured_per_token(small: dict, large: dict) -> tuple[float, tuple[int, int]] | None:
    """One layer's saved bytes per token from two builds of it (`large` more layers): the slope, over the two
    largest token counts both measured, of the peaks' difference per extra layer; None where fewer than three
    points are shared or the lower of the two is not past both builds' kinks."""
    a, b = peaks(small), peaks(large)
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    t0, lo, hi = common[-3:]
    if not (on_the_line(a, t0, lo, hi) and on_the_line(b, t0, lo, hi)):
        return None
    extra = int(large["layers"]) - int(small["layers"])
    per_layer = ((b[hi] - a[hi]) - (b[lo] - a[lo])) / extra
    return per_layer * 2**30 / (hi - lo), (lo, hi)


def counted_per_token(build: dict) -> tuple[float, float]:
    """(the memory model's count of one layer's saved bytes per token on the unfused runner stack before the
    fitted per-MLP-kind factor, the count as the model uses it: a dense-MLP layer's tensor-by-tensor count
    (runner_dense_layer_bytes), a MoE layer's count with its factor on all but the Gated DeltaNet block and the
    shared expert, counted tensor by tensor)."""
    name = BASE.get(build["model"], build["model"])
    base = load_built_model(name)
    model = signature_model(base, build["signature"])
    attn, mlp = build["kind"]
    layout = Layout(world_size=1)
    rows = float(model.num_experts_per_tok) if mlp == MOE else 0.0
    raw = (layer_bytes(attn, mlp, model, layout, set(), 1.0, rows, True)
           + unfused_extra_bytes(attn, mlp, model, layout, set(), 1.0, rows, True))
    if mlp != MOE:   # a dense-MLP layer is counted tensor by tensor, no factor
        return raw, runner_dense_layer_bytes(attn, model, layout, set(), 1.0)
    factor = default_constants().unfused_moe_activation_factor
    return raw, unfused_scaled(raw, runner_gdn_bytes(attn, model, layout, 1.0), factor,
                               shared_expert_counts(mlp, model, layout, set(), 1.0))


def pairs(paths: list[Path]) -> list[tuple[dict, dict]]:
    """Build pairs of one layer (same signature and vocabulary), fewest layers against each larger count."""
    by_sig: dict[tuple, list[dict]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            b = json.loads(line)
            if "points" in b and int(b.get("vocab", 0)) < 4096:
                by_sig.setdefault((b["signature"], b["model"]), []).append(b)
    out = []
    for builds in by_sig.values():
        builds.sort(key=lambda b: int(b["layers"]))
        for large in builds[1:]:
            if int(large["layers"]) > int(builds[0]["layers"]):
                out.append((builds[0], large))
    return out


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or DEFAULT
    print(__doc__.split("\n\n")[0])
    print(f"{'layer (model)':38} {'kind':24} {'L':>5} {'tokens':>11} {'measured':>9} {'counted':>9} "
          f"{'as used':>9} {'meas/count':>10} {'meas/used':>10}   (bytes per token per layer)")
    rows = []
    for small, large in pairs(paths):
        got = measured_per_token(small, large)
        if got is None:
            print(f"{small['model'][:38]:38} {'+'.join(small['kind'])[:24]:24} {small['layers']}-{large['layers']:<3} "
                  "left out: fewer than three shared points past both builds' optimizer-step peak")
            continue
        measured, (lo, hi) = got
        raw, used = counted_per_token(small)
        kind = "+".join(small["kind"]) + (" host floor" if small.get("host_floor") or "host-floor" in small["model"] else "")
        rows.append({"model": small["model"], "kind": kind, "layers": [small["layers"], large["layers"]],
                     "tokens": [lo, hi], "measured": measured, "counted": raw, "as_used": used})
        print(f"{small['model'][:38]:38} {kind[:24]:24} {small['layers']}-{large['layers']:<3} {lo:>5}-{hi:<5} "
              f"{measured / 1e3:8.1f}K {raw / 1e3:8.1f}K {used / 1e3:8.1f}K {measured / raw:10.3f} "
              f"{measured / used:10.3f}")
    print(json.dumps({"pairs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
