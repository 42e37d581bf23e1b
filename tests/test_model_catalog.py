"""The model catalog, Hugging Face config.json loading and the derived parameter counts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cost_model.nouns.hf_config import from_hf_config
from cost_model.nouns.model_spec import (
    DENSE,
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MLA,
    MOE,
    SLIDING_ATTENTION,
    ModelError,
    ModelSpec,
    catalog_names,
    load_model,
    stage_layers,
)

FIXTURES = Path(__file__).parent / "fixtures"

EXPECTED_KEYS = {
    "qwen3.6-35b-a3b", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "qwen3-next-80b-a3b", "deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "moonlight-16b-a3b",
    "llama3-8b", "llama3-70b", "llama3.1-405b",
}

# The leaderboard's active non-embedding parameter count for Qwen3.6-35B-A3B (MFU's N).
QWEN36_ACTIVE_NON_EMBEDDING = 2_946_252_800


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


# --------------------------------------------------------------------------- catalog
def test_catalog_has_every_model_and_is_sorted():
    names = catalog_names()
    assert names == sorted(names)
    assert EXPECTED_KEYS <= set(names)


@pytest.mark.parametrize("name", sorted(EXPECTED_KEYS))
def test_every_catalog_entry_loads(name):
    spec = load_model(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name
    assert spec.display_name and spec.hf_repo and spec.sources
    assert len(spec.layer_types) == len(spec.mlp_types) == spec.num_hidden_layers
    p = spec.params
    assert len(p.layers) == spec.num_hidden_layers
    assert 0 < p.active_non_embedding < p.active <= p.total
    if not spec.is_moe:
        assert p.active == p.total


def test_catalog_name_is_case_insensitive_and_cached():
    assert load_model("Qwen3.6-35B-A3B") is load_model("qwen3.6-35b-a3b")


# --------------------------------------------------------------------------- Qwen3.6 acceptance
def test_qwen36_active_non_embedding_within_1pct_of_leaderboard():
    p = load_model("qwen3.6-35b-a3b").params
    assert rel(p.active_non_embedding, QWEN36_ACTIVE_NON_EMBEDDING) < 0.01
    # The leaderboard figure counts matrices only; ours adds the 1-D weights (RMSNorms, q/k-norms,
    # GDN dt_bias/A_log/norm): 40 x 2 x 2048 + 2048 + 10 x 512 + 30 x 192 = 176,768.
    assert p.active_non_embedding - QWEN36_ACTIVE_NON_EMBEDDING == 176_768


def test_qwen36_breakdown_matches_reference_section_d():
    spec = load_model("qwen3.6-35b-a3b")
    p = spec.params
    full = p.layers[3]
    gdn = p.layers[0]
    assert full.attention + 2 * 256 == 27_263_488            # 27.26M incl. q/k-norm
    assert gdn.linear_attention == 33_718_464                  # 33.72M
    assert gdn.routed_experts == 805_306_368                   # 805.3M / layer
    assert gdn.active_routed == 8 * 3 * 2048 * 512
    assert gdn.shared_expert == 3 * 2048 * 512 + 2048          # 3.15M + shared_expert_gate
    assert p.embedding == p.lm_head == 248320 * 2048           # 2 x 0.509B, untied
    assert rel(p.total, 34.66e9) < 0.001
    assert rel(p.routed_experts, 32.21e9) < 0.001
    assert rel(p.active, 3.45e9) < 0.01
    assert rel(p.non_expert, 2.45e9) < 0.01
    # MTP (1 layer in the checkpoint) is counted apart, not in the totals.
    assert len(p.mtp) == 1 and p.mtp[0].total > 0
    assert p.total == p.embedding + p.lm_head + p.final_norm + sum(l.total for l in p.layers)


def test_qwen36_layer_types():
    spec = load_model("qwen3.6-35b-a3b")
    full = [i for i, t in enumerate(spec.layer_types) if t == FULL_ATTENTION]
    assert full == list(range(3, 40, 4))
    assert spec.count(FULL_ATTENTION) == 10 and spec.count(LINEAR_ATTENTION) == 30
    assert spec.mlp_types == (MOE,) * 40 and spec.num_moe_layers == 40
    assert spec.attn_output_gate and spec.shared_expert_gate and not spec.tie_word_embeddings
    assert spec.partial_rotary_factor == 0.25
    assert spec.num_nextn_predict_layers == 1


def test_qwen36_equals_qwen35_architecture():
    a, b = load_model("qwen3.6-35b-a3b"), load_model("qwen3.5-35b-a3b")
    assert a.params == b.params
    assert a.model_type == b.model_type == "qwen3_5_moe"


# --------------------------------------------------------------------------- nominal totals
# (name, total, total tolerance, active figure, which count it is compared with, tolerance, why)
NOMINAL = [
    # Exact published counts: the derivation must hit them exactly.
    ("qwen3-30b-a3b", 30_532_122_624, 0.0, 3.3e9, "active", 0.05, "keras-hub preset count; card 3.3B active"),
    ("qwen3-235b-a22b", 235_093_634_560, 0.0, 22e9, "active", 0.05, "keras-hub preset count; 22B active"),
    ("llama3-8b", 8_030_261_248, 0.0, None, None, None, "public Llama-3(.1)-8B count"),
    ("llama3-70b", 70_553_706_496, 0.0, None, None, None, "public Llama-3(.1)-70B count"),
    # Precise published figures (3-4 significant digits): 0.1% on totals, 1% on actives.
    ("gpt-oss-120b", 116.83e9, 0.001, 5.13e9, "active_non_embedding", 0.01, "OpenAI model card"),
    ("gpt-oss-20b", 20.91e9, 0.001, 3.61e9, "active_non_embedding", 0.01, "OpenAI model card"),
    ("llama3.1-405b", 405.9e9, 0.001, None, None, None, "Meta 405B count"),
    ("qwen3.5-35b-a3b", 34.66e9, 0.001, 3.45e9, "active", 0.01, "slime-megatron.md section D"),
    ("qwen3.6-35b-a3b", 34.66e9, 0.001, 3.45e9, "active", 0.01, "slime-megatron.md section D"),
    # Nominal figures (2-3 digits, paper/model name): 5% where precise enough, looser for name-rounded actives.
    ("deepseek-v3", 671e9, 0.01, 37e9, "active", 0.05, "DeepSeek-V3 report: 671B total, 37B activated"),
    ("qwen3.5-397b-a17b", 397e9, 0.01, 17e9, "active", 0.05, "model name"),
    ("moonlight-16b-a3b", 16e9, 0.05, 3e9, "active", 0.05, "model name"),
    ("qwen3-next-80b-a3b", 80e9, 0.01, 3e9, "active", 0.30, "model name ('A3B' is rounded down)"),
]


@pytest.mark.parametrize("name,total,tol,active,kind,atol,why", NOMINAL, ids=[n[0] for n in NOMINAL])
def test_nominal_totals(name, total, tol, active, kind, atol, why):
    p = load_model(name).params
    assert rel(p.total, total) <= tol, f"{name}: total {p.total:,} vs {total:,.0f} ({why})"
    if active is not None:
        got = getattr(p, kind)
        assert rel(got, active) <= atol, f"{name}: {kind} {got:,} vs {active:,.0f} ({why})"


def test_deepseek_v3_structure_and_mtp():
    spec = load_model("deepseek-v3")
    assert spec.layer_types == (MLA,) * 61
    assert spec.mlp_types == (DENSE,) * 3 + (MOE,) * 58
    assert spec.shared_expert_intermediate_size == 2048 and spec.num_shared_experts == 1
    p = spec.params
    assert p.layers[0].routed_experts == 0 and p.layers[0].dense_mlp == 3 * 7168 * 18432
    # Checkpoint = main model + MTP module (its own copies of embedding and head): 684.5B, "685B".
    checkpoint = p.total + sum(l.total for l in p.mtp) + p.embedding + p.lm_head
    assert rel(checkpoint, 684.5e9) < 0.002
    # MLA down projections are replicated (Megatron's duplicated TELinear), up projections TP-sharded.
    assert p.layers[5].replicated > 7168 * (1536 + 512 + 64)


def test_moonlight_mla_without_q_lora():
    spec = load_model("moonlight-16b-a3b")
    assert spec.q_lora_rank == 0 and spec.kv_lora_rank == 512
    assert spec.mlp_types[0] == DENSE and spec.mlp_types[1:] == (MOE,) * 26
    assert spec.shared_expert_intermediate_size == 2 * 1408
    assert spec.num_nextn_predict_layers == 0 and spec.params.mtp == ()


def test_gpt_oss_layers_alternate_and_carry_biases():
    spec = load_model("gpt-oss-120b")
    assert spec.layer_types[:4] == (SLIDING_ATTENTION, FULL_ATTENTION, SLIDING_ATTENTION, FULL_ATTENTION)
    assert spec.count(SLIDING_ATTENTION) == spec.count(FULL_ATTENTION) == 18
    assert spec.sliding_window == 128 and spec.num_experts == 128 and spec.num_experts_per_tok == 4
    assert spec.attention_sinks and spec.expert_bias and spec.router_bias and spec.attention_bias
    assert load_model("gpt-oss-20b").num_experts == 32


MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                "max_position_embeddings": 32768, "rope_theta": 1e6, "sliding_window": None,
                "tie_word_embeddings": False}


def test_mixtral_config_counts_match_the_published_model():
    """Mixtral-8x7B's config.json (a family the catalog does not ship): 46,702,792,704 parameters, 12.9B active."""
    spec = from_hf_config(MIXTRAL_8X7B, "mixtral-8x7b")
    assert spec.params.total == 46_702_792_704
    assert rel(spec.params.active, 12.9e9) < 0.01
    assert spec.layer_types == (FULL_ATTENTION,) * 32 and spec.mlp_types == (MOE,) * 32
    assert not spec.qk_norm and spec.shared_expert_intermediate_size == 0
    windowed = from_hf_config({**MIXTRAL_8X7B, "sliding_window": 4096}, "mistral-windowed")
    assert windowed.layer_types == (SLIDING_ATTENTION,) * 32 and windowed.sliding_window == 4096


