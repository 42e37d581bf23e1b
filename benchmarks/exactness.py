"""Predictions of a sample of layouts of every catalog model, saved and compared bit for bit.

    python benchmarks/exactness.py save FILE      # with the code as it is: the reference
    python benchmarks/exactness.py compare FILE   # after a change: every figure must be the same, to the bit

Speeding up the scoring of a space (memos, shared terms) must not move any prediction: this scores a seeded
sample of layouts (every model of the catalog, a few GPU counts, shapes of every kind: offload, recompute, PP > 1,
VPP, CP, EP) under several workloads and stacks, in one process so the memos are shared between layouts as a
scored space shares them: `predict`, `memory_verdict`, the agent's tokens/s under every hypothesis, and the whole
`score_space` of a few small spaces. Figures are compared by repr (a float's repr is exact).
"""
from __future__ import annotations

import hashlib
import pickle
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model.nouns.hardware import load_gpu  # noqa: E402
from cost_model.hypotheses import default_hypotheses, tokens_per_s_under  # noqa: E402
from cost_model.nouns.model_spec import catalog_names, load_model  # noqa: E402
from cost_model.predict import memory_verdict, predict, predict_from_verdict, step_time_only  # noqa: E402
from cost_model.nouns.stack import Stack  # noqa: E402
from cost_model.nouns.workload import Workload  # noqa: E402
from search_space.enumerate import SpaceOptions, shape_layouts, space_plan  # noqa: E402

# (GPU type, GPU count): a node, a few nodes, a large cluster
SCALES = (("h200", 8), ("b200", 64), ("h100", 512))
WORKLOADS = {
    "default": (Workload(), True),
    "megatron-runner": (Workload(framework="megatron"), False),   # no precision-aware optimizer: the runner's stack
    "megatron-lora-graphs": (Workload(framework="megatron", peft="lora", cuda_graphs="full"), True),
    "fp8-balanced-4k": (Workload(seq_len=4096, global_batch=256, precision="fp8", routing="balanced"), True),
}
SHAPES_PER_SPACE = 24
LAYOUTS_PER_SHAPE = 6


def prediction_figures(p) -> tuple:
    return (p.tokens_per_s_per_gpu, p.step_time_s, tuple(p.breakdown.items()), tuple(p.memory.as_dict().items()),
            p.gpu_memory_gib, p.host_memory_gib_per_node, p.fit_probability, p.fit_verdict, p.reasons, p.mfu,
            p.usd_per_million_tokens, p.num_microbatches, p.tokens_per_microbatch, p.source)


def verdict_figures(v) -> tuple:
    return tuple(v.memory.as_dict().items()), v.capacity, v.host, v.fit_probability, v.fit_verdict


def sample(model, n: int, workload: Workload, rng: random.Random) -> list:
    shapes, options, _ = space_plan(model, n, workload, Stack(), SpaceOptions())
    picked = rng.sample(shapes, min(SHAPES_PER_SPACE, len(shapes)))
    out = []
    for shape in picked:
        layouts = list(shape_layouts(shape, model, n, workload, Stack(), options))
        out += rng.sample(layouts, min(LAYOUTS_PER_SHAPE, len(layouts)))
    rng.shuffle(out)   # memos shared across shapes in no particular order
    return out


def figures() -> dict:
    out, hypotheses = {}, default_hypotheses()
    vision = Workload(images_per_row=1)
    for name in catalog_names():
        model = load_model(name)
        workloads = dict(WORKLOADS, **({"vision": (vision, True)} if model.vision is not None else {}))
        for gpu_name, n in SCALES:
            gpu = load_gpu(gpu_name)
            for wname, (workload, pao) in workloads.items():
                rng = random.Random(f"{name}/{gpu_name}/{n}/{wname}")
                try:
                    layouts = sample(model, n, workload, rng)
                except Exception as e:  # noqa: BLE001 - a space that cannot be built is a figure too
                    out[(name, gpu_name, n, wname)] = repr(e)
                    continue
                for layout in layouts:
                    key = (name, gpu_name, n, wname, layout.key())
                    try:
                        v = memory_verdict(model, gpu, workload, layout, precision_aware_optimizer=pao)
                        p = (predict_from_verdict(v, gpu, workload, precision_aware_optimizer=pao)
                             if rng.random() < 0.5 else predict(model, gpu, workload, layout, precision_aware_optimizer=pao))
                        row = [prediction_figures(p), verdict_figures(v)]
                        if pao and wname != "vision":
                            for h in hypotheses:
                                row.append(tokens_per_s_under(h, model, gpu, workload, layout, profile=None))
                            row.append(step_time_only(model, gpu, workload, layout))
                    except Exception as e:  # noqa: BLE001
                        row = [repr(e)]
                    out[key] = repr(row)
    out.update(spaces())
    return out


def spaces() -> dict:
    """score_space of a few spaces, whole (what the tuner keeps and in which order)."""
    from experiments.predicted_runner import PredictedRunner
    from tuner.space_scoring import score_space
    from tuner.study import StudyConfig

    out = {}
    for name, gpu, n, options in (("qwen3.6-35b-a3b", "h200", 8, SpaceOptions()),
                                  ("llama3-8b", "h100", 64, SpaceOptions(rows_per_microbatch=(1, 2))),
                                  ("deepseek-v3", "b200", 64, SpaceOptions(rows_per_microbatch=(1,),
                                   offload_fractions=(0.0,), full_recompute_layers=(1,)))):
        config = replace(StudyConfig(load_model(name), load_gpu(gpu), n, Workload()), options=options)
        try:
            kept = score_space(config, PredictedRunner())
            value = [(layout.key(), prediction_figures(p)) for layout, p in kept]
        except Exception as e:  # noqa: BLE001
            value = repr(e)
        # a digest: the whole repr of the default space is ~70 MB
        out[("score_space", name, gpu, n)] = (len(value), hashlib.sha256(repr(value).encode()).hexdigest())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    started = time.monotonic()
    now = figures()
    took = time.monotonic() - started
    path = Path(argv[1])
    # a layout the cost model refuses is a figure, but a run where most raise is a broken benchmark, not a reference
    raised = [v for k, v in now.items() if len(k) == 5 and v.startswith("[") and "Error(" in v[:80]]
    print(f"{len(raised):,} of {sum(len(k) == 5 for k in now):,} layouts raised"
          + (f" (first: {raised[0][:160]})" if raised else ""))
    if len(raised) * 2 > len(now):
        print("exactness: most layouts raised; fix the benchmark before saving or comparing", file=sys.stderr)
        return 2
    if argv[0] == "save":
        path.write_bytes(pickle.dumps(now))
        print(f"saved {len(now):,} figures to {path} ({took:.0f} s)")
        return 0
    before = pickle.loads(path.read_bytes())
    differ = [k for k in before if now.get(k) != before[k]] + [k for k in now if k not in before]
    layouts = sum(1 for k in before if k[0] != "score_space" and len(k) == 5)
    print(f"compared {len(before):,} figures ({layouts:,} layouts, 3 scored spaces) in {took:.0f} s: "
          f"{len(differ)} differ")
    for k in differ[:20]:
        print("  differs:", k)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
