"""The architecture families read from a config.json beyond the first ones: dense Qwen3.5, Qwen2 / Qwen2.5,
Qwen2-MoE, GLM-4.5 (glm4_moe) and DeepSeek-V2: their parameters against the published counts, the layer
pattern and biases each family has, Megatron's arguments for them, and the megatron runner building and
training a toy of each on the CPU (a 1-rank gloo group)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from cost_model.nouns.hf_config import from_hf_config
from cost_model.nouns.model_spec import DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION, load_model
from cost_model.nouns.layout import Layout
from cost_model.nouns.workload import Workload

# Qwen/Qwen2.5-7B config.json (architecture fields)
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
             "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False,
             "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28}
# Qwen/Qwen2-57B-A14B config.json (architecture fields)
QWEN2_57B = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 3584,
             "intermediate_size": 18944, "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
             "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28, "num_experts": 64,
             "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False, "decoder_sparse_step": 1}
# deepseek-ai/DeepSeek-V2-Lite config.json (architecture fields)
DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
                    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
                    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "vocab_size": 102400, "topk_method": "greedy"}


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


def test_qwen25_counts_its_published_parameters_with_biases_on_q_k_v_only():
    """Qwen2.5-7B: 7,615,616,512 parameters (the checkpoint's count), 6.53B outside the embeddings (model card):
    biases on q, k and v (Qwen2's attention always has them), none on o_proj."""
    spec = from_hf_config(QWEN25_7B, "qwen2.5-7b")
    assert spec.params.total == 7_615_616_512
    assert round((spec.params.total - 2 * 152064 * 3584) / 1e9, 2) == 6.53
    assert spec.attention_bias and not spec.attention_output_bias and not spec.qk_norm
    assert spec.layer_types == (FULL_ATTENTION,) * 28 and spec.mlp_types == (DENSE,) * 28
    with_o_bias = dataclasses.replace(spec, attention_output_bias=True)
    assert with_o_bias.params.total - spec.params.total == 28 * 3584


def test_qwen2_sliding_window_starts_at_max_window_layers_when_asked():
    spec = from_hf_config({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20},
                          "windowed")
    assert spec.layer_types == (FULL_ATTENTION,) * 20 + (SLIDING_ATTENTION,) * 8 and spec.sliding_window == 4096


def test_qwen2_moe_counts_57b_total_14b_active_with_a_gated_shared_expert():
    """Qwen2-57B-A14B: 57.4B parameters (the checkpoint's, to its rounding), 14B active (the model name)."""
    spec = from_hf_config(QWEN2_57B, "qwen2-57b-a14b")
    assert round(spec.params.total / 1e9, 1) == 57.4 and rel(spec.params.active, 14e9) < 0.05
    assert spec.mlp_types == (MOE,) * 28 and spec.shared_expert_gate and spec.num_shared_experts == 1
    assert spec.attention_bias and not spec.attention_output_bias


def test_deepseek_v2_lite_is_mla_without_a_router_bias():
    """DeepSeek-V2-Lite: 15.7B total, 2.4B activated (the V2 report), MLA without query compression, softmax
    routing (no e_score_correction_bias, which V3 has)."""
    spec = from_hf_config(DEEPSEEK_V2_LITE, "deepseek-v2-lite")
    assert rel(spec.params.total, 15.7e9) < 0.005 and rel(spec.params.active_non_embedding, 2.4e9) < 0.05
    assert spec.layer_types == (MLA,) * 27 and spec.mlp_types == (DENSE,) + (MOE,) * 26
    assert spec.q_lora_rank == 0 and not spec.router_bias
    assert load_model("deepseek-v3").router_bias


@pytest.mark.parametrize("name,total,active", [("glm4.5-air", 106e9, 12e9), ("glm4.5", 355e9, 32e9)])
def test_glm45_counts_its_model_card(name, total, active):
    """GLM-4.5 / GLM-4.5-Air: total within 1% of the model card's (the MTP layer is not counted), active outside
    the embedding within 7% of its rounded figure; the first layers dense, q/k/v biases, half of a head rotated."""
    spec = load_model(name)
    assert rel(spec.params.total, total) < 0.01
    assert rel(spec.params.active_non_embedding, active) < 0.07
    dense = {"glm4.5-air": 1, "glm4.5": 3}[name]
    assert spec.mlp_types == (DENSE,) * dense + (MOE,) * (spec.num_hidden_layers - dense)
    assert spec.attention_bias and not spec.attention_output_bias and spec.partial_rotary_factor == 0.5
    assert spec.router_bias and spec.num_shared_experts == 1 and not spec.shared_expert_gate
    assert spec.qk_norm == (name == "glm4.5") and spec.num_nextn_predict_layers == 1


def test_dense_qwen35_is_the_hybrid_with_a_dense_mlp():
    spec = load_model("qwen3.5-27b")
    assert spec.layer_types == (LINEAR_ATTENTION, LINEAR_ATTENTION, LINEAR_ATTENTION, FULL_ATTENTION) * 16
    assert spec.mlp_types == (DENSE,) * 64 and not spec.is_moe and spec.attn_output_gate
    assert rel(spec.params.total, 27e9) < 0.01 and spec.vision is not None


@pytest.mark.parametrize("name,size,layers", [("qwen3.5-0.8b", 0.8e9, 24), ("qwen3.5-4b", 4e9, 32)])
def test_the_small_dense_qwen35s_are_the_same_hybrid_with_tied_embeddings(name, size, layers):
    """Their language models within 10% of the size the name gives (the ViT, left out of the catalog, makes up
    the rest), tied embeddings as slime's scripts have them (no --untie-embeddings-and-output-weights)."""
    from search_space.megatron_args import model_args

    spec = load_model(name)
    assert spec.num_hidden_layers == layers and spec.mlp_types == (DENSE,) * layers and spec.tie_word_embeddings
    assert rel(spec.params.total, size) < 0.10 and spec.vision is None
    assert "--untie-embeddings-and-output-weights" not in model_args(spec)


def test_megatron_args_match_slimes_model_scripts():
    """The families' MODEL_ARGS carry what slime's scripts/models/glm4.5-106B-A12B.sh and qwen2.5-7B.sh pass."""
    from search_space.megatron_args import model_args

    glm = model_args(load_model("glm4.5-air"))
    for flag in ("--add-qkv-bias", "--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights"):
        assert flag in glm
    after = lambda args, flag: args[args.index(flag) + 1]  # noqa: E731
    assert after(glm, "--rotary-percent") == "0.5" and after(glm, "--moe-layer-freq") == "[0]+[1]*45"
    assert after(glm, "--moe-shared-expert-intermediate-size") == "1408" and "--moe-shared-expert-gate" not in glm
    assert "--qk-layernorm" not in glm and "--qk-layernorm" in model_args(load_model("glm4.5"))
    qwen = model_args(from_hf_config(QWEN25_7B, "qwen2.5-7b"))
    assert "--add-qkv-bias" in qwen and after(qwen, "--num-query-groups") == "4"


def test_unsupported_model_types_still_get_one_line():
    from cost_model.nouns.model_spec import ModelError

    with pytest.raises(ModelError, match="unsupported model_type 'olmoe'.*glm4_moe.*qwen2"):
        from_hf_config({"model_type": "olmoe", "hidden_size": 8}, "olmoe")


# ------------------------------------------------------------------------------ the runner builds them
def _toy(spec, layers: int):
    from experiments.megatron.model_run import trial_model

    run = trial_model(spec, layers)
    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                 intermediate_size=96 if run.intermediate_size else 0)
    if run.is_moe:
        small.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32 * run.num_shared_experts)
    return dataclasses.replace(run, **small)


