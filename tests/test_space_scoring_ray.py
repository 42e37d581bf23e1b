"""Scoring a space on a Ray cluster (`--ray-address` with the predict backend) gives what scoring it here gives;
an address where nothing answers, or the dashboard's http:// address, is one line before any work."""
import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from experiments.predicted_runner import PredictedRunner
from tuner.cli import main
from tuner.options import CliError
from tuner.space_scoring import score_space
from tuner.study import StudyConfig


def _figures(scored):
    return [(layout.key(), p.tokens_per_s_per_gpu, p.peak_memory_gib, p.fit_probability, p.breakdown)
            for layout, p in scored]


@pytest.mark.ray
@pytest.mark.slow
def test_scoring_on_ray_is_scoring_here():
    import ray

    config = StudyConfig(load_model("llama3-8b"), load_gpu("h100"), 8, Workload())
    here = score_space(config, PredictedRunner())
    try:
        there = score_space(config, PredictedRunner(), ray_address="local")
    finally:
        ray.shutdown()
    assert len(here) > 100 and _figures(there) == _figures(here)


@pytest.mark.parametrize("address, says", [("127.0.0.1:1", "nothing answers there"),
                                           ("http://127.0.0.1:8265", "not its dashboard's http:// address"),
                                           ("no-port", "expected ray://HOST:PORT")])
def test_a_cluster_that_cannot_be_joined_is_one_line(tmp_path, capsys, address, says):
    config = StudyConfig(load_model("llama3-8b"), load_gpu("h100"), 8, Workload())
    with pytest.raises(CliError, match=says):
        score_space(config, PredictedRunner(), ray_address=address)
    rc = main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--trials", "1", "--ray-address", address,
               "--storage", str(tmp_path / "s.db"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0]
    assert not (tmp_path / "s.db").exists(), "no study written"
