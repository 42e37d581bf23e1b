"""Model architectures: `ModelSpec`, its parameter counts, and loading the catalog or a config.json.

A `ModelSpec` is the normalised architecture the rest of attune-llm reads. It is
built from a Hugging Face config.json by `cost_model.nouns.hf_config.from_hf_config` (the
catalog stores exactly such configs, plus an `_attune` block with the display name and
sources), so a user's own config.json and the catalog take one code path.

Parameter counts are derived from the architecture, per layer and by sharding
class, because the memory model shards each class differently (Megatron's
convention: TP-sharded, replicated, routed experts over EP x ETP).

Counting conventions (what lands in which `LayerParams` field):

- `attention`: the TP-sharded attention projections. Softmax attention: q/k/v/o (q doubled by the
  Qwen3.5/Next output gate), their q/k/v biases, GPT-OSS sinks. MLA: q_b_proj (or q_proj without
  q_lora), kv_b_proj, o_proj. For MTP layers it also holds the eh_proj / fc projection (2h -> h).
- `linear_attention`: a whole Gated DeltaNet (HF Qwen3_5GatedDeltaNet: in_proj_qkv + in_proj_z +
  in_proj_b + in_proj_a (Qwen3-Next fuses them as in_proj_qkvz + in_proj_ba; same count), conv1d
  (no bias), dt_bias, A_log, gated RMSNorm over head_v_dim, out_proj). slime replicates it on every
  TP rank.
- `replicated`: RMSNorm weights (input/post-attention norms, q/k-norms, MLA q_a/kv_a layernorms),
  the router (num_experts x hidden, plus its bias / e_score_correction_bias), MLA's down projections
  q_a_proj and kv_a_proj_with_mqa (Megatron builds them as duplicated TELinear), o_proj's bias.
- `shared_expert`: SwiGLU shared expert(s) (3 matrices) plus the 1 x hidden shared_expert_gate.
- `routed_experts` / `active_routed`: all routed experts / the top-k of them (GPT-OSS: with biases).
- embedding, LM head (0 when tied) and the final norm sit in `ParamCounts`; MTP layers go to
  `ParamCounts.mtp` and are not part of `layers` or the totals (they share the embedding/head).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from cost_model.nouns.vision_spec import VisionSpec
from cost_model.nouns.user_file import check_regular_file, parse_json, parse_yaml, read_user_text
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown_name
from cost_model.nouns.pipeline_layout import InvalidPipelineLayout, stage_grid

# Layer kinds used in `ModelSpec.layer_types`.
FULL_ATTENTION = "full_attention"        # softmax attention (GQA/MHA), optional output gate
SLIDING_ATTENTION = "sliding_attention"  # softmax attention over a window (GPT-OSS)
LINEAR_ATTENTION = "linear_attention"    # Gated DeltaNet (Qwen3.5 / Qwen3-Next)
MLA = "mla"                              # multi-head latent attention (DeepSeek-V3, Moonlight)

# MLP kinds used in `ModelSpec.mlp_types`.
DENSE = "dense"
MOE = "moe"

CATALOG_DIR = Path(__file__).parents[1] / "catalog" / "models"


class ModelError(AttuneError, ValueError):
    """Unknown model, or a config.json that is malformed or of an unsupported architecture."""


@dataclass(frozen=True)
class LayerParams:
    """Parameter counts of one decoder layer, split by how Megatron shards them."""

    attention: int          # softmax/MLA projections (TP-sharded)
    linear_attention: int   # Gated DeltaNet projections, conv, gates (slime does not shard them)
    dense_mlp: int          # dense FFN (TP-sharded)
    shared_expert: int      # shared expert(s) incl. its gate weight (TP-sharded)
    routed_experts: int     # all routed experts of the layer (sharded over EP x ETP)
    active_routed: int      # the top-k experts a token passes through
    replicated: int         # norms, router, small gates: replicated on every rank

    @property
    def total(self) -> int:
        return (self.attention + self.linear_attention + self.dense_mlp + self.shared_expert
                + self.routed_experts + self.replicated)

    @property
    def active(self) -> int:
        return self.total - self.routed_experts + self.active_routed


@dataclass(frozen=True)
class ParamCounts:
    embedding: int                    # input embedding
    lm_head: int                      # output layer (0 when tied)
    final_norm: int
    layers: tuple[LayerParams, ...]
    mtp: tuple[LayerParams, ...] = ()  # multi-token-prediction layers (DeepSeek-V3), not trained by default

    # The sums are cached: predict reads the active count (MFU's N) for every layout it scores.
    @cached_property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.final_norm + sum(l.total for l in self.layers)

    @cached_property
    def active(self) -> int:
        return self.embedding + self.lm_head + self.final_norm + sum(l.active for l in self.layers)

    @property
    def active_non_embedding(self) -> int:
        """Active parameters per token without the input embedding: the N of MFU = 6 N tokens/s / peak."""
        return self.active - self.embedding

    @cached_property
    def routed_experts(self) -> int:
        """All routed-expert parameters (the part sharded over EP x ETP)."""
        return sum(l.routed_experts for l in self.layers)

    @property
    def non_expert(self) -> int:
        """Everything but the routed experts (embedding and head included)."""
        return self.total - self.routed_experts


# Fields added after architecture digests (tuner.model_identity) and profile layer signatures
# (cost_model.runner_components) were first recorded: written into either only where they differ from this
# default, so what was recorded before them still matches.
LATER_FIELD_DEFAULTS = {"attention_output_bias": True}

# Fields a launch's MODEL_ARGS need that change no figure: left out of architecture digests and layer signatures
# (two configs that differ only in them are priced and recorded alike).
LAUNCH_ONLY_FIELDS = frozenset({"rope_theta", "norm_epsilon", "rope_scaling", "router_pre_softmax"})


def at_later_default(name: str, value) -> bool:
    """Whether `name` is a field added later (LATER_FIELD_DEFAULTS) holding its default: left out of what is recorded."""
    return name in LATER_FIELD_DEFAULTS and value == LATER_FIELD_DEFAULTS[name]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, in Hugging Face config names where one exists."""

    name: str                       # catalog key, e.g. "qwen3.6-35b-a3b"
    display_name: str               # e.g. "Qwen3.6-35B-A3B"
    model_type: str                 # HF model_type, e.g. "qwen3_5_moe"
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]    # one of the layer kinds above, per layer
    mlp_types: tuple[str, ...]      # DENSE or MOE, per layer
    intermediate_size: int = 0      # dense FFN width (dense layers)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0   # total width of the shared expert(s)
    shared_expert_gate: bool = False
    attn_output_gate: bool = False             # Qwen3.5/Next gated attention (q_proj also yields the gate)
    attention_bias: bool = False
    # Gated DeltaNet
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # MLA
    q_lora_rank: int = 0            # 0: no query compression (Moonlight)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    num_nextn_predict_layers: int = 0          # MTP layers in the checkpoint
    hf_repo: str = ""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    # --- additions (all defaulted) ---
    qk_norm: bool = False                      # per-head RMSNorm on q and k (Qwen3 family)
    attention_sinks: bool = False              # learned per-head softmax sink (GPT-OSS)
    mlp_bias: bool = False                     # biases on dense/shared MLP projections (Llama mlp_bias)
    expert_bias: bool = False                  # biases on routed-expert projections (GPT-OSS)
    router_bias: bool = False                  # router bias (GPT-OSS) / e_score_correction_bias (DeepSeek-V3)
    num_shared_experts: int = 0                # DeepSeek n_shared_experts (1 for Qwen's single shared expert)
    partial_rotary_factor: float = 1.0         # fraction of head_dim that is rotated (RoPE)
    vision: VisionSpec | None = None           # a VLM's vision encoder (HF vision_config); None: text only
    attention_output_bias: bool = True         # with attention_bias, o_proj's bias too (GPT-OSS); Qwen2 and GLM
                                               # bias q, k and v only (Megatron's --add-qkv-bias)
    # --- what a launch needs and no cost reads (LAUNCH_ONLY_FIELDS); 0 / "": the config did not say
    rope_theta: float = 0.0                    # RoPE base (--rotary-base)
    norm_epsilon: float = 0.0                  # RMSNorm epsilon (--norm-epsilon)
    rope_scaling: str = ""                     # "": none; "llama3 F": Llama 3.1's (Megatron's --use-rope-scaling);
                                               # any other: its rope_type, which Megatron's GPT arguments do not take
    router_pre_softmax: bool = False           # softmax over every expert before the top-k, not renormalised
                                               # (Qwen2-MoE's norm_topk_prob false: --moe-router-pre-softmax)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def has_linear_attention(self) -> bool:
        """Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next)."""
        return LINEAR_ATTENTION in self.layer_types

    @property
    def num_moe_layers(self) -> int:
        return self.mlp_types.count(MOE)

    @property
    def has_moe_layers(self) -> bool:
        """Whether any layer built routes tokens to experts: a MoE model cut to its first layers may build only its
        dense ones (GLM-4.5-Air at 1 layer), and then allocates no routing-dependent sizes."""
        return MOE in self.mlp_types

    def count(self, layer_type: str) -> int:
        # tuple.count (in C): the validity rules ask it of every layout of a space
        return self.layer_types.count(layer_type)

    @property
    def mtp_layer_type(self) -> str:
        """Attention kind of the MTP layer(s): MLA for DeepSeek, else full softmax attention."""
        return MLA if MLA in self.layer_types else FULL_ATTENTION

    def stage_layers(self, pp: int, vpp: int = 1, first: int | None = None, last: int | None = None,
                     embedding: bool = False, loss: bool = False,
                     pipeline_layout: str | None = None) -> tuple[tuple[int, ...], ...]:
        """Layer indices held by each pipeline rank (Megatron's split, interleaved with vpp; `first`/`last`:
        --decoder-first/last-pipeline-num-layers; `embedding`/`loss`: --account-for-*-in-pipeline-split;
        `pipeline_layout`: --pipeline-model-parallel-layout)."""
        if pipeline_layout is None:
            return stage_layers(self.num_hidden_layers, pp, vpp, first, last, embedding, loss)
        _string_alone(self.num_hidden_layers, pp, vpp, first, last, embedding, loss)
        return layout_string_stage_layers(pipeline_layout, self.num_hidden_layers, pp, vpp,
                                          self.num_nextn_predict_layers)

    def layout_chunks(self, layout) -> tuple[tuple[int, ...], ...]:
        """The decoder layers of each (virtual stage, rank) of a Layout: vpp rows of pp counts (ModelError where
        Megatron refuses the split)."""
        split = (layout.decoder_first_pipeline_num_layers, layout.decoder_last_pipeline_num_layers,
                 layout.account_for_embedding_in_pipeline_split, layout.account_for_loss_in_pipeline_split)
        if layout.pipeline_model_parallel_layout is None:
            return stage_chunks(self.num_hidden_layers, layout.pp, layout.vpp, *split)
        _string_alone(self.num_hidden_layers, layout.pp, layout.vpp, *split)
        return layout_string_chunks(layout.pipeline_model_parallel_layout, self.num_hidden_layers, layout.pp,
                                    layout.vpp, self.num_nextn_predict_layers)

    def layout_stage_layers(self, layout) -> tuple[tuple[int, ...], ...]:
        """stage_layers for a Layout's pipeline fields."""
        return self.stage_layers(layout.pp, layout.vpp, layout.decoder_first_pipeline_num_layers,
                                 layout.decoder_last_pipeline_num_layers,
                                 layout.account_for_embedding_in_pipeline_split,
                                 layout.account_for_loss_in_pipeline_split, layout.pipeline_model_parallel_layout)

    @cached_property
    def params(self) -> ParamCounts:
        """Parameter counts derived from the architecture."""
        h = self.hidden_size
        memo: dict[tuple[str, str], LayerParams] = {}
        for key in zip(self.layer_types, self.mlp_types):
            if key not in memo:
                memo[key] = self._layer_params(*key)
        layers = tuple(memo[key] for key in zip(self.layer_types, self.mlp_types))
        mtp: tuple[LayerParams, ...] = ()
        if self.num_nextn_predict_layers:
            base = self._layer_params(self.mtp_layer_type, MOE if self.is_moe else DENSE)
            # eh_proj / fc (2h -> h, TP-sharded) and three extra norms (enorm, hnorm, final norm).
            one = LayerParams(
                attention=base.attention + 2 * h * h,
                linear_attention=base.linear_attention,
                dense_mlp=base.dense_mlp,
                shared_expert=base.shared_expert,
                routed_experts=base.routed_experts,
                active_routed=base.active_routed,
                replicated=base.replicated + 3 * h,
            )
            mtp = (one,) * self.num_nextn_predict_layers
        return ParamCounts(
            embedding=self.vocab_size * h,
            lm_head=0 if self.tie_word_embeddings else self.vocab_size * h,
            final_norm=h,
            layers=layers,
            mtp=mtp,
        )

    # ------------------------------------------------------------------ per-layer counts
    def layer_params(self, layer_type: str, mlp_type: str) -> LayerParams:
        """Parameter counts of one decoder layer of this kind."""
        return self._layer_params(layer_type, mlp_type)

    def _layer_params(self, layer_type: str, mlp_type: str) -> LayerParams:
        attn, gdn, attn_repl = self._attention(layer_type)
        dense, shared, routed, active, mlp_repl = self._mlp(mlp_type)
        norms = 2 * self.hidden_size  # input_layernorm + post_attention_layernorm
        return LayerParams(
            attention=attn,
            linear_attention=gdn,
            dense_mlp=dense,
            shared_expert=shared,
            routed_experts=routed,
            active_routed=active,
            replicated=attn_repl + mlp_repl + norms,
        )

    def _attention(self, layer_type: str) -> tuple[int, int, int]:
        """(TP-sharded attention, GDN, replicated) parameters of the token mixer."""
        h = self.hidden_size
        if layer_type == LINEAR_ATTENTION:
            kd = self.linear_num_key_heads * self.linear_key_head_dim
            vd = self.linear_num_value_heads * self.linear_value_head_dim
            nv = self.linear_num_value_heads
            conv_dim = 2 * kd + vd
            gdn = (h * conv_dim            # in_proj_qkv
                   + h * vd                # in_proj_z
                   + 2 * h * nv            # in_proj_b, in_proj_a
                   + conv_dim * self.linear_conv_kernel_dim  # depthwise conv1d, no bias
                   + 2 * nv                # dt_bias, A_log
                   + self.linear_value_head_dim  # gated RMSNorm
                   + vd * h)               # out_proj
            return 0, gdn, 0
        if layer_type == MLA:
            n = self.num_attention_heads
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            sharded = 0
            replicated = 0
            if self.q_lora_rank:
                replicated += h * self.q_lora_rank + self.q_lora_rank   # q_a_proj + q_a_layernorm
                sharded += self.q_lora_rank * n * qk                    # q_b_proj
            else:
                sharded += h * n * qk                                   # q_proj
            replicated += h * (self.kv_lora_rank + self.qk_rope_head_dim)  # kv_a_proj_with_mqa
            replicated += self.kv_lora_rank                               # kv_a_layernorm
            sharded += self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)  # kv_b_proj
            sharded += n * self.v_head_dim * h                            # o_proj
            if self.attention_bias and self.attention_output_bias:
                replicated += h                                           # o_proj bias
            return sharded, 0, replicated
        if layer_type in (FULL_ATTENTION, SLIDING_ATTENTION):
            q_out = self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
            kv_out = 2 * self.num_key_value_heads * self.head_dim
            o_in = self.num_attention_heads * self.head_dim
            sharded = h * q_out + h * kv_out + o_in * h
            replicated = 0
            if self.attention_bias:
                sharded += q_out + kv_out
                replicated += h if self.attention_output_bias else 0      # o_proj bias
            if self.attention_sinks:
                sharded += self.num_attention_heads
            if self.qk_norm:
                replicated += 2 * self.head_dim
            return sharded, 0, replicated
        raise ModelError(f"{self.name or 'model'}: unknown layer type {layer_type!r}")

    def _mlp(self, mlp_type: str) -> tuple[int, int, int, int, int]:
        """(dense, shared, routed, active routed, replicated) parameters of the MLP."""
        h = self.hidden_size
        if mlp_type == DENSE:
            i = self.intermediate_size
            dense = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
            return dense, 0, 0, 0, 0
        if mlp_type != MOE:
            raise ModelError(f"{self.name or 'model'}: unknown MLP type {mlp_type!r}")
        i = self.moe_intermediate_size
        per_expert = 3 * h * i + ((2 * i + h) if self.expert_bias else 0)
        routed = self.num_experts * per_expert
        active = self.num_experts_per_tok * per_expert
        shared = 0
        if self.shared_expert_intermediate_size:
            s = self.shared_expert_intermediate_size
            shared = 3 * h * s + ((2 * s + h) if self.mlp_bias else 0)
            if self.shared_expert_gate:
                shared += h
        router = self.num_experts * h + (self.num_experts if self.router_bias else 0)
        return 0, shared, routed, active, router


