"""LoRA (a frozen base) and VLM images (a vision encoder on the first stage) as workload options (issue 16):
what each changes in the cost model and what it leaves alone; how they reach predict from flags and batch
lines; which runs the public rows say used them; studies made before them keep their identity."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks.public_data import map_images, map_peft
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.hf_config import from_hf_config
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import ModelError, load_model
from cost_model.predict import predict
from cost_model.nouns.units import GIB
from cost_model.nouns.vision_spec import VisionSpec
from cost_model.nouns.workload import Workload, WorkloadError
from tuner.cli import main
from tuner.study import StudyConfig

H100 = load_gpu("h100")
LLAMA = load_model("llama3-8b")
QWEN = load_model("qwen3.6-35b-a3b")


def megatron(**kw) -> Workload:
    return Workload(seq_len=4096, global_batch=64, framework="megatron", **kw)


# ------------------------------------------------------------------------------------------------ LoRA
def test_lora_drops_weight_gradients_and_everything_that_follows_them():
    layout = Layout(8, tp=2, max_tokens_per_gpu=4096)
    full, lora = (predict(LLAMA, H100, megatron(peft=p), layout) for p in ("none", "lora"))
    # GEMMs on frozen weights: forward and input gradient, two passes of three
    assert lora.breakdown["compute_mlp"] == pytest.approx(full.breakdown["compute_mlp"] * 2 / 3)
    assert lora.breakdown["compute_logits"] == pytest.approx(full.breakdown["compute_logits"] * 2 / 3)
    # attention's core has no weights: unchanged; nor do the collectives of the activations change
    assert lora.breakdown["tp_comm"] == pytest.approx(full.breakdown["tp_comm"])
    assert full.breakdown["optimizer"] > 0   # (Megatron's gradient sync is fitted as hidden: dp_comm 0 in both)
    assert lora.breakdown["dp_comm"] == 0 and lora.breakdown["optimizer"] == 0
    assert lora.memory.grads == lora.memory.optimizer == 0 and full.memory.grads > 0
    assert lora.memory.weights == full.memory.weights and lora.memory.activations == full.memory.activations
    assert lora.step_time_s < full.step_time_s


def test_lora_recompute_reruns_the_same_forward():
    layout = Layout(8, tp=2, max_tokens_per_gpu=4096, recompute_granularity="full", recompute_method="uniform",
                    recompute_num_layers=1)
    full, lora = (predict(LLAMA, H100, megatron(peft=p), layout) for p in ("none", "lora"))
    assert lora.breakdown["recompute"] == pytest.approx(full.breakdown["recompute"])


def test_lora_is_refused_where_it_is_not_modelled():
    with pytest.raises(WorkloadError, match="--framework megatron only"):
        Workload(peft="lora")
    with pytest.raises(WorkloadError, match="must be one of"):
        Workload(framework="megatron", peft="qlora")


def test_lora_from_the_flag_and_a_batch_line(tmp_path, capsys):
    args = ["predict", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--framework", "megatron",
            "--layout", "tp=2", "--json"]
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert main(args + ["--peft", "lora"]) == 0
    lora = json.loads(capsys.readouterr().out)
    assert lora["step_time_s"] < full["step_time_s"] and lora["memory_gib"]["grads"] == 0
    # the figure says what it assumed
    assert "LoRA: frozen base" in lora["source"] and "LoRA" not in full["source"]
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"model": "llama3-8b", "gpu": "h100", "gpus": 8, "framework": "megatron",
                                "peft": "lora", "layout": {"tp": 2}}) + "\n")
    assert main(["predict", "--batch", str(path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert line["step_time_s"] == pytest.approx(lora["step_time_s"])
    assert main(["predict", "--model", "llama3-8b", "--gpu", "h100", "--peft", "lora"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--framework megatron only" in err[0]


def test_a_real_runner_refuses_options_it_does_not_set_up(capsys, tmp_path):
    # the megatron runner trains every weight eagerly on text: a LoRA, graphed or VLM trial would measure another run
    for flag, value in (("--peft", "lora"), ("--cuda-graphs", "full"), ("--images-per-row", "1")):
        code = main(["--model", "llama3-8b", "--gpu", "h100", "--gpus", "1", "--framework", "megatron",
                     flag, value, "--backend", "megatron", "--trials", "1", "--storage", str(tmp_path / "s.db")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and flag in err[0] and "--backend predict" in err[0], err


# ------------------------------------------------------------------------------------------------ vision
def test_the_catalog_vlm_has_its_encoder():
    v = QWEN.vision
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.patch_size) == (27, 1152, 4304, 16, 16)
    assert v.out_hidden_size == QWEN.hidden_size
    assert 0.40e9 < v.params < 0.46e9     # Qwen3-VL-class ViT, about 0.4B with its merger
    assert LLAMA.vision is None


def test_encoder_parameters_and_patches_count_what_the_architecture_holds():
    v = VisionSpec(depth=2, hidden_size=8, intermediate_size=16, num_heads=2, patch_size=4, out_hidden_size=10)
    embed = 3 * 2 * 16 * 8 + 8
    layer = (4 * 64 + 4 * 8) + (2 * 8 * 16 + 16 + 8) + 4 * 8
    merger = 32 * 32 + 32 + 32 * 10 + 10 + 16
    assert v.params == embed + 2 * layer + merger
    assert v.patches_per_image(32) == 64           # (32 / 4)^2
    assert v.patches_per_image(30) == 64           # resized to whole merged patches (8 px)
    assert QWEN.vision.patches_per_image(448) == 784 and QWEN.vision.patches_per_image(256) == 256


def test_text_workloads_are_untouched_and_images_cost_the_first_stage():
    layout = Layout(8, ep=8, max_tokens_per_gpu=4096)
    text = predict(QWEN, H100, megatron(), layout)
    assert text == predict(QWEN, H100, megatron(image_size=1024), layout)   # no images: the size is moot
    assert "1 image of 448x448 px per row" in predict(QWEN, H100, megatron(images_per_row=1), layout).source
    one, four = (predict(QWEN, H100, megatron(images_per_row=n), layout) for n in (1, 4))
    assert text.breakdown["compute_vision"] == 0 < one.breakdown["compute_vision"] < four.breakdown["compute_vision"]
    assert one.memory.weights - text.memory.weights == pytest.approx(QWEN.vision.params * 2 / GIB)
    assert text.memory.activations < one.memory.activations < four.memory.activations
    # the same token slots per step, more work: fewer tokens/s
    assert four.tokens_per_s_per_gpu < one.tokens_per_s_per_gpu < text.tokens_per_s_per_gpu


def test_only_the_first_pipeline_stage_holds_the_encoder():
    even = Layout(16, pp=2, ep=8, max_tokens_per_gpu=4096)
    lighter_first = replace(even, decoder_first_pipeline_num_layers=16, decoder_last_pipeline_num_layers=24)
    w = megatron(images_per_row=1)
    # with the encoder on stage 0, taking layers off it lowers the peak (the card's 16/24 split)
    assert predict(QWEN, H100, w, lighter_first).peak_memory_gib < predict(QWEN, H100, w, even).peak_memory_gib


def test_images_need_an_encoder(capsys):
    with pytest.raises(WorkloadError, match="has no vision encoder"):
        predict(LLAMA, H100, megatron(images_per_row=1), Layout(8, max_tokens_per_gpu=4096))
    assert main(["predict", "--model", "llama3-8b", "--gpu", "h100", "--images-per-row", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no vision encoder" in err[0]
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h100", "--images-per-row", "-1"]) == 2
    assert "--images-per-row" in capsys.readouterr().err


def test_a_malformed_vision_config_names_the_field():
    config = json.loads(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100,
                                    "intermediate_size": 128}))
    assert from_hf_config(config, "toy").vision is None
    config["vision_config"] = {"depth": "x", "hidden_size": 64}
    with pytest.raises(ModelError, match="vision_config.depth"):
        from_hf_config(config, "toy")
    config["vision_config"] = {"depth": 2, "hidden_size": 65, "intermediate_size": 8, "num_heads": 4,
                               "patch_size": 14, "out_hidden_size": 64}
    with pytest.raises(ModelError, match="not divisible by num_heads"):
        from_hf_config(config, "toy")


# ------------------------------------------------------------------------------------------------ both
def test_studies_made_before_the_options_keep_their_identity():
    plain = StudyConfig(QWEN, H100, 8, Workload()).identity()["workload"]
    assert not {"peft", "images_per_row", "image_size"} & set(plain)
    vlm = StudyConfig(QWEN, H100, 8, megatron(images_per_row=2, image_size=256, peft="lora")).identity()["workload"]
    assert (vlm["peft"], vlm["images_per_row"], vlm["image_size"]) == ("lora", 2, 256)


@pytest.mark.parametrize("notes, peft, images", [
    ("LoRA PEFT (rank 8 on linear_qkv/linear_proj only, base frozen), SP on", "lora", (0, 448)),
    ("LoRA PEFT MedPix, same topology as GB200 SFT item", "lora", (1, 448)),
    ("SFT MedPix VLM (448x448 images), natural routing", "none", (1, 448)),
    ("pretrain_performance fixed-shape mock-data VLM recipe", "none", (1, 256)),
    ("pretrain_performance, real DataComp image-caption data (VLM incl. vision encoder)", "none", (1, 448)),
    ("pretrain functional run, RedPajama2", "none", (0, 448)),
])
def test_the_public_rows_say_which_runs_were_lora_or_vlm(notes, peft, images):
    assert map_peft(notes) == peft
    assert map_images(notes)[:2] == images


def test_a_frozen_base_has_no_optimizer_choices_to_search():
    from search_space.enumerate import SpaceOptions, workload_options
    assert workload_options(SpaceOptions(), megatron()) == SpaceOptions()
    lora = workload_options(SpaceOptions(), megatron(peft="lora"))
    assert (lora.offload_fractions, lora.exp_avg_dtypes) == ((0.0,), ("fp32",))


def test_a_recipe_keeps_the_workload_it_was_priced_for(tmp_path, capsys):
    out = tmp_path / "r.yaml"
    args = ["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h100", "--gpus", "16", "--framework", "megatron",
            "--peft", "lora", "--images-per-row", "2", "--image-size", "256", "--layout", "ep=8", "--json"]
    assert main(args + ["--recipe-out", str(out)]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert main(["predict", "--recipe", str(out), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["step_time_s"] == pytest.approx(direct["step_time_s"])
    text = out.read_text()
    assert "peft: lora" in text and "images_per_row: 2" in text and "image_size: 256" in text
    assert "Megatron-LM/Bridge step" in text
    # a slime workload's recipe carries none of the extensions
    plain = tmp_path / "p.yaml"
    assert main(["predict", "--model", "qwen3.6-35b-a3b", "--gpu", "h200", "--layout", "ep=8",
                 "--recipe-out", str(plain)]) == 0
    capsys.readouterr()
    text = plain.read_text()
    assert "peft" not in text and "images_per_row" not in text and "framework: megatron" not in text
    assert "slime (Megatron backend)" in text


def test_images_that_cannot_be_in_the_row_are_refused():
    """16 images of 896 px are 16 x 784 image tokens of a 4,096-token row; a 7-px image is smaller than a patch."""
    from cost_model.nouns.errors import AttuneError
    from cost_model.nouns.workload import Workload

    model, gpu, layout = load_model("qwen3.5-35b-a3b"), load_gpu("h100"), Layout(16, ep=8, max_tokens_per_gpu=4096)
    crowded = Workload(seq_len=4096, global_batch=64, framework="megatron", images_per_row=16, image_size=896)
    with pytest.raises(AttuneError, match="12,544 image tokens, more than the 4,096-token row"):
        predict(model, gpu, crowded, layout)
    with pytest.raises(AttuneError, match="smaller than one 16-px patch"):
        predict(model, gpu, replace(crowded, images_per_row=1, image_size=7), layout)
    assert predict(model, gpu, replace(crowded, images_per_row=4), layout).tokens_per_s_per_gpu > 0


def test_the_slime_runner_refuses_a_megatron_lm_step(capsys, tmp_path):
    """`--backend slime --framework megatron` ran slime's step and compared it with a tuned Megatron step's
    prediction; the slime runner sets up slime's own step only."""
    for argv in (["--trials", "1", "--storage", str(tmp_path / "s.db")], None):
        base = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--framework", "megatron", "--backend", "slime"]
        code = main(base + argv) if argv else main(["trial", *base[:-2], "--backend", "slime", "--dry-run"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--framework megatron" in err[0] and "--backend predict" in err[0], err
    assert not (tmp_path / "s.db").exists()
