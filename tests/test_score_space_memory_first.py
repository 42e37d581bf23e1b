"""Scoring a space asks the memory verdict first and prices the step only of the layouts that may fit: the
kept layouts, their predictions and the refusal for a space where nothing fits are those of pricing each
layout in full."""
import pytest

from cost_model.hardware import load_gpu
from cost_model.model_spec import load_model
from cost_model.workload import Workload
from experiments.predicted_runner import PredictedRunner
from tuner.options import CliError
from tuner.study import StudyConfig
from tuner.study_commands import score_space


class FullPricing(PredictedRunner):
    """The same runner without the cheap memory verdict: every layout priced in full."""

    def memory_verdict(self, case, profile=None):
        return None


@pytest.mark.parametrize("model,gpu,gpus", [("qwen3-30b-a3b", "h200", 2), ("llama3-8b", "h100", 4)])
def test_memory_first_scoring_keeps_exactly_what_full_pricing_keeps(model, gpu, gpus):
    config = StudyConfig(load_model(model), load_gpu(gpu), gpus, Workload(seq_len=8192, global_batch=64))
    fast = score_space(config, PredictedRunner())
    full = score_space(config, FullPricing())
    assert len(fast) == len(full) > 0
    for (lf, pf), (lu, pu) in zip(fast, full):
        assert lf == lu
        assert (pf.tokens_per_s_per_gpu, pf.peak_memory_gib, pf.fit_verdict) == \
            (pu.tokens_per_s_per_gpu, pu.peak_memory_gib, pu.fit_verdict)


def test_a_space_where_nothing_fits_names_the_same_nearest_layout():
    config = StudyConfig(load_model("qwen3-235b-a22b"), load_gpu("h100"), 2, Workload(seq_len=4096, global_batch=8))
    errors = []
    for runner in (PredictedRunner(), FullPricing()):
        with pytest.raises(CliError) as info:
            score_space(config, runner)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "smallest predicted peak" in errors[0]
