"""Hugging Face config.json -> ModelSpec: one code path for the catalog and a user's own config.

Each supported architecture family reads its own fields (`_FAMILY_FIELDS`); errors are one-line
ModelErrors that name the file and the field. The catalog files are such configs plus an `_attune`
block (display name, hf_repo, sources).
"""
from __future__ import annotations

import math
from typing import Any

from cost_model.nouns.names import clean_name, shown
from cost_model.nouns.vision_spec import VisionSpec
from cost_model.nouns.model_spec import (DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MLA, MOE, SLIDING_ATTENTION,
                                         ModelError, ModelSpec)

# HF model_type -> architecture family handled by `from_hf_config`.
_FAMILIES = {
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
    "qwen3_5": "qwen3_5",         # dense Qwen3.5 (0.8B-27B): the same hybrid layers with a dense MLP
    "qwen3_5_text": "qwen3_5",
    "qwen3_next": "qwen3_5",      # same hybrid GDN + gated attention + shared-expert MoE layout
    "qwen3_moe": "qwen3_moe",
    "qwen3": "qwen3_moe",         # dense Qwen3 (0.6B-32B): the MoE family's attention with no experts
    "deepseek_v3": "deepseek",
    "deepseek_v2": "deepseek",    # DeepSeek-V2 / V2-Lite: V3's MLA and MoE layout, softmax routing without a bias
    "kimi_k2": "deepseek",        # Kimi-K2 ships DeepSeek-V3's architecture under its own type
    "gpt_oss": "gpt_oss",
    "glm4_moe": "glm4_moe",       # GLM-4.5 / 4.6 (slime's own models)
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",             # Qwen2 / Qwen2.5 dense
    "qwen2_moe": "qwen2",         # Qwen1.5-MoE / Qwen2-57B-A14B: Qwen2's attention, gated shared expert
}
SUPPORTED_MODEL_TYPES = tuple(sorted(_FAMILIES))
MISTRAL_DEFAULT_WINDOW = 4096   # transformers' MistralConfig.sliding_window
# Types that name a MoE model: a config of one without num_experts is refused, not read as dense (transformers
# would fill in its class default, 60 to 512 experts by type).
_MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "qwen3_moe", "qwen2_moe")


# ---------------------------------------------------------------------- typed field access
_MISSING = object()


# Bounds on what a config.json may say: far above every model trained today, low enough that the work
# to score a layout stays bounded (the cost model walks the layers).
MAX_LAYERS = 1024
MAX_FIELD = 1 << 24          # any size, count or dimension (vocabularies reach ~260k, hidden sizes ~20k)


