"""`tune --backend megatron` with --layers auto: one layer count for the whole study, chosen before scoring."""
from __future__ import annotations

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from experiments.megatron.runner import MegatronRunner
from search_space.enumerate import SpaceOptions, workload_options
from tuner.options import CliError
from tuner.study import StudyConfig, runner_space
from tuner.study_commands import score_space, study_layers


def _config(name: str, gpus: int = 1, seq_len: int = 4096) -> StudyConfig:
    w = Workload(framework="megatron", seq_len=seq_len, global_batch=16)
    return StudyConfig(load_model(name), load_gpu("h200"), gpus, w, Stack(), workload_options(SpaceOptions(), w),
                       None, steps=8, window=(2, 7))


@pytest.mark.parametrize("name", ["qwen3.6-35b-a3b", "qwen3-30b-a3b"])
def test_auto_layers_give_a_study_whose_layouts_fit_one_gpu(name):
    # the whole model fits no layout of 1 x H200 (the "smallest predicted peak is 215.0 GiB")
    config, runner = _config(name), MegatronRunner()
    space = runner_space(config, runner)
    with pytest.raises(CliError, match="no layout of"):
        score_space(config, runner, space)
    n, how = study_layers(config, runner, space)
    assert 1 <= n < config.model.num_hidden_layers and f"{n} of {config.model.num_hidden_layers} layers" in how
    runner.layers = n
    fitting = score_space(config, runner, space)
    assert len(fitting) > 10 and any(not l.recompute_granularity for l, _ in fitting)
    # one more layer and no layout without recompute or offload fits
    runner.layers = n + 1
    plain = [p for l, p in score_space(config, runner, space)
             if not l.recompute_granularity and not l.optimizer_offload_fraction]
    assert not any(p.fits for p in plain)


def test_a_model_that_fits_whole_keeps_its_layers():
    config, runner = _config("llama3-8b", gpus=8), MegatronRunner()
    n, _ = study_layers(config, runner, runner_space(config, runner))
    assert n == 32