@pytest.mark.torch
@pytest.mark.parametrize("spec", [load_model("glm4.5-air"), from_hf_config(QWEN25_7B, "qwen2.5-7b")],
                         ids=["glm4.5-air", "qwen2.5-7b"])
def test_the_runner_builds_and_trains_a_toy_of_the_family_on_cpu(spec):
    """A 2-layer toy through the runner's TransformerConfig and torch-native block spec, with rotary position
    embeddings over the family's share of each head: q/k/v biases and no o_proj bias; GLM's first layer dense,
    its second MoE with an ungated shared expert; a forward and backward give a finite loss near ln(vocab)."""
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from experiments.megatron import config, torch_native as tnb
    from megatron_cpu import one_rank

    toy = _toy(spec, 2)
    kw = config.transformer_config_kwargs(toy, Layout(1), Workload(seq_len=32, global_batch=2),
                                          use_cpu_initialization=True)
    kw.update(bf16=False, params_dtype=torch.float32, pipeline_dtype=torch.float32)
    if toy.is_moe:
        kw["moe_token_dispatcher_type"] = "allgather"   # the alltoall one needs CUDA streams
    with one_rank():
        cfg = TransformerConfig(**kw)
        block, _ = tnb.block_spec(toy, cfg, "torch-native")
        torch.manual_seed(0)
        model = GPTModel(cfg, block, vocab_size=256, max_sequence_length=32, position_embedding_type="rope",
                         rotary_percent=toy.partial_rotary_factor, rotary_base=10000)
        attention = model.decoder.layers[0].self_attention
        assert attention.linear_qkv.bias is not None and attention.linear_proj.bias is None
        mlps = [type(layer.mlp).__name__ for layer in model.decoder.layers]
        if toy.is_moe:
            assert mlps == ["MLP", "MoELayer"]
            shared = model.decoder.layers[1].mlp.shared_experts
            assert shared is not None and getattr(shared, "gate_weight", None) is None
        else:
            assert mlps == ["MLP", "MLP"]
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
        loss = model(ids, torch.arange(32).expand(2, 32), None, labels=ids).mean()
        loss.backward()
        assert math.isfinite(float(loss)) and abs(float(loss) - math.log(256)) < 1.0
        assert attention.linear_qkv.bias.grad is not None and attention.linear_qkv.bias.grad.abs().sum() > 0


