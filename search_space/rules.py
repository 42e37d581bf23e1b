"""Validity rules that depend on the model, the workload and the software stack.

Each rule reports which source enforces it: `megatron` (Megatron-LM's argument validation or
model construction), `slime` (slime's own launcher and data path), `stack` (a property of the
user's training image, e.g. whether DeepEP is installed), or `canonical` (attune-llm's own: Megatron
accepts the setting, but it is a no-op or equals another layout, e.g. recompute_num_layers above a
stage's layer count, so the search skips it). The Megatron cross-check test
(tests/test_megatron_crosscheck.py) compares the `megatron` rules with megatron-core's own checks.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost_model.nouns.batching import rows_per_microbatch, slime_bin_count
from cost_model.nouns.model_spec import MLA, ModelError, ModelSpec
from cost_model.nouns.workload import Workload
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.pipeline_layout import parse_stages
from cost_model.nouns.stack import Stack

MEGATRON, SLIME, STACK, CANONICAL = "megatron", "slime", "stack", "canonical"

# slime forces Megatron's --seq-length to a 4096 placeholder; Megatron then needs seq_length % (2 CP) == 0.
SLIME_PLACEHOLDER_SEQ_LENGTH = 4096


@dataclass(frozen=True)
class Violation:
    rule: str
    source: str
    message: str

    def __str__(self) -> str:
        return f"{self.message} [{self.source}: {self.rule}]"


def violations(layout: Layout, model: ModelSpec, workload: Workload, stack: Stack) -> list[Violation]:
    """Every rule the layout breaks for this model, workload and stack (empty: valid)."""
    return shape_violations(layout, model, workload, stack) + layout_violations(layout, model, workload, stack)


def shape_violations(layout: Layout, model: ModelSpec, workload: Workload, stack: Stack) -> list[Violation]:
    """The rules that read only the layout's parallel shape (TP, PP, VPP, CP, EP, ETP, the pipeline split): the
    same for every layout of one shape, so an enumeration asks them once per shape."""
    out: list[Violation] = []  # each group appends the rules it finds broken, in this order
    _attention_rules(out, layout, model, stack)
    _expert_rules(out, layout, model)
    _pipeline_rules(out, layout, model)
    if workload.framework == "slime":   # a Megatron-LM/Bridge run sets its own --seq-length
        _context_parallel_rules(out, layout)
        if model.has_linear_attention and layout.pipeline_model_parallel_layout is not None:
            # slime_plugins/models/qwen3_5.py and qwen3_next.py build the Gated DeltaNet models' layer specs and
            # assert config.pipeline_model_parallel_layout is None
            out.append(Violation("gdn_spec_no_layout_string", SLIME,
                                 f"slime's {model.display_name} layer spec (slime_plugins qwen3_5/qwen3_next) takes no "
                                 f"--pipeline-model-parallel-layout; use --decoder-first/last-pipeline-num-layers"))
    return out


def layout_violations(layout: Layout, model: ModelSpec, workload: Workload, stack: Stack) -> list[Violation]:
    """The other rules (recompute, dispatcher and offload, batching), after `shape_violations` in `violations`."""
    return template_violations(layout, model, stack, workload) + microbatch_violations(layout, workload)


def template_violations(layout: Layout, model: ModelSpec, stack: Stack, workload: Workload) -> list[Violation]:
    """The rules of recompute, dispatcher and offload: they read no micro-batch field, so the layouts of a shape
    that differ only in their micro-batch (Layout.with_microbatch) share them."""
    out: list[Violation] = []
    _recompute_rules(out, layout, model, workload)
    _feature_rules(out, layout, model, stack)
    return out


def microbatch_violations(layout: Layout, workload: Workload) -> list[Violation]:
    """The batching rules (those that read the micro-batch), after `template_violations` in `layout_violations`."""
    out: list[Violation] = []
    _batching_rules(out, layout, workload)
    return out


def _attention_rules(out: list[Violation], layout: Layout, model: ModelSpec, stack: Stack) -> None:
    """Attention heads and query groups against TP."""
    tp, heads, groups = layout.tp, model.num_attention_heads, model.num_key_value_heads
    if heads % tp:
        out.append(Violation("heads_divisible_by_tp", MEGATRON,
                             f"{heads} attention heads are not divisible by TP {tp}"))
    if model.count(MLA) == 0 and groups % tp and tp % groups:
        out.append(Violation("query_groups_vs_tp", MEGATRON,
                             f"{groups} query groups must be a multiple or a divisor of TP {tp}"))
    if model.attn_output_gate and groups % tp and not stack.output_gate_tp_fix:
        out.append(Violation("output_gate_tp", STACK,
                             f"the attention output gate needs TP {tp} to divide the {groups} query groups on a "
                             f"Megatron without the output-gate fix (pass --stack-fix output-gate-tp if your image "
                             f"has it)"))


def _expert_rules(out: list[Violation], layout: Layout, model: ModelSpec) -> None:
    """Expert parallelism (EP, ETP) against the model's experts."""
    tp, ep, etp = layout.tp, layout.ep, layout.etp
    if ep > 1 and not model.is_moe:
        out.append(Violation("ep_needs_experts", MEGATRON,
                             f"EP {ep} needs a mixture-of-experts model; {model.display_name} is dense"))
    if model.is_moe and model.num_experts % ep:
        out.append(Violation("experts_divisible_by_ep", MEGATRON,
                             f"{model.num_experts} experts are not divisible by EP {ep}"))
    if not model.is_moe and etp != tp:
        # Megatron ignores ETP without experts (beyond the expert-grid divisibility Layout checks).
        out.append(Violation("etp_dense", CANONICAL,
                             f"ETP {etp} must equal TP {tp} for a dense model (no expert grid)"))
    if model.is_moe and (model.mlp_bias or model.expert_bias) and etp != 1:
        # Megatron's --disable-bias-linear is global: biased MLPs mean biased experts
        # (megatron/core/transformer/transformer_config.py: "Bias in Moe is only supported when ETP==1").
        out.append(Violation("moe_bias_needs_etp1", MEGATRON,
                             f"{model.display_name}'s biased expert projections need ETP 1, got ETP {etp}"))