def test_mistral_config_counts_match_the_published_model():
    """Mistral-7B-v0.3's config.json (benchmarks/models, model_type mistral): 7,248,023,552 parameters; v0.1's
    4096-token window makes every layer a sliding one."""
    cfg = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/models/mistral-7b-v0.3/config.json").read_text())
    spec = from_hf_config(cfg, "mistral-7b-v0.3")
    assert spec.params.total == 7_248_023_552 and spec.layer_types == (FULL_ATTENTION,) * 32
    assert from_hf_config({**cfg, "sliding_window": 4096}, "v0.1").layer_types == (SLIDING_ATTENTION,) * 32


def test_dense_qwen3_config_counts_match_the_published_model():
    """Qwen3-14B's config.json (model_type qwen3: the MoE family's attention, q/k norms, no experts): 14,768,307,200
    parameters; the same fields with experts read as Qwen3 MoE."""
    cfg = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/models/qwen3-14b/config.json").read_text())
    spec = from_hf_config(cfg, "qwen3-14b")
    assert spec.params.total == 14_768_307_200 and spec.qk_norm and not spec.is_moe
    assert spec.mlp_types == (DENSE,) * 40 and spec.layer_types == (FULL_ATTENTION,) * 40
    moe = from_hf_config({**cfg, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 1024}, "qwen3-moe-like")
    assert moe.is_moe and moe.mlp_types == (MOE,) * 40