class _Reader:
    """Typed access to a config dict, raising one-line ModelErrors that name the field."""

    def __init__(self, cfg: dict, origin: str, prefix: str = ""):
        self.cfg = cfg
        self.origin = origin
        self.prefix = prefix

    def _where(self, key: str) -> str:
        return f"{self.origin}: field '{self.prefix}{key}'"

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1, maximum: int = MAX_FIELD) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise ModelError(f"{self._where(key)} is missing")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelError(f"{self._where(key)} must be an integer, got {shown(value)}")
        if value < minimum:
            raise ModelError(f"{self._where(key)} must be >= {minimum}, got {value}")
        if value > maximum:
            raise ModelError(f"{self._where(key)} must be <= {maximum:,}, got {str(value)[:40]}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelError(f"{self._where(key)} must be true or false, got {shown(value)}")
        return value

    def float(self, key: str, default: float) -> float:
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelError(f"{self._where(key)} must be a number, got {shown(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ModelError(f"{self._where(key)} must be a finite number, got {str(value)[:40]}")
        return number

    def str_list(self, key: str, n: int, allowed: tuple[str, ...]) -> list[str] | None:
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ModelError(f"{self._where(key)} must be a list of strings")
        if len(value) != n:
            raise ModelError(f"{self._where(key)} has {len(value)} entries, expected num_hidden_layers={n}")
        bad = sorted({v for v in value if v not in allowed})
        if bad:
            raise ModelError(f"{self._where(key)} has unsupported entries {bad} (allowed: {list(allowed)})")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.cfg.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ModelError(f"{self._where(key)} must be a list of integers")
        return value


def _rope_factor(r: _Reader) -> float:
    """The rotary share of a head: top level or under rope_parameters, in (0, 1]."""
    reader = r
    if not r.has("partial_rotary_factor"):
        rope = r.cfg.get("rope_parameters")
        if not (isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None):
            return 1.0
        reader = _Reader(rope, r.origin, f"{r.prefix}rope_parameters.")
    factor = reader.float("partial_rotary_factor", 1.0)
    if not 0 < factor <= 1:
        raise ModelError(f"{reader._where('partial_rotary_factor')} must be in (0, 1], got {factor}")
    return factor


def _qwen_mlp_types(r: _Reader, n: int, num_experts: int) -> tuple[str, ...]:
    """Qwen MoE rule: layer i is MoE unless in mlp_only_layers, and when (i+1) % decoder_sparse_step == 0."""
    mlp_only = set(r.int_list("mlp_only_layers"))
    step = r.int("decoder_sparse_step", 1)
    return tuple(
        MOE if (num_experts > 0 and i not in mlp_only and (i + 1) % step == 0) else DENSE
        for i in range(n)
    )


def _pre_softmax(r: _Reader) -> bool:
    """Qwen's router: norm_topk_prob false (Qwen1.5/Qwen2-MoE) takes the top-k of a softmax over every expert without
    renormalising (Megatron's --moe-router-pre-softmax); true renormalises, as Megatron's default. Only a config that
    says false is read as such (the families' defaults differ)."""
    return r.has("norm_topk_prob") and not r.bool("norm_topk_prob", True)


def _qwen_experts(r: _Reader, num_experts: int) -> dict[str, Any]:
    """Qwen's MoE fields (Qwen2-MoE, Qwen3.5, Qwen3-Next): routed experts and one shared expert with a sigmoid gate."""
    # every release of these families has a shared expert: one left out is refused, not read as none
    shared = r.int("shared_expert_intermediate_size", minimum=0)
    return dict(num_experts=num_experts, num_experts_per_tok=r.int("num_experts_per_tok"),
                moe_intermediate_size=r.int("moe_intermediate_size"),
                shared_expert_intermediate_size=shared, shared_expert_gate=shared > 0,
                num_shared_experts=1 if shared else 0,
                router_pre_softmax=_pre_softmax(r))


def _shared_expert_moe(r: _Reader, num_experts: int, n_shared: int, router_bias: bool) -> dict[str, Any]:
    """DeepSeek's MoE fields (DeepSeek-V2/V3, Kimi-K2, Moonlight, GLM-4.5): routed experts and `n_shared` shared
    experts of the routed width."""
    moe = r.int("moe_intermediate_size")
    return dict(num_experts=num_experts, num_experts_per_tok=r.int("num_experts_per_tok"), moe_intermediate_size=moe,
                shared_expert_intermediate_size=n_shared * moe, num_shared_experts=n_shared, router_bias=router_bias)


# ---------------------------------------------------------------------- architecture families
# Each reads the fields of its family, in a fixed order (the first bad field is the one reported).
def _qwen_num_experts(r: _Reader) -> int:
    """num_experts of a Qwen config: required where its model_type is a MoE one (_MOE_TYPES), else 0 if absent."""
    if r.cfg.get("model_type") in _MOE_TYPES:
        return r.int("num_experts", minimum=0)
    return r.int("num_experts", 0, minimum=0)


def _qwen3_5(r: _Reader, n: int) -> dict[str, Any]:
    """Qwen3.5 / Qwen3-Next: Gated DeltaNet layers between gated softmax attention, shared-expert MoE."""
    num_experts = _qwen_num_experts(r)
    layer_types = r.str_list("layer_types", n, (FULL_ATTENTION, LINEAR_ATTENTION))
    if layer_types is None:
        interval = r.int("full_attention_interval", 4)
        layer_types = [LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(n)]
    mlp_types = _qwen_mlp_types(r, n, num_experts)
    has_gdn = LINEAR_ATTENTION in layer_types
    kw: dict[str, Any] = dict(
        layer_types=tuple(layer_types), mlp_types=mlp_types,
        intermediate_size=r.int("intermediate_size", 0, minimum=0),
        attn_output_gate=r.bool("attn_output_gate", True), qk_norm=True,
        linear_num_key_heads=r.int("linear_num_key_heads") if has_gdn else 0,
        linear_num_value_heads=r.int("linear_num_value_heads") if has_gdn else 0,
        linear_key_head_dim=r.int("linear_key_head_dim") if has_gdn else 0,
        linear_value_head_dim=r.int("linear_value_head_dim") if has_gdn else 0,
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim") if has_gdn else 0,
        num_nextn_predict_layers=r.int(
            "mtp_num_hidden_layers", r.int("num_nextn_predict_layers", 0, minimum=0), minimum=0),
    )
    if num_experts:
        kw.update(_qwen_experts(r, num_experts))
    return kw


def _qwen3_moe(r: _Reader, n: int) -> dict[str, Any]:
    """Qwen3 MoE: softmax attention with q/k norms, routed experts only (dense Qwen3 has none)."""
    num_experts = _qwen_num_experts(r)
    kw: dict[str, Any] = dict(
        layer_types=(FULL_ATTENTION,) * n, mlp_types=_qwen_mlp_types(r, n, num_experts),
        intermediate_size=r.int("intermediate_size", 0, minimum=0), qk_norm=True,
    )
    if num_experts:
        kw.update(num_experts=num_experts, num_experts_per_tok=r.int("num_experts_per_tok"),
                  moe_intermediate_size=r.int("moe_intermediate_size"),
                  router_pre_softmax=_pre_softmax(r))
    return kw


def _deepseek(r: _Reader, n: int) -> dict[str, Any]:
    """DeepSeek-V3 / Kimi-K2 / Moonlight: MLA, the first k layers dense, then MoE with shared experts."""
    num_experts = r.int("n_routed_experts", 0, minimum=0)
    first_dense = r.int("first_k_dense_replace", 0, minimum=0)
    freq = r.int("moe_layer_freq", 1)
    mlp_types = tuple(
        MOE if (num_experts and i >= first_dense and i % freq == 0) else DENSE for i in range(n))
    n_shared = r.int("n_shared_experts", 0, minimum=0)
    kw: dict[str, Any] = dict(
        layer_types=(MLA,) * n, mlp_types=mlp_types,
        intermediate_size=r.int("intermediate_size", 0, minimum=0),
        q_lora_rank=r.int("q_lora_rank", 0, minimum=0), kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
        num_nextn_predict_layers=r.int("num_nextn_predict_layers", 0, minimum=0),
    )
    kw["head_dim"] = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    if num_experts:
        # V3's e_score_correction_bias; V2 routes by softmax alone
        kw.update(_shared_expert_moe(r, num_experts, n_shared, router_bias=r.cfg.get("model_type") != "deepseek_v2"))
    return kw


def _gpt_oss(r: _Reader, n: int) -> dict[str, Any]:
    """GPT-OSS: sliding and full attention alternating, with sinks; biased experts and router."""
    layer_types = r.str_list("layer_types", n, (FULL_ATTENTION, SLIDING_ATTENTION))
    if layer_types is None:
        layer_types = [SLIDING_ATTENTION if (i + 1) % 2 else FULL_ATTENTION for i in range(n)]
    num_experts = r.int("num_local_experts") if r.has("num_local_experts") else r.int("num_experts")
    top_k = (r.int("num_experts_per_tok") if r.has("num_experts_per_tok")
             else r.int("experts_per_token"))
    inter = r.int("intermediate_size")
    return dict(
        layer_types=tuple(layer_types), mlp_types=(MOE,) * n,
        num_experts=num_experts, num_experts_per_tok=top_k, moe_intermediate_size=inter,
        attention_bias=r.bool("attention_bias", True), attention_sinks=True,
        expert_bias=True, router_bias=True,
        sliding_window=r.int("sliding_window", 0, minimum=0) if SLIDING_ATTENTION in layer_types else 0,
    )


def _mixtral(r: _Reader, n: int) -> dict[str, Any]:
    """Mixtral: Llama's attention (no q/k norms) with routed SwiGLU experts in every layer, no shared expert;
    Mistral's sliding window on every layer when the config sets one (Mixtral-8x7B/8x22B set null)."""
    window = r.int("sliding_window", 0, minimum=0)
    return dict(
        layer_types=((SLIDING_ATTENTION if window else FULL_ATTENTION),) * n, mlp_types=(MOE,) * n,
        sliding_window=window,
        num_experts=r.int("num_local_experts"), num_experts_per_tok=r.int("num_experts_per_tok"),
        moe_intermediate_size=r.int("intermediate_size"),
    )


def _llama(r: _Reader, n: int) -> dict[str, Any]:
    """Llama: dense softmax attention and SwiGLU MLP."""
    return dict(
        layer_types=(FULL_ATTENTION,) * n, mlp_types=(DENSE,) * n,
        intermediate_size=r.int("intermediate_size"), mlp_bias=r.bool("mlp_bias", False),
    )


def _mistral(r: _Reader, n: int) -> dict[str, Any]:
    """Mistral: Llama's dense layers, with a sliding window on every layer when the config sets one (7B v0.1 sets
    4096; v0.2/v0.3 set null). A config without the field has transformers' default for Mistral, 4096."""
    window = r.int("sliding_window", 0, minimum=0) if "sliding_window" in r.cfg else MISTRAL_DEFAULT_WINDOW
    return dict(
        layer_types=((SLIDING_ATTENTION if window else FULL_ATTENTION),) * n, mlp_types=(DENSE,) * n,
        sliding_window=window, intermediate_size=r.int("intermediate_size"),
    )


def _qwen2(r: _Reader, n: int) -> dict[str, Any]:
    """Qwen2 / Qwen2.5: Llama's layers with biases on q, k and v (always: the config has no field for them, and
    o_proj has none); a sliding window from layer max_window_layers on where use_sliding_window is set (no
    release sets it). qwen2_moe adds routed experts and a gated shared expert (Qwen's MoE layer rule)."""
    window = r.int("sliding_window", 0, minimum=0) if r.bool("use_sliding_window", False) else 0
    first_windowed = r.int("max_window_layers", n, minimum=0) if window else n
    num_experts = _qwen_num_experts(r) if r.cfg.get("model_type") == "qwen2_moe" else 0
    kw: dict[str, Any] = dict(
        layer_types=tuple(SLIDING_ATTENTION if i >= first_windowed else FULL_ATTENTION for i in range(n)),
        mlp_types=_qwen_mlp_types(r, n, num_experts), sliding_window=window,
        intermediate_size=r.int("intermediate_size", 0, minimum=0),
        attention_bias=True, attention_output_bias=False,
    )
    if num_experts:
        kw.update(_qwen_experts(r, num_experts))
    return kw


def _glm4_moe(r: _Reader, n: int) -> dict[str, Any]:
    """GLM-4.5 / 4.6: GQA softmax attention (biases on q, k and v where attention_bias, none on o_proj; q/k norms
    where use_qk_norm), the first k layers dense, then MoE with shared experts and a score-correction bias."""
    num_experts = r.int("n_routed_experts", 0, minimum=0)
    first_dense = r.int("first_k_dense_replace", 0, minimum=0)
    kw: dict[str, Any] = dict(
        layer_types=(FULL_ATTENTION,) * n,
        mlp_types=tuple(MOE if num_experts and i >= first_dense else DENSE for i in range(n)),
        intermediate_size=r.int("intermediate_size", 0, minimum=0),
        qk_norm=r.bool("use_qk_norm", False), attention_output_bias=False,
        num_nextn_predict_layers=r.int("num_nextn_predict_layers", 0, minimum=0),
    )
    if num_experts:
        kw.update(_shared_expert_moe(r, num_experts, r.int("n_shared_experts", 0, minimum=0), router_bias=True))
    return kw


_FAMILY_FIELDS = {"qwen3_5": _qwen3_5, "qwen3_moe": _qwen3_moe, "deepseek": _deepseek, "gpt_oss": _gpt_oss,
                  "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2,
                  "glm4_moe": _glm4_moe}


# ---------------------------------------------------------------------- a VLM's vision encoder
def _vision(config: dict, origin: str) -> VisionSpec | None:
    """The ViT of a Qwen-VL-style vision_config (depth, hidden_size, ...); None without one. Other encoders'
    configs (no 'depth') are not read: the model is then its language model only."""
    vc = config.get("vision_config")
    if vc is None:
        return None
    if not isinstance(vc, dict):
        raise ModelError(f"{origin}: field 'vision_config' must be an object")
    if vc.get("depth") is None:
        return None
    v = _Reader(vc, origin, "vision_config.")
    spec = VisionSpec(depth=v.int("depth"), hidden_size=v.int("hidden_size"),
                      intermediate_size=v.int("intermediate_size"), num_heads=v.int("num_heads"),
                      patch_size=v.int("patch_size"), out_hidden_size=v.int("out_hidden_size"),
                      spatial_merge_size=v.int("spatial_merge_size", 2),
                      temporal_patch_size=v.int("temporal_patch_size", 2), in_channels=v.int("in_channels", 3))
    if spec.hidden_size % spec.num_heads:
        raise ModelError(f"{origin}: field 'vision_config.hidden_size' {spec.hidden_size} is not divisible by "
                         f"num_heads {spec.num_heads}")
    return spec


# ---------------------------------------------------------------------- the config as a whole
def _text_model(config: dict, origin: str) -> tuple[dict, str]:
    """(the text model's fields, the prefix naming them in errors): a VLM wrapper's text_config merged
    over the wrapper, or the config itself."""
    text = config.get("text_config")
    if text is None:
        return config, ""
    if not isinstance(text, dict):
        raise ModelError(f"{origin}: field 'text_config' must be an object")
    # The text model's fields win; the wrapper supplies what the text config omits (tie_word_embeddings).
    cfg = {**{k: v for k, v in config.items() if k not in ("text_config", "vision_config")}, **text}
    if "model_type" not in text and isinstance(config.get("model_type"), str):
        cfg["model_type"] = config["model_type"]
    return cfg, "text_config."


def _family(config: dict, cfg: dict, prefix: str, origin: str) -> tuple[str, str]:
    """(the text model's model_type, its architecture family)."""
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ModelError(f"{origin}: field '{prefix}model_type' is missing")
    if not isinstance(model_type, str):
        raise ModelError(f"{origin}: field '{prefix}model_type' must be a string, got {shown(model_type)}")
    family = _FAMILIES.get(model_type)
    if family is None and prefix and isinstance(config.get("model_type"), str):
        family = _FAMILIES.get(config["model_type"])  # a text model_type we do not know, a wrapper we do
    if family is None:
        raise ModelError(f"{origin}: unsupported model_type {shown(model_type)} "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return model_type, family


def _rope_params(r: _Reader) -> _Reader:
    """The reader of the RoPE fields: the config's own, or its rope_parameters (newer configs)."""
    rope = r.cfg.get("rope_parameters")
    return _Reader(rope, r.origin, f"{r.prefix}rope_parameters.") if isinstance(rope, dict) else r


def _rope_scaling(r: _Reader) -> str:
    """"" (none), "llama3 F" (Llama 3.1's frequency scaling with Megatron's fixed low/high factors 1 and 4 and
    original length 8192), or another scaling's type (a launch of it is not built)."""
    scaling = r.cfg.get("rope_scaling")
    if scaling is None:
        scaling = r.cfg.get("rope_parameters")
    if not isinstance(scaling, dict):
        return ""
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    if kind == "default":
        return ""
    if kind == "llama3" and (scaling.get("low_freq_factor"), scaling.get("high_freq_factor"),
                             scaling.get("original_max_position_embeddings")) == (1, 4, 8192):
        factor = scaling.get("factor")
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor) and factor > 0:
            return f"llama3 {factor:g}"
    return clean_name(kind)[:40] or "unknown"


def _launch_fields(r: _Reader) -> dict[str, Any]:
    """What a launch needs and no cost reads (ModelSpec.LAUNCH_ONLY_FIELDS); 0 where the config does not say."""
    return dict(rope_theta=_rope_params(r).float("rope_theta", 0.0), norm_epsilon=r.float("rms_norm_eps", 0.0),
                rope_scaling=_rope_scaling(r))


def _common_fields(r: _Reader, config: dict, model_type: str) -> dict[str, Any]:
    """The fields every family has: sizes, vocabulary, tying, attention bias, rotary fraction, and what a launch
    needs (RoPE base and scaling, norm epsilon)."""
    h = r.int("hidden_size")
    n = r.int("num_hidden_layers", maximum=MAX_LAYERS)
    heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", heads)
    vocab = r.int("vocab_size")
    tie = r.bool("tie_word_embeddings", False)
    head_dim = r.int("head_dim", 0, minimum=0) or (h // heads)
    # The checkpoint's own model_type (the VLM wrapper's, e.g. qwen3_5_moe, when there is one).
    top_type = clean_name(config["model_type"]) if isinstance(config.get("model_type"), str) else model_type
    return dict(
        model_type=top_type, hidden_size=h, num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, tie_word_embeddings=tie,
        attention_bias=r.bool("attention_bias", False), partial_rotary_factor=_rope_factor(r),
        **_launch_fields(r),
    )


def _check_consistency(kw: dict[str, Any], family: str, origin: str, prefix: str) -> None:
    """The cross-field checks, once every field is read."""
    heads, kv_heads = kw["num_attention_heads"], kw["num_key_value_heads"]
    if family != "deepseek" and not kw["head_dim"]:
        raise ModelError(f"{origin}: hidden_size={kw['hidden_size']} over num_attention_heads={heads} leaves heads "
                         f"of 0 dimensions; give '{prefix}head_dim'")
    if family != "deepseek" and heads % kv_heads:
        raise ModelError(f"{origin}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if DENSE in kw["mlp_types"] and not kw.get("intermediate_size"):
        raise ModelError(f"{origin}: field '{prefix}intermediate_size' is missing (needed by its dense layers)")
    if kw.get("num_experts") and kw["num_experts_per_tok"] > kw["num_experts"]:
        raise ModelError(f"{origin}: num_experts_per_tok={kw['num_experts_per_tok']} exceeds "
                         f"the {kw['num_experts']} experts")


def from_hf_config(config: dict, name: str = "", sources: dict | None = None, *,
                   origin: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed Hugging Face config.json (text_config is used for VLM wrappers).

    An `_attune` block (display_name, hf_repo, sources), as the catalog files carry, is honoured.
    `origin` names the file in error messages (defaults to `name`).
    """
    origin = origin or name or "config"
    if not isinstance(config, dict):
        raise ModelError(f"{origin}: expected a JSON object at the top level, got {type(config).__name__}")
    attune = config.get("_attune") or {}
    if not isinstance(attune, dict):
        raise ModelError(f"{origin}: field '_attune' must be a mapping")
    cfg, prefix = _text_model(config, origin)
    r = _Reader(cfg, origin, prefix)
    model_type, family = _family(config, cfg, prefix, origin)
    kw = _common_fields(r, config, model_type)
    kw.update(_FAMILY_FIELDS[family](r, kw["num_hidden_layers"]))
    _check_consistency(kw, family, origin, prefix)
    kw["vision"] = _vision(config, origin)

    # names reach commands, comments, file names and the terminal: no control characters
    display = clean_name(attune.get("display_name") or name or model_type) or clean_name(model_type) or "model"
    hf_repo = clean_name(attune.get("hf_repo") or "")
    name = clean_name(name)
    sources_in = attune.get("sources") or {}
    if not isinstance(sources_in, dict):
        raise ModelError(f"{origin}: field '_attune.sources' must be a mapping")
    src = dict(sources_in)
    if sources:
        src.update(sources)
    return ModelSpec(name=name, display_name=str(display), hf_repo=str(hf_repo), sources=src, **kw)