# ---------------------------------------------------------------------- pipeline stages
def _check_counts(pp, vpp, num_layers) -> None:
    for label, value in (("pp", pp), ("vpp", vpp), ("num_layers", num_layers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{label} must be a positive integer, got {value!r}")


def _string_alone(num_layers: int, pp: int, vpp: int, first, last, embedding, loss) -> None:
    """A layout string spells the split out: Megatron takes no other split field beside it (the counts checked
    first)."""
    _check_counts(pp, vpp, num_layers)
    if first is not None or last is not None or embedding or loss:
        raise ModelError("a pipeline layout string and the first/last or embedding/loss split cannot be set "
                         "together")


@lru_cache(maxsize=1024)
def layout_string_stage_layers(pipeline_layout: str, num_layers: int, pp: int, vpp: int = 1,
                               mtp_layers: int = 0) -> tuple[tuple[int, ...], ...]:
    """`stage_layers` where --pipeline-model-parallel-layout spells every virtual stage out (`mtp_layers`: the
    model's MTP depth, which its m's may not exceed). Raises ModelError where Megatron would refuse it."""
    return _ranks_of(layout_string_chunks(pipeline_layout, num_layers, pp, vpp, mtp_layers), pp, vpp)


@lru_cache(maxsize=1024)
def layout_string_chunks(pipeline_layout: str, num_layers: int, pp: int, vpp: int = 1,
                         mtp_layers: int = 0) -> tuple[tuple[int, ...], ...]:
    """The decoder layers ('t') of each (virtual stage, rank) the layout string spells out: vpp rows of pp counts.
    Raises ModelError where Megatron would refuse it."""
    _check_counts(pp, vpp, num_layers)
    try:
        grid = stage_grid(pipeline_layout, pp, num_layers, mtp_layers)
    except InvalidPipelineLayout as e:
        raise ModelError(str(e)) from None
    if len(grid) != vpp:
        raise ModelError(f"pipeline layout '{pipeline_layout}' has {len(grid) * pp} stages; PP {pp} x VPP {vpp} "
                         f"needs {pp * vpp}")
    return tuple(tuple(stage.count("t") for stage in row) for row in grid)


@lru_cache(maxsize=1024)
def stage_layers(num_layers: int, pp: int, vpp: int = 1, first: int | None = None,
                 last: int | None = None, embedding: bool = False, loss: bool = False) -> tuple[tuple[int, ...], ...]:
    """Layer indices per pipeline rank for `num_layers` layers, `pp` ranks and `vpp` virtual stages.

    Megatron's split (megatron-core transformer_layer.get_transformer_layer_offset and
    transformer_block.get_num_layers_to_build): the first and last ranks hold `first` and `last` layers when
    set, the other (middle) ranks share the rest evenly; or, with `embedding`/`loss`, the embedding and the
    loss each take one layer's place in the first/last virtual stage. Each rank's layers are cut into `vpp`
    equal chunks, and virtual stage v runs chunk v of every rank in rank order. A pipeline layout string spells
    every virtual stage out instead (`layout_string_stage_layers`). Raises ModelError where Megatron's
    TransformerConfig would refuse the split.
    """
    return _ranks_of(stage_chunks(num_layers, pp, vpp, first, last, embedding, loss), pp, vpp)


@lru_cache(maxsize=1024)
def stage_chunks(num_layers: int, pp: int, vpp: int = 1, first: int | None = None, last: int | None = None,
                 embedding: bool = False, loss: bool = False) -> tuple[tuple[int, ...], ...]:
    """The layers of each (virtual stage, rank) of `stage_layers`' split: vpp rows of pp counts."""
    _check_counts(pp, vpp, num_layers)
    if (embedding or loss) and (first is not None or last is not None):
        raise ModelError("an uneven first/last split and the embedding/loss accounting cannot be set together")
    elif embedding or loss:
        if pp == 1:
            raise ModelError("the embedding/loss accounting needs PP > 1")
        slots = num_layers + embedding + loss
        if slots % pp or (slots // pp) % vpp:
            raise ModelError(f"{num_layers} layers + {int(embedding) + int(loss)} (embedding/loss) = {slots} are not "
                             f"divisible by PP {pp} x VPP {vpp}")
        size = slots // pp // vpp
        chunks = [[size] * pp for _ in range(vpp)]
        chunks[0][0] -= embedding
        chunks[-1][-1] -= loss
    else:
        per_rank = _layers_per_rank(num_layers, pp, vpp, first, last)
        chunks = [[n // vpp for n in per_rank] for _ in range(vpp)]
    return tuple(tuple(row) for row in chunks)


def _ranks_of(chunks: list[list[int]], pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Each rank's layer indices from the layers of each (virtual stage, rank), numbered in running order."""
    ranks: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for v in range(vpp):
        for r in range(pp):
            ranks[r].extend(range(start, start + chunks[v][r]))
            start += chunks[v][r]
    return tuple(tuple(r) for r in ranks)


def _layers_per_rank(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """Layers on each pipeline rank, with the checks of megatron-core's TransformerConfig (uneven PP)."""
    ends = [x for x in (first, last) if x is not None]
    if pp == 1 and ends:
        raise ModelError("an uneven pipeline split needs PP > 1")
    for label, value in (("first", first), ("last", last)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelError(f"layers in the {label} pipeline stage must be a positive integer, got {value!r}")
        if value is not None and value % vpp:
            raise ModelError(f"{value} layers in the {label} pipeline stage are not divisible by VPP {vpp}")
    middle_layers, middle_ranks = num_layers - sum(ends), pp - len(ends)
    if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
        raise ModelError(f"{num_layers} layers: {middle_layers} left for {middle_ranks} middle pipeline stages "
                         f"after first {first} and last {last}")
    if middle_ranks and middle_layers % middle_ranks:
        what = f"{middle_layers} middle layers are" if ends else f"{num_layers} layers are"
        raise ModelError(f"{what} not divisible by {middle_ranks} {'middle ' if ends else ''}pipeline stages"
                         + ("" if ends else f" (PP {pp})"))
    middle = middle_layers // middle_ranks if middle_ranks else 0
    if middle_ranks and middle % vpp:
        raise ModelError(f"{middle} layers per {'middle ' if ends else ''}pipeline stage are not divisible by "
                         f"VPP {vpp}")
    per_rank = [middle] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return per_rank


# ---------------------------------------------------------------------- loading
def catalog_names() -> list[str]:
    """The catalog keys (file names under catalog/models without .yaml), sorted."""
    if not CATALOG_DIR.is_dir():
        return []
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


@lru_cache(maxsize=1)
def _catalog_keys() -> frozenset[str]:
    """The catalog keys, read once on first use (the catalog ships with the package)."""
    return frozenset(catalog_names())


def _read_yaml(path: Path) -> Any:
    return parse_yaml(read_user_text(path, ModelError, "model file"), str(path), ModelError)


def _read_json(path: Path) -> Any:
    return parse_json(read_user_text(path, ModelError, "config.json"), str(path), ModelError)


def _from_hf_config(data: Any, name: str, origin: str) -> ModelSpec:
    # cost_model.nouns.hf_config builds ModelSpecs, so it imports this module: import it on first load.
    from cost_model.nouns.hf_config import from_hf_config
    return from_hf_config(data, name=name, origin=origin)


@lru_cache(maxsize=64)
def _load_catalog(key: str) -> ModelSpec:
    path = CATALOG_DIR / f"{key}.yaml"
    data = _read_yaml(path)
    return _from_hf_config(data, name=key, origin=str(path))


@lru_cache(maxsize=64)
def _load_path(path: Path, mtime_ns: int) -> ModelSpec:
    data = _read_yaml(path) if path.suffix in (".yaml", ".yml") else _read_json(path)
    return _from_hf_config(data, name=_name_of_path(path), origin=str(path))


def _name_of_path(path: Path) -> str:
    """A config.json's model name: its folder's; in the Hugging Face cache (models--ORG--NAME/snapshots/REVISION/),
    the repository's NAME, not the revision hash; another file's stem."""
    if path.name != "config.json" or not path.parent.name:
        return path.stem
    repo = path.parent.parent.parent.name
    if path.parent.parent.name == "snapshots" and repo.startswith("models--") and repo.count("--") >= 2:
        return repo.split("--", 2)[2]
    return path.parent.name


def _short(text: str) -> str:
    """A name or path for an error message, cut short."""
    return text if len(text) <= 200 else text[:197] + "..."


def load_model(name_or_path: str | os.PathLike) -> ModelSpec:
    """A catalog name (see `catalog_names()`) or a path to a Hugging Face config.json."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ModelError(f"model must be a catalog name or a path, got {type(name_or_path).__name__}")
    text = os.fspath(name_or_path).strip()
    if not text:
        raise ModelError(f"empty model name; known: {', '.join(catalog_names())}")
    if "\x00" in text:   # no path holds one; Path would raise ValueError on it
        raise ModelError(f"{_short(text)!r}: not a catalog name or a path (NUL byte)")
    key = text.lower()
    if isinstance(name_or_path, str) and key in _catalog_keys():
        return _load_catalog(key)
    path = Path(text).expanduser()
    try:
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise ModelError(f"{path.parent}: directory has no config.json")
        if path.exists():
            resolved = check_regular_file(path, ModelError, "config.json").resolve()
            return _load_path(resolved, resolved.stat().st_mtime_ns)
    except OSError as e:   # a name too long, a folder we may not enter
        raise ModelError(f"{_short(text)}: cannot read: {e.strerror or type(e).__name__}") from None
    if os.sep in text or "/" in text or path.suffix in (".json", ".yaml", ".yml"):
        raise ModelError(f"{_short(text)}: no such file")
    raise ModelError(f"unknown model {shown_name(text)}; known: {', '.join(catalog_names())} "
                     f"(or pass a path to a config.json)")