# (config.json under benchmarks/models, the model card's parameters and those outside the embedding tables, in
# billions to its own rounding)
MODEL_CARDS = (("qwen3-32b", 32.8, 31.2), ("qwen3-8b", 8.2, 6.95), ("qwen3-4b", 4.0, 3.6), ("qwen3-1.7b", 1.7, 1.4))


@pytest.mark.parametrize("name,total,outside", MODEL_CARDS)
def test_qwen3_config_counts_match_the_model_card(name, total, outside):
    """A Qwen3 config.json counts the model card's parameters, with one embedding table where it ties them."""
    cfg = json.loads((Path(__file__).resolve().parents[1] / f"benchmarks/models/{name}/config.json").read_text())
    spec = from_hf_config(cfg, name)
    embeddings = (1 if cfg["tie_word_embeddings"] else 2) * cfg["vocab_size"] * cfg["hidden_size"]
    digits = len(str(outside).split(".")[1])
    assert round(spec.params.total / 1e9, 1) == total
    assert round((spec.params.total - embeddings) / 1e9, digits) == outside


# --------------------------------------------------------------------------- config.json paths
def test_config_json_path_equals_catalog(tmp_path):
    d = tmp_path / "Qwen3-30B-A3B"
    d.mkdir()
    path = d / "config.json"
    shutil.copy(FIXTURES / "qwen3_30b_a3b_config.json", path)
    spec = load_model(str(path))
    assert spec.name == "Qwen3-30B-A3B"
    assert spec.params == load_model("qwen3-30b-a3b").params
    # a directory holding config.json works too
    assert load_model(str(d)).params == spec.params


def test_vlm_config_uses_text_config(tmp_path):
    path = tmp_path / "config.json"
    shutil.copy(FIXTURES / "qwen3_5_35b_a3b_config.json", path)
    spec = load_model(path)
    assert spec.model_type == "qwen3_5_moe"  # the checkpoint's (wrapper's) model_type
    assert spec.hidden_size == 2048 and spec.num_hidden_layers == 40
    assert spec.params == load_model("qwen3.5-35b-a3b").params