def _pipeline_rules(out: list[Violation], layout: Layout, model: ModelSpec) -> None:
    """The layers split over pipeline stages and virtual stages as Megatron splits them (evenly, or with
    the first and last stages' layers given: --decoder-first/last-pipeline-num-layers)."""
    layers, pp, vpp = model.num_hidden_layers, layout.pp, layout.vpp
    first, last = layout.decoder_first_pipeline_num_layers, layout.decoder_last_pipeline_num_layers
    if layout.split_set:
        try:
            layers_per_stage(layout, model)
        except ModelError as e:
            out.append(Violation("uneven_pipeline_split", MEGATRON, f"pipeline split {layout.label.split()[1]} of "
                                                                    f"{layers} layers: {e}"))
        return
    if layers % pp:
        out.append(Violation("layers_divisible_by_pp", MEGATRON, f"{layers} layers are not divisible by PP {pp}"
                                                                 f"{balanced_splits_hint(layers, pp, vpp)}"))
    elif vpp > 1 and (layers // pp) % vpp:
        out.append(Violation("stage_layers_divisible_by_vpp", MEGATRON,
                             f"{layers // pp} layers per pipeline stage are not divisible by VPP {vpp}"
                             f"{balanced_splits_hint(layers, pp, vpp)}"))


def _uniform_chunk_rule(out: list[Violation], layout: Layout, model: ModelSpec) -> None:
    """slime's image pins Megatron 1dcf0da, whose uniform recompute checkpoints layers [i, i + N) of each (virtual)
    pipeline chunk with no clamp (transformer_block._checkpointed_forward): a chunk whose layers N does not divide
    indexes past its last layer and fails at the first step (later Megatron, megatron/core/recompute.py, clamps)."""
    n = layout.recompute_num_layers
    try:
        sizes = sorted({c for row in model.layout_chunks(layout) for c in row if c})
    except ModelError:
        return   # the split itself is refused by _pipeline_rules
    bad = [c for c in sizes if c % n]
    if bad:
        out.append(Violation("uniform_recompute_divides_chunks", SLIME,
                             f"recompute_num_layers {n} (uniform) does not divide a pipeline chunk of "
                             f"{' or '.join(map(str, bad))} layers: slime's Megatron (1dcf0da) indexes past the "
                             f"chunk's last layer"))


def balanced_splits_hint(layers: int, pp: int, vpp: int) -> str:
    """The balanced splits the search space uses for these layers (search_space.pipeline_splits), as layout
    fields a user can add; or how Megatron would take an uneven split where there is none."""
    from search_space.pipeline_splits import accounting_splits, uneven_splits

    names = {"decoder_first_pipeline_num_layers": 0, "decoder_last_pipeline_num_layers": 1}
    options = [" ".join(f"{k}={split[i]}" for k, i in names.items() if split[i] is not None)
               for split in uneven_splits(layers, pp, vpp)]
    options += [" ".join(f"{k}=true" for k, on in (("account_for_embedding_in_pipeline_split", e),
                                                   ("account_for_loss_in_pipeline_split", l)) if on)
                for e, l in accounting_splits(layers, pp, vpp)]
    if not options:
        from cost_model.nouns.pipeline_layout import balanced_layout

        text = balanced_layout(layers, pp, vpp)
        if text:   # what the search space uses where neither divides (DeepSeek-V3's 61 over PP 8 x VPP 4)
            return f"; the balanced layout string the search space uses: pipeline_model_parallel_layout={text}"
        return " (an uneven split sets decoder_first/last_pipeline_num_layers; none balances these stages)"
    return f"; the balanced splits the search space uses: {' | '.join(options)}"


def layers_per_stage(layout: Layout, model: ModelSpec) -> list[int]:
    """Layers on each pipeline rank (ModelError where Megatron refuses the split)."""
    return [len(r) for r in model.layout_stage_layers(layout)]


def _context_parallel_rules(out: list[Violation], layout: Layout) -> None:
    """CP against the --seq-length placeholder slime passes to Megatron."""
    cp = layout.cp
    if SLIME_PLACEHOLDER_SEQ_LENGTH % (2 * cp):
        out.append(Violation("cp_divides_2048", SLIME,
                             f"CP {cp} must divide 2048: slime sets --seq-length {SLIME_PLACEHOLDER_SEQ_LENGTH}, "
                             f"and Megatron needs it divisible by 2 x CP = {2 * cp}"))


def _recompute_rules(out: list[Violation], layout: Layout, model: ModelSpec, workload: Workload) -> None:
    """Full recompute's layer count against a stage; selective modules against the model's layers."""
    layers, pp, vpp = model.num_hidden_layers, layout.pp, layout.vpp
    if layout.recompute_method == "uniform" and workload.framework == "slime":
        _uniform_chunk_rule(out, layout, model)
    if layout.recompute_granularity == "full":
        try:   # the largest virtual stage: Megatron clamps the count to each stage's layers
            stage_layers = max(layers_per_stage(layout, model)) // vpp
        except ModelError:
            stage_layers = layers // pp    # the split itself is refused by _pipeline_rules
        if layout.recompute_num_layers > max(stage_layers, 1):
            # Megatron since 1dcf0da clamps the count to the stage (megatron/core/recompute.py), so a larger
            # one is the same layout as recompute_num_layers = the stage's layer count (slime's pin fails on it
            # under uniform: _uniform_chunk_rule).
            out.append(Violation("recompute_num_layers", CANONICAL,
                                     f"recompute_num_layers {layout.recompute_num_layers} exceeds the {stage_layers} "
                                 f"layers of a (virtual) pipeline stage"))
    mods = layout.selective_modules
    if "mla_up_proj" in mods and model.count(MLA) == 0:
        out.append(Violation("mla_up_proj_needs_mla", MEGATRON, "recompute module mla_up_proj needs an MLA model"))
    if "moe_act" in mods and not model.is_moe:
        # Megatron: "moe_act in recompute_modules is only supported with moe_grouped_gemm".
        out.append(Violation("moe_recompute_needs_moe", MEGATRON,
                             f"recompute module moe_act needs a MoE model (--moe-grouped-gemm); {model.display_name} "
                             f"is dense"))
    if "moe" in mods and not model.is_moe:
        out.append(Violation("moe_layer_recompute_needs_moe", CANONICAL,
                             f"recompute module moe needs a MoE model; {model.display_name} is dense "
                             f"(it would be a no-op)"))
    if "shared_experts" in mods and model.shared_expert_intermediate_size == 0:
        out.append(Violation("shared_experts_recompute", CANONICAL,
                             f"recompute module shared_experts needs shared experts; {model.display_name} has none"))


def _feature_rules(out: list[Violation], layout: Layout, model: ModelSpec, stack: Stack) -> None:
    """The flex dispatcher and optimizer offload, against the model and the training image."""
    if layout.dispatcher == "flex" and not model.is_moe:
        # Megatron builds no token dispatcher without experts.
        out.append(Violation("flex_needs_moe", CANONICAL,
                             f"the flex dispatcher needs a MoE model; {model.display_name} is dense "
                             f"(it would be a no-op)"))
    if layout.dispatcher == "flex" and not stack.deepep:
        out.append(Violation("flex_needs_deepep", STACK, "the flex dispatcher needs DeepEP in the training image"))
    if layout.overlap_moe_expert_parallel_comm and layout.pipeline_model_parallel_layout is not None:
        mtp = "".join(parse_stages(layout.pipeline_model_parallel_layout)).count("m")
        if mtp > 1:
            out.append(Violation("ep_overlap_mtp", MEGATRON,
                                 f"overlap_moe_expert_parallel_comm supports at most one MTP layer, the layout string "
                                 f"places {mtp}"))
    if layout.offloaded and not (stack.precision_aware_optimizer or stack.offload_precision_aware):
        out.append(Violation("offload_needs_precision_aware", MEGATRON,
                             "optimizer CPU offload needs --use-precision-aware-optimizer"))


def _batching_rules(out: list[Violation], layout: Layout, workload: Workload) -> None:
    """slime's dynamic batching: bins of max_tokens_per_gpu x CP tokens; a row never splits across bins."""
    cp, dp, gbs = layout.cp, layout.dp, workload.global_batch
    rows = rows_per_microbatch(layout.max_tokens_per_gpu, cp, workload.seq_len)
    if layout.rows_per_microbatch != rows:
        out.append(Violation("rows_per_microbatch", SLIME,
                             f"rows_per_microbatch {layout.rows_per_microbatch} does not match max_tokens_per_gpu "
                             f"{layout.max_tokens_per_gpu} x CP {cp} / {workload.seq_len}-token rows = {rows}"))
    if cp > 1 and workload.seq_len % (2 * cp):   # CP 1 does not split rows
        out.append(Violation("row_divisible_by_2cp", SLIME,
                             f"{workload.seq_len}-token rows are not divisible by 2 x CP = {2 * cp} (zigzag CP split)"))
    if gbs < dp:
        out.append(Violation("global_batch_vs_dp", SLIME,
                             f"global batch {gbs} rows is smaller than DP {dp}: every DP rank needs a row"))
    elif gbs % dp:
        # slime passes --global-batch-size and --micro-batch-size 1 to Megatron, whose microbatch
        # calculator (built at start-up by slime) asserts GBS % (MBS x DP) == 0.
        out.append(Violation("global_batch_divisible_by_dp", MEGATRON,
                             f"global batch {gbs} rows is not divisible by DP {dp}"))
    elif layout.vpp > 1 and (bins := slime_bin_count(gbs, rows, dp * layout.pp)) > gbs:
        # slime's schedule raises its bin count to a multiple of DP x PP under VPP by splitting bins; a row never splits
        out.append(Violation("vpp_rows_per_step", SLIME,
                             f"the interleaved schedule needs {bins} micro-batches per step (a multiple of DP {dp} x "
                             f"PP {layout.pp} = {dp * layout.pp}) of at least a row each; global batch {gbs} rows"))
    if gbs >= dp and layout.rows_per_microbatch > gbs // dp:
        # slime accepts it, but a micro-batch can only pack the rows its rank gets: the layout would be
        # the one with the smaller micro-batch, costed as if it were bigger
        out.append(Violation("microbatch_within_rank_rows", CANONICAL,
                             f"rows_per_microbatch {layout.rows_per_microbatch} is more than the {gbs // dp} rows "
                             f"each DP rank gets per step (global batch {gbs} / DP {dp})"))


def check(layout: Layout, model: ModelSpec, workload: Workload, stack: Stack) -> None:
    """Raise InvalidLayout naming every broken rule."""
    found = violations(layout, model, workload, stack)
    if found:
        raise InvalidLayout(f"invalid layout {layout.label}: " + "; ".join(str(v) for v in found))
