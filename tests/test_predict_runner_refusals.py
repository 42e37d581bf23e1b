"""`tune predict --stack megatron-runner` refuses what the megatron runner refuses, in the runner's own words
(one source: experiments.megatron.config and tuner.backends), flags and --batch lines alike; a recipe's stack is
its own; rows longer than a micro-batch's token cap are priced with a note; an empty batch says so; `tune trial`
gives its final reason at once."""
import json
from pathlib import Path

import pytest

from cost_model.nouns.layout_codec import layout_from_values
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from experiments.megatron.config import layout_unsupported, unsupported
from tuner.backends import megatron_unsupported, not_set_up
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "tests" / "fixtures" / "reference_recipes" / "attune-tp1-pp1-ep8.yaml")
# Mistral-7B-v0.1's shape at 2 layers: sliding-window attention on every layer
MISTRAL = {"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
           "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
           "num_attention_heads": 32, "num_hidden_layers": 2, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
           "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000}
RUNNER = ["predict", "--gpu", "h200", "--gpus", "1", "--stack", "megatron-runner", "--global-batch", "8"]


def one_error(capsys, code) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tune: error: "), (code, err)
    return err[0]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "mistral-2l.json"
    path.write_text(json.dumps(MISTRAL))
    return str(path)


def _reason(model: str, *flags: str, layout: dict | None = None) -> str:
    """The runner's own refusal for the model and workload flags (precision, peft, cuda graphs) asked."""
    given = dict(zip(flags[::2], flags[1::2]))
    work = Workload(seq_len=8192, global_batch=8, framework="megatron",
                    precision=given.get("--precision", "bf16"), peft=given.get("--peft", "none"),
                    cuda_graphs=given.get("--cuda-graphs", "none"))
    lay = layout_from_values(layout or {}, 2 if layout else 1, 8192)
    return megatron_unsupported(load_model(model), work, lay)


@pytest.mark.parametrize("model,flags", [
    ("moonlight-16b-a3b", ()),                       # MLA
    ("gpt-oss-20b", ()),                             # GPT-OSS
    ("qwen3-30b-a3b", ("--precision", "fp8")),
    ("qwen3-30b-a3b", ("--peft", "lora")),
    ("qwen3-30b-a3b", ("--cuda-graphs", "full")),
])
def test_predict_on_the_runner_stack_refuses_what_the_runner_refuses(capsys, model, flags):
    reason = _reason(model, *flags)
    assert reason   # the runner refuses it (its own function says so)
    line = one_error(capsys, main([*RUNNER, "--model", model, *flags]))
    assert reason in line and "the image stack prices it" in line
    # the image stack still prices it
    image = [a for a in RUNNER if a not in ("--stack", "megatron-runner")]
    assert main([*image, "--model", model, *flags, "--framework", "megatron", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "predicted"


def test_sliding_windows_and_the_ep_overlap_are_refused_with_the_runners_reason(capsys, mistral):
    assert unsupported(load_model(mistral)) in one_error(capsys, main([*RUNNER, "--model", mistral]))
    layout = layout_from_values({"ep": 2, "overlap_moe_expert_parallel_comm": True}, 2, 8192)
    reason = layout_unsupported(layout)
    assert reason and "overlap_moe_expert_parallel_comm" in reason
    argv = ["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2", "--stack", "megatron-runner",
            "--global-batch", "8", "--layout", "ep=2", "overlap_moe_expert_parallel_comm=true"]
    assert reason in one_error(capsys, main(argv))


def test_a_batch_line_on_the_runner_stack_gets_the_same_refusal(tmp_path, capsys):
    lines = [{"model": "moonlight-16b-a3b", "gpu": "h200", "gpus": 1, "global_batch": 8, "stack": "megatron-runner"},
             {"model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 1, "global_batch": 8, "stack": "megatron-runner",
              "precision": "fp8"},
             {"model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 1, "global_batch": 8, "stack": "megatron-runner",
              "peft": "lora", "framework": "megatron"},
             {"model": "llama3-8b", "gpu": "h200", "gpus": 1, "global_batch": 8, "stack": "megatron-runner"}]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert main(["predict", "--batch", str(path)]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert _reason("moonlight-16b-a3b") in out[0]["error"]
    assert _reason("qwen3-30b-a3b", "--precision", "fp8") in out[1]["error"]
    assert out[2]["error"].endswith(not_set_up("megatron", peft="lora") + "; the image stack prices it")
    assert "error" not in out[3] and out[3]["kind"] == "predicted"   # what the runner runs is priced


def test_a_recipe_refuses_another_stack_as_it_refuses_the_other_flags(tmp_path, capsys):
    line = one_error(capsys, main(["predict", "--recipe", RECIPE, "--stack", "megatron-runner"]))
    assert "drop --stack" in line
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"recipe": RECIPE, "stack": "megatron-runner"}) + "\n"
                    + json.dumps({"recipe": RECIPE, "stack": "image"}) + "\n")
    assert main(["predict", "--batch", str(path)]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0]["error"].endswith("drop stack")
    assert out[1]["kind"] == "predicted"   # the image is the recipe's own stack: nothing ignored
    # --batch takes the stack from its lines: the flag is refused, not ignored
    assert "drop --stack" in one_error(capsys, main(["predict", "--batch", str(path), "--stack", "megatron-runner"]))


def test_rows_longer_than_the_token_cap_are_priced_one_a_micro_batch_with_a_note(tmp_path, capsys):
    argv = ["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "1", "--layout", "max_tokens_per_gpu=100"]
    assert main(argv + ["--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)   # stdout holds the answer alone
    assert data["tokens_per_microbatch"] == 8192 and data["layout"]["max_tokens_per_gpu"] == 100
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: note: rows of 8,192 tokens exceed max_tokens_per_gpu 100")
    assert "each micro-batch holds one row, as slime packs them" in err[0]
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"model": "qwen3-30b-a3b", "gpu": "h200", "gpus": 1,
                                "layout": {"max_tokens_per_gpu": 100}}) + "\n")
    assert main(["predict", "--batch", str(path)]) == 0
    assert "each micro-batch holds one row" in json.loads(capsys.readouterr().out)["notes"][0]
    # a cap that holds a row: no note
    assert main(argv[:-1] + ["max_tokens_per_gpu=8192", "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_an_invalid_layout_is_one_error_line_without_the_note(capsys):
    argv = ["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "1", "--layout",
            "max_tokens_per_gpu=100", "rows_per_microbatch=2"]
    assert "rows_per_microbatch 2 does not match" in one_error(capsys, main(argv))


def test_an_empty_batch_says_so_and_exits_0(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n   \n")
    assert main(["predict", "--batch", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "held no requests" in err[0] and err[0].startswith("tune: note: ")


def test_trial_gives_the_final_reason_at_once(capsys):
    base = ["trial", "--backend", "megatron", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "1"]
    want = not_set_up("megatron", peft="lora")
    for extra in ([], ["--framework", "megatron"]):   # not "modelled for --framework megatron only" first
        assert want in one_error(capsys, main([*base, "--peft", "lora", *extra]))


def test_trial_refuses_the_ep_overlap_before_looking_for_a_gpu(capsys):
    argv = ["trial", "--backend", "megatron", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2",
            "--layout", "ep=2", "overlap_moe_expert_parallel_comm=true"]
    line = one_error(capsys, main(argv))
    assert "--backend megatron: EP all-to-all overlap" in line and "GPU" not in line.split("(")[0]


@pytest.mark.parametrize("field, words", [("cp=2", "CP 2 (context parallelism needs"),
                                          ("exp_avg_dtype=bf16", "bf16 Adam moments")])
def test_the_runner_stack_refuses_what_its_torch_native_step_cannot_run(capsys, field, words):
    """The torch-native runner refuses CP > 1 and trains fp32 moments where bf16 are asked ("NOT applied"): its
    stack priced both as if they ran."""
    line = one_error(capsys, main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--stack",
                                   "megatron-runner", "--layout", "ep=8", field]))
    assert words in line and "the image stack prices it" in line