@pytest.mark.torch
def test_the_runner_configures_dense_qwen35_with_gdn_and_no_experts():
    from experiments.megatron import config

    toy = _toy(load_model("qwen3.5-27b"), 4)
    kw = config.transformer_config_kwargs(toy, Layout(1), Workload(seq_len=32, global_batch=2),
                                          use_cpu_initialization=True)
    assert kw["linear_attention_freq"] == [1, 1, 1, 0] and "num_moe_experts" not in kw
    assert kw["attention_output_gate"] and kw["ffn_hidden_size"] == 96
    assert config.unsupported(load_model("qwen3.5-27b")) is None
    assert "MLA" in config.unsupported(from_hf_config(DEEPSEEK_V2_LITE, "deepseek-v2-lite"))


def test_digests_recorded_before_the_bias_field_still_match():
    """Studies and recipes record an architecture digest; the field added for q/k/v-only biases leaves the digest of
    every model without it as it was (values computed by the code before the field existed)."""
    from tuner.model_identity import full_digest

    from pathlib import Path

    llama2 = Path(__file__).resolve().parents[1] / "benchmarks/models/llama2-7b/config.json"
    assert full_digest(load_model(str(llama2))) == "c64d79fc45ae90d2"
    assert full_digest(load_model("qwen3.6-35b-a3b")) == "513b4ad0d602359a"
    assert full_digest(load_model("gpt-oss-20b")) == "76978d68e9b2ee4a"
    assert full_digest(from_hf_config(QWEN25_7B, "q")) != full_digest(
        dataclasses.replace(from_hf_config(QWEN25_7B, "q"), attention_output_bias=True))


def test_the_shipped_profile_still_measures_the_layers_it_ran():
    """Profile layer signatures recorded before the bias field still name the models they were measured on (a field
    at its default is left out of a signature), and a signature gives back the model's layer fields."""
    from cost_model.nouns.hardware import load_gpu
    from cost_model.runner_components import layer_signature, signature_model
    from experiments.megatron.model_run import trial_model
    from tuner.intervals import measures_layers

    h200 = load_gpu("h200")
    for name in ("qwen3.6-35b-a3b", "qwen3-30b-a3b", "llama3-8b"):
        assert measures_layers(trial_model(load_model(name), 4), h200), name
    assert not measures_layers(load_model("glm4.5-air"), h200)   # never profiled: its layers are scaled
    qwen2 = from_hf_config(QWEN25_7B, "q")
    signature = layer_signature(qwen2, FULL_ATTENTION, DENSE)
    assert "attention_output_bias=False" in signature and signature_model(qwen2, signature) == qwen2


def test_heads_wider_than_the_hidden_size_are_refused_in_one_line_not_divided_by_zero():
    from cost_model.nouns.model_spec import ModelError

    with pytest.raises(ModelError, match=r"hidden_size=16 over num_attention_heads=32 leaves heads of 0 dim"):
        from_hf_config({**QWEN25_7B, "hidden_size": 16, "num_attention_heads": 32, "num_key_value_heads": 32})
    assert from_hf_config({**QWEN25_7B, "hidden_size": 16, "num_attention_heads": 32, "num_key_value_heads": 32,
                           "head_dim": 8}).head_dim == 8


@pytest.mark.parametrize("left_out", ["num_experts", "shared_expert_intermediate_size"])
def test_a_moe_config_missing_its_experts_is_refused_not_read_as_dense(left_out):
    """transformers would fill in its class default (qwen2_moe: 60 experts, a 5,632-wide shared expert): reading
    the missing field as 0 made Qwen1.5-MoE a smaller model with a third less active compute, silently."""
    from cost_model.nouns.model_spec import ModelError

    with pytest.raises(ModelError, match=f"field '{left_out}' is missing"):
        from_hf_config({k: v for k, v in QWEN2_57B.items() if k != left_out})
    qwen3 = {**QWEN25_7B, "model_type": "qwen3_moe", "moe_intermediate_size": 768, "num_experts_per_tok": 8}
    with pytest.raises(ModelError, match="field 'num_experts' is missing"):
        from_hf_config(qwen3)
    assert from_hf_config({**qwen3, "model_type": "qwen3"}).num_experts == 0   # dense Qwen3 has none


def test_a_mistral_config_without_a_window_has_transformers_default():
    mistral = {**QWEN25_7B, "model_type": "mistral"}
    mistral.pop("sliding_window")
    assert from_hf_config(mistral).sliding_window == 4096
    assert from_hf_config({**mistral, "sliding_window": None}).sliding_window == 0   # v0.2 on: null, full attention


def test_a_config_in_the_hugging_face_cache_is_named_by_its_repository_not_its_revision(tmp_path):
    import json

    from cost_model.nouns.model_spec import load_model

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B" / "snapshots" / "a09a35458c702b33eeacc393d103063234e8bc28"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN25_7B))
    assert load_model(str(snapshot / "config.json")).name == "Qwen2.5-7B"
    plain = tmp_path / "my-model"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(QWEN25_7B))
    assert load_model(str(plain / "config.json")).name == "my-model"
