"""CUDA graphs as a workload option of a Megatron step (issue 16): full-iteration graphs remove the host's
per-layer launch time; slime's eager step cannot have them; the option reaches predict from flags and batch
lines; the public rows say which runs used them; studies made before the option keep their identity."""
from __future__ import annotations

import json

import pytest

from benchmarks.public_data import map_cuda_graphs
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.workload import Workload, WorkloadError
from tuner.cli import main
from tuner.study import StudyConfig

MODEL, GPU = load_model("qwen3-30b-a3b"), load_gpu("h100")
LAYOUT = Layout(16, ep=16, max_tokens_per_gpu=4096)


def megatron(graphs: str) -> Workload:
    return Workload(seq_len=4096, global_batch=1024, framework="megatron", cuda_graphs=graphs)


def test_full_graphs_remove_the_host_launch_time_and_nothing_else():
    none, partial, full = (predict(MODEL, GPU, megatron(g), LAYOUT) for g in ("none", "partial", "full"))
    assert none.breakdown["launch_overhead"] > 0 and full.breakdown["launch_overhead"] == 0
    assert full.breakdown["expert_calls"] == 0   # the graph replays the per-expert GEMMs without the host
    host = none.breakdown["launch_overhead"] + none.breakdown["expert_calls"]
    assert full.step_time_s == pytest.approx(none.step_time_s - host)
    assert partial.step_time_s == none.step_time_s   # one fitted constant for both (the data cannot split them)
    assert full.memory == none.memory


@pytest.mark.parametrize("kwargs, why", [(dict(cuda_graphs="full"), "need --framework megatron"),
                                         (dict(framework="megatron", cuda_graphs="most"), "must be one of")])
def test_graphs_are_refused_where_they_cannot_run(kwargs, why):
    with pytest.raises(WorkloadError, match=why):
        Workload(**kwargs)


def test_the_flag_and_a_batch_line_reach_the_prediction(tmp_path, capsys):
    args = ["predict", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "1024", "--framework", "megatron", "--layout", "ep=16", "--json"]
    assert main(args) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main(args + ["--cuda-graphs", "full"]) == 0
    graphed = json.loads(capsys.readouterr().out)
    assert graphed["step_time_s"] < eager["step_time_s"]
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--layout", "ep=8",
                 "--cuda-graphs", "full"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need --framework megatron" in err[0]
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"model": "qwen3-30b-a3b", "gpu": "h100", "gpus": 16, "seq_len": 4096,
                                "global_batch": 1024, "framework": "megatron", "cuda_graphs": "full",
                                "layout": {"ep": 16}}) + "\n")
    assert main(["predict", "--batch", str(path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert line["step_time_s"] == pytest.approx(graphed["step_time_s"])


def test_a_study_without_graphs_keeps_its_identity():
    config = StudyConfig(MODEL, GPU, 16, Workload())
    assert "cuda_graphs" not in config.identity()["workload"]
    graphed = StudyConfig(MODEL, GPU, 16, megatron("full"))
    assert graphed.identity()["workload"]["cuda_graphs"] == "full"


@pytest.mark.parametrize("notes, expected", [
    ("MXFP8; full-iteration CUDA graphs; step 6501.12 ms", "full"),
    ("paged stash; full CG; HybridEP", "full"),
    ("HybridEP; TE CUDA graphs moe_router+moe_preprocess", "partial"),
    ("partial CG attn/moe_router/moe_preprocess", "partial"),
    ("SFT MedPix VLM, no CUDA graphs, FP32 optimizer state", "none"),
    ("pretrain functional run", "none"),
])
def test_the_public_rows_say_which_graphs_ran(notes, expected):
    assert map_cuda_graphs(notes) == expected