def test_from_hf_config_direct_and_sources():
    cfg = json.loads((FIXTURES / "qwen3_30b_a3b_config.json").read_text())
    spec = from_hf_config(cfg, name="mine", sources={"hidden_size": "my notes"})
    assert spec.name == "mine" and spec.sources == {"hidden_size": "my notes"}
    assert spec.qk_norm and spec.layer_types == (FULL_ATTENTION,) * 48


def test_mlp_only_layers_and_sparse_step():
    cfg = json.loads((FIXTURES / "qwen3_30b_a3b_config.json").read_text())
    cfg.update(mlp_only_layers=[0], decoder_sparse_step=2)
    spec = from_hf_config(cfg)
    assert spec.mlp_types[0] == DENSE and spec.mlp_types[1] == MOE and spec.mlp_types[2] == DENSE
    assert spec.params.layers[0].dense_mlp == 3 * 2048 * 6144


# --------------------------------------------------------------------------- errors
def test_malformed_json_names_file_and_position(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n}\n')
    with pytest.raises(ModelError) as e:
        load_model(str(path))
    msg = one_line_error(e)
    assert str(path) in msg and "line 3" in msg and "column" in msg


def test_unsupported_model_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
    with pytest.raises(ModelError) as e:
        load_model(str(path))
    msg = one_line_error(e)
    assert "unsupported model_type 'mamba'" in msg and "qwen3_moe" in msg and str(path) in msg


def test_missing_field_names_it(tmp_path):
    cfg = json.loads((FIXTURES / "qwen3_30b_a3b_config.json").read_text())
    del cfg["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelError) as e:
        load_model(str(path))
    msg = one_line_error(e)
    assert "'num_hidden_layers' is missing" in msg and str(path) in msg


def test_missing_field_in_text_config_is_named_with_prefix():
    cfg = json.loads((FIXTURES / "qwen3_5_35b_a3b_config.json").read_text())
    del cfg["text_config"]["linear_num_value_heads"]
    with pytest.raises(ModelError) as e:
        from_hf_config(cfg, origin="x.json")
    assert "text_config.linear_num_value_heads" in one_line_error(e)


@pytest.mark.parametrize("bad", [True, "2048", 2048.5, -1])
def test_ill_typed_field(bad):
    cfg = json.loads((FIXTURES / "qwen3_30b_a3b_config.json").read_text())
    cfg["hidden_size"] = bad
    with pytest.raises(ModelError) as e:
        from_hf_config(cfg, origin="cfg.json")
    msg = one_line_error(e)
    assert "cfg.json" in msg and "'hidden_size'" in msg


def test_layer_types_length_checked():
    cfg = json.loads((FIXTURES / "qwen3_5_35b_a3b_config.json").read_text())
    cfg["text_config"]["layer_types"] = cfg["text_config"]["layer_types"][:-1]
    with pytest.raises(ModelError) as e:
        from_hf_config(cfg)
    assert "layer_types" in one_line_error(e)


def test_unknown_name_lists_known_names():
    with pytest.raises(ModelError) as e:
        load_model("qwen9-1t")
    msg = one_line_error(e)
    assert "unknown model 'qwen9-1t'" in msg
    for name in EXPECTED_KEYS:
        assert name in msg


def test_missing_path():
    with pytest.raises(ModelError) as e:
        load_model("/no/such/dir/config.json")
    assert "no such file" in one_line_error(e)


def test_non_object_config():
    with pytest.raises(ModelError):
        from_hf_config([1, 2, 3])


# --------------------------------------------------------------------------- pipeline stages
def test_stage_layers_even_split():
    spec = load_model("qwen3.6-35b-a3b")
    assert spec.stage_layers(1) == (tuple(range(40)),)
    assert spec.stage_layers(2) == (tuple(range(20)), tuple(range(20, 40)))
    # vpp=2 over pp=2: chunks of 10; rank 0 holds chunks 0 and 2, rank 1 chunks 1 and 3.
    assert spec.stage_layers(2, 2) == (
        tuple(range(0, 10)) + tuple(range(20, 30)),
        tuple(range(10, 20)) + tuple(range(30, 40)),
    )
    ranks = spec.stage_layers(4, 5)
    assert ranks[3] == (6, 7, 14, 15, 22, 23, 30, 31, 38, 39)
    assert sorted(i for r in ranks for i in r) == list(range(40))
    assert stage_layers(40, 5) is stage_layers(40, 5)  # cached


@pytest.mark.parametrize("pp,vpp", [(3, 1), (4, 3), (0, 1), (2, 0)])
def test_stage_layers_rejects_uneven_or_invalid(pp, vpp):
    with pytest.raises(ModelError):
        load_model("qwen3.6-35b-a3b").stage_layers(pp, vpp)
