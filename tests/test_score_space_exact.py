"""Scoring a space shares terms between its layouts (memos keyed on what each term reads, issue 27): the best layouts
it keeps, and every figure of their predictions, are those of predicting each layout alone with every memo
forgotten first (a memo keyed on too little would hand one layout another's figure)."""
import sys
from dataclasses import replace

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.workload import Workload
from experiments.predicted_runner import PredictedRunner
from search_space.enumerate import SpaceOptions
from tuner.study import StudyConfig
from tuner.study_commands import score_space

pytestmark = pytest.mark.slow   # scores whole spaces: make test runs it, make test-fast does not

TOP = 20
# narrowed where the whole space would take long to score; offload, recompute, PP/VPP, CP and EP stay in each
NARROW = SpaceOptions(rows_per_microbatch=(1, 2), full_recompute_layers=(1,), offload_fractions=(0.0, 0.5),
                      max_vpp=2)
CASES = [
    ("qwen3.6-35b-a3b", "h200", 8, SpaceOptions(rows_per_microbatch=(1, 4), offload_fractions=(0.0, 1.0))),
    ("llama3-8b", "h100", 64, NARROW),
    ("deepseek-v3", "b200", 64, replace(NARROW, rows_per_microbatch=(1,), max_cp=2)),
    ("qwen3-30b-a3b", "b200", 512, replace(NARROW, rows_per_microbatch=(1,), offload_fractions=(0.0,), max_cp=1,
                                           dispatchers=("alltoall",))),
]


def forget_memos() -> None:
    """Empty every memo of the cost model (module-level dicts named *MEMO*, the rates and constants kept)."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("cost_model.") or module is None:
            continue
        for attr, value in vars(module).items():
            if isinstance(value, dict) and ("MEMO" in attr or attr in ("_RECENT", "_CONSTANTS")):
                value.clear()


def figures(p) -> tuple:
    return (p.tokens_per_s_per_gpu, p.step_time_s, p.breakdown, p.memory.as_dict(), p.gpu_memory_gib,
            p.host_memory_gib_per_node, p.fit_probability, p.fit_verdict, p.reasons, p.mfu, p.num_microbatches,
            p.tokens_per_microbatch, p.source)


@pytest.mark.parametrize("model,gpu,gpus,options", CASES, ids=[f"{m}-{n}x{g}" for m, g, n, _ in CASES])
def test_best_layouts_of_a_scored_space_are_predicted_as_alone(model, gpu, gpus, options):
    config = replace(StudyConfig(load_model(model), load_gpu(gpu), gpus, Workload()), options=options)
    kept = score_space(config, PredictedRunner())
    best = sorted(kept, key=lambda lp: -lp[1].tokens_per_s_per_gpu)[:TOP]
    assert len(best) == TOP
    kinds = {(lp[0].pp > 1, lp[0].offloaded, lp[0].recompute_granularity) for lp in kept}
    assert len(kinds) > 2   # the space kept layouts of several kinds, not one
    for layout, scored in best:
        forget_memos()
        alone = predict(config.model, config.gpu, config.workload, layout)
        assert figures(scored) == figures(alone), layout.long_label
