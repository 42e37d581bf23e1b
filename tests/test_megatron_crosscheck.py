"""Our Megatron rules against megatron-core's own checks, on hundreds of layouts.

For every case (a model, a layout given as raw parameters, a global batch, with or without
--use-precision-aware-optimizer) the test computes two verdicts:

- ours: the Layout constructor (an InvalidLayout counts as a rejection) and the rules of
  `search_space.rules.violations` whose source is `megatron`, plus `cp_divides_2048` (tagged slime,
  but Megatron enforces it because slime's argv carries --seq-length 4096) and `global_batch_vs_dp`
  (tagged slime; 0 < GBS < DP also breaks Megatron's GBS % DP check);
- Megatron's: `tests/megatron_validate.validate` on the argv our mapping produces
  (`search_space.megatron_args`: model_args + parallel/recompute/batch/offload/dispatcher args) plus
  the workload as slime passes it: --seq-length 4096 --max-position-embeddings 4096
  --micro-batch-size 1 --global-batch-size GBS --bf16 --use-distributed-optimizer
  [--use-precision-aware-optimizer].

They must agree on every case. Rules tagged `slime`, `stack` and `canonical` are not compared.

Where Megatron (megatron-core 0.19.2) enforces each of our rules (stage names of megatron_validate):

  rule (ours)                          Megatron stage   Megatron source
  Layout: world % (TP*PP*CP)           validate_args    training/arguments.py "world size ... is not divisible by total_model_size"
  Layout: world % (ETP*EP*PP)          parallel_state   core/parallel_state.py initialize_model_parallel (expert grid)
  Layout: VPP needs PP > 1             validate_args    "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1"
  Layout: full needs method            config           transformer_config.py "recompute_method must be block or uniform"
  Layout: full needs num_layers        config           transformer_config.py "recompute_num_layers must be between 1 and ..."
  Layout: selective takes no method    validate_args    "recompute method is not yet supported for selective recomputing granularity"
  Layout: selective takes no num_layers config          transformer_config.py "recompute_num_layers must be None"
  Layout: unknown recompute module     config           transformer_config.py "Invalid choices for recompute_modules" (gdn_norm_out:
                                                        "only supported with experimental_attention_variant='gated_delta_net'")
  Layout: flex needs EP*ETP > 1        dispatcher       moe/token_dispatcher.py MoEFlexTokenDispatcher "DeepEP dispatcher requires TPxEP > 1"
  Layout: EP overlap needs EP > 1,     config           transformer_config.py "overlap_moe_expert_parallel_comm is only supported
    no full/moe recompute, VPP if PP>1                  with expert model parallelism", "disable full recomputation ...", "disable
                                                        moe in recompute_modules ...", "virtual_pipeline_model_parallel_size must
                                                        be specified when pipeline_model_parallel_size > 1"
  heads_divisible_by_tp                config           transformer_config.py "num_attention_heads ... must be a multiple of tensor_model_parallel_size"
  query_groups_vs_tp                   config           transformer_config.py "num_query_groups ... must be a multiple or divisor of ..."
  ep_needs_experts                     validate_args    "num_experts must be non None to use expert model parallelism"
  experts_divisible_by_ep              validate_args    "Number of experts should be a multiple of expert model parallel_size"
  moe_bias_needs_etp1                  config           transformer_config.py "Bias in Moe is only supported when ETP==1"
  layers_divisible_by_pp               validate_args    "Number of layers should be divisible by the pipeline-model-parallel size"
                                                        (without VPP); with VPP: layer_split, transformer_block.py get_num_layers_to_build
  stage_layers_divisible_by_vpp        layer_split      transformer_block.py get_num_layers_to_build "should be divisible by vp_size"
  uneven_pipeline_split                config           transformer_config.py (Uneven PP) "number of layers at middle stage ...
                                                        must be divisible by the middle pipeline model parallel size"
  Layout: uneven split vs VPP          config           transformer_config.py "number of layers at first stage ... must be
                                                        divisible by virtual pipeline parallel degree"
  cp_divides_2048                      validate_args    "seq-length should be a multiple of 2 * context-parallel-size"
  mla_up_proj_needs_mla                config           transformer_config.py "mla_up_proj in recompute_modules is only supported with multi_latent_attention"
  moe_recompute_needs_moe (moe_act)    config           transformer_config.py "moe_act in recompute_modules is only supported with moe_grouped_gemm"
  offload_needs_precision_aware        validate_args    "The optimizer cpu offload must be used in conjunction with --use-precision-aware-optimizer"
  global_batch_divisible_by_dp         validate_args    "eval_global_batch_size ... must be divisible by eval_micro_batch_size * data_parallel_size"
  (and global_batch_vs_dp)                              (and num_microbatches_calculator.py, which slime builds at start-up)

Settings we reject but Megatron accepts, on purpose (`canonical`: a no-op or a duplicate of another
layout; the test checks that Megatron does accept them, so a stricter Megatron would show up):
rules etp_dense, recompute_num_layers (megatron/core/recompute.py clamps the count to the stage),
moe_layer_recompute_needs_moe, shared_experts_recompute, flex_needs_moe; and the Layout checks
`canonical_form` lists (recompute fields without a granularity, recompute_modules with full recompute,
a repeated module, overlap_d2h_h2d without offload, an offload fraction above 1, flex for a dense
model). A case that breaks only those is compared in its canonical form, which Megatron must accept.

The test must not be skipped: megatron-core and torch come with the `test` extra. If they do not
import, the tests fail.
"""
from __future__ import annotations

import dataclasses
import inspect
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

import megatron_validate
from cost_model.nouns.model_spec import ModelSpec, load_model
from cost_model.nouns.workload import Workload
from search_space import rules
from cost_model.nouns.layout import InvalidLayout, Layout
from search_space.megatron_args import (
    batch_args,
    dispatcher_args,
    model_args,
    offload_args,
    parallel_args,
    recompute_args,
)
from search_space.enumerate import divisors
from search_space.rules import MEGATRON, violations
from cost_model.nouns.stack import Stack

pytestmark = [pytest.mark.torch, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")]

SEQ_LENGTH = rules.SLIME_PLACEHOLDER_SEQ_LENGTH
MODELS = ("qwen3.6-35b-a3b", "qwen3-30b-a3b", "deepseek-v3", "moonlight-16b-a3b", "llama3-8b",
          "gpt-oss-20b", "qwen3-next-80b-a3b")
WORLDS = (4, 8, 16, 24, 32, 64)
RANDOM_CASES_PER_MODEL_AND_WORLD = 14
MIN_CASES = 200

# slime-tagged rules Megatron also enforces with slime's argv (see the module docstring).
ALSO_COMPARED = {"cp_divides_2048", "global_batch_vs_dp"}

# Our rule -> the megatron_validate stages allowed to reject a case that breaks only that rule.
WHERE = {
    "layout:world_vs_tp_pp_cp": {"validate_args"},
    "layout:expert_grid": {"parallel_state"},
    "layout:vpp_needs_pp": {"validate_args"},
    "layout:full_needs_method": {"config"},
    "layout:full_needs_num_layers": {"config"},
    "layout:selective_method_or_num_layers": {"validate_args", "config"},
    "layout:unknown_recompute_module": {"config"},
    "layout:flex_needs_ep_etp": {"dispatcher"},
    "heads_divisible_by_tp": {"config"},
    "query_groups_vs_tp": {"config"},
    "ep_needs_experts": {"validate_args"},
    "experts_divisible_by_ep": {"validate_args"},
    "moe_bias_needs_etp1": {"config"},
    "layers_divisible_by_pp": {"validate_args", "layer_split"},
    "stage_layers_divisible_by_vpp": {"layer_split"},
    "uneven_pipeline_split": {"validate_args", "config", "layer_split"},
    "layout:uneven_split_vs_vpp": {"validate_args", "config", "layer_split"},
    "cp_divides_2048": {"validate_args"},
    "mla_up_proj_needs_mla": {"config"},
    "moe_recompute_needs_moe": {"config"},
    "offload_needs_precision_aware": {"validate_args"},
    "global_batch_divisible_by_dp": {"validate_args", "microbatches"},
    "global_batch_vs_dp": {"validate_args", "microbatches"},
    "layout:ep_overlap_needs_ep": {"config"},
    "layout:ep_overlap_recompute": {"config"},
    "layout:ep_overlap_needs_vpp": {"config"},
    "ep_overlap_mtp": {"config"},
}

LAYOUT_CHECKS = (  # InvalidLayout message -> check name
    (r"not divisible by TP x PP x CP", "layout:world_vs_tp_pp_cp"),
    (r"\(expert grid\)", "layout:expert_grid"),
    (r"VPP \d+ needs pipeline parallelism", "layout:vpp_needs_pp"),
    (r"full recompute needs recompute_method", "layout:full_needs_method"),
    (r"full recompute needs recompute_num_layers", "layout:full_needs_num_layers"),
    (r"selective recompute takes no", "layout:selective_method_or_num_layers"),
    (r"unknown recompute_modules", "layout:unknown_recompute_module"),
    (r"flex dispatcher needs EP x ETP", "layout:flex_needs_ep_etp"),
    (r"pipeline_num_layers \d+ must be divisible by VPP", "layout:uneven_split_vs_vpp"),
    (r"overlap_moe_expert_parallel_comm needs expert parallelism", "layout:ep_overlap_needs_ep"),
    (r"overlap_moe_expert_parallel_comm cannot run with", "layout:ep_overlap_recompute"),
    (r"overlap_moe_expert_parallel_comm with PP \d+ needs", "layout:ep_overlap_needs_vpp"),
)


def layout_check_name(message: str) -> str:
    for pattern, name in LAYOUT_CHECKS:
        if re.search(pattern, message):
            return name
    return "layout:other"


@dataclass(frozen=True)
class CrossCheckCase:
    model: ModelSpec
    params: dict = field(hash=False)
    global_batch: int = 128
    precision_aware: bool = True
    tag: str = "random"

    def describe(self) -> str:
        shown = {k: v for k, v in self.params.items() if v not in (None, (), 1, 0.0, False, "alltoall")
                 or k == "world_size"}
        extra = f" gbs={self.global_batch}" + ("" if self.precision_aware else " no-precision-aware")
        return f"[{self.tag}] {self.model.name} {shown}{extra}"


@dataclass
class Outcome:
    case: CrossCheckCase
    ours_ok: bool
    ours_reasons: list[str]         # compared rule names that reject (Layout checks as layout:*)
    ours_messages: list[str]
    canonical: list[str]            # why the case was compared in canonical form / canonical rules hit
    megatron_ok: bool
    megatron_message: str
    argv: list[str]

    @property
    def agree(self) -> bool:
        return self.ours_ok == self.megatron_ok

    @property
    def megatron_stage(self) -> str:
        return self.megatron_message.split(":", 1)[0]


# --------------------------------------------------------------------------- our side

def canonical_form(params: dict, model: ModelSpec) -> tuple[dict, list[str]]:
    """The layout Megatron treats `params` as: what it ignores is dropped, with the reason."""
    p = dict(params)
    notes = []
    g = p.get("recompute_granularity")
    mods = tuple(p.get("recompute_modules", ()))
    if g is None and (p.get("recompute_method") is not None or p.get("recompute_num_layers") is not None or mods):
        p.update(recompute_method=None, recompute_num_layers=None, recompute_modules=())
        notes.append("canonical:recompute_fields_without_granularity")  # TransformerConfig checks them only under a granularity
    if g == "full" and mods:
        p["recompute_modules"] = ()
        notes.append("canonical:modules_with_full_recompute")  # Megatron reads recompute_modules for selective only
    if g == "selective" and len(set(mods)) != len(mods):
        p["recompute_modules"] = tuple(dict.fromkeys(mods))
        notes.append("canonical:repeated_recompute_module")  # TransformerConfig checks the set
    if p.get("overlap_d2h_h2d") and not p.get("optimizer_offload_fraction", 0.0) > 0:
        p["overlap_d2h_h2d"] = False
        notes.append("canonical:overlap_without_offload")  # read only with --optimizer-cpu-offload
    if p.get("optimizer_offload_fraction", 0.0) > 1:
        p["optimizer_offload_fraction"] = 1.0
        notes.append("canonical:offload_fraction_above_1")  # HybridDeviceOptimizer: threshold = numel x fraction
    if p.get("dispatcher") == "flex" and not model.is_moe:
        p["dispatcher"] = "alltoall"
        notes.append("canonical:flex_without_experts")  # no MoE layer, no token dispatcher
    return p, notes


def our_verdict(case: CrossCheckCase) -> tuple[bool, list[str], list[str], list[str]]:
    # without the flag in the argv at all: not even an offloaded optimizer sets it
    stack = Stack(precision_aware_optimizer=case.precision_aware, offload_precision_aware=case.precision_aware)
    workload = Workload(seq_len=SEQ_LENGTH, global_batch=case.global_batch)

    def canonical_rules(layout: Layout) -> list[str]:
        return [f"canonical:{v.rule}" for v in violations(layout, case.model, workload, stack)
                if v.source == rules.CANONICAL]

    params, notes = canonical_form(case.params, case.model)
    if params != case.params:  # the canonical rules of the layout as given, when Layout accepts it
        try:
            notes += canonical_rules(Layout(**case.params))
        except InvalidLayout:
            pass
    try:
        layout = Layout(**params)
    except InvalidLayout as e:
        return False, [layout_check_name(str(e))], [str(e)], notes
    found = violations(layout, case.model, workload, stack)
    compared = [v for v in found if v.source == MEGATRON or v.rule in ALSO_COMPARED]
    notes = list(dict.fromkeys(notes + canonical_rules(layout)))
    return not compared, [v.rule for v in compared], [str(v) for v in compared], notes


# --------------------------------------------------------------------------- Megatron's side

def unchecked_layout(params: dict) -> Layout:
    """A Layout holding `params` as given, without the constructor's checks (to map any case to argv)."""
    layout = object.__new__(Layout)
    for f in dataclasses.fields(Layout):
        default = f.default if f.default is not dataclasses.MISSING else None
        object.__setattr__(layout, f.name, params.get(f.name, default))
    return layout


def case_argv(case: CrossCheckCase) -> list[str]:
    layout = unchecked_layout(case.params)
    argv = (model_args(case.model) + parallel_args(layout) + recompute_args(layout) + batch_args(layout)
            + offload_args(layout) + dispatcher_args(layout))
    argv += ["--seq-length", str(SEQ_LENGTH), "--max-position-embeddings", str(SEQ_LENGTH),
             "--micro-batch-size", "1", "--global-batch-size", str(case.global_batch),
             "--bf16", "--use-distributed-optimizer"]
    if case.precision_aware:
        argv.append("--use-precision-aware-optimizer")
    return argv


def run(case: CrossCheckCase) -> Outcome:
    ours_ok, reasons, messages, notes = our_verdict(case)
    argv = case_argv(case)
    megatron_ok, message = megatron_validate.validate(argv, case.params["world_size"])
    return Outcome(case, ours_ok, reasons, messages, notes, megatron_ok, message, argv)


# --------------------------------------------------------------------------- the cases

RECOMPUTES = (
    {}, {}, {},
    dict(recompute_granularity="selective"),
    dict(recompute_granularity="selective", recompute_modules=("core_attn",)),
    dict(recompute_granularity="selective", recompute_modules=("moe_act", "layernorm")),
    dict(recompute_granularity="selective", recompute_modules=("mla_up_proj",)),
    dict(recompute_granularity="selective", recompute_modules=("moe",)),
    dict(recompute_granularity="selective", recompute_modules=("shared_experts",)),
    dict(recompute_granularity="selective", recompute_modules=("mlp", "layernorm")),
    dict(recompute_granularity="selective", recompute_modules=("attention",)),            # unknown module
    dict(recompute_granularity="selective", recompute_modules=("core_attn", "core_attn")),  # canonical
    dict(recompute_granularity="selective", recompute_method="uniform"),
    dict(recompute_granularity="selective", recompute_num_layers=2),
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=64),  # canonical (> stage)
    dict(recompute_granularity="full", recompute_num_layers=1),                               # no method
    dict(recompute_granularity="full", recompute_method="block"),                             # no num_layers
    dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1,
         recompute_modules=("core_attn",)),                                                   # canonical
    dict(recompute_method="uniform", recompute_num_layers=1),                                 # canonical
)
OFFLOADS = ({}, {}, {}, dict(optimizer_offload_fraction=1.0, overlap_d2h_h2d=True),
            dict(optimizer_offload_fraction=0.5), dict(overlap_d2h_h2d=True))


def random_cases() -> list[CrossCheckCase]:
    """Per model and world size: half drawn from grids that satisfy the world-size rules (so model,
    recompute, dispatcher and batch rules decide), half from wider value pools."""
    out = []
    for name in MODELS:
        model = load_model(name)
        for world in WORLDS:
            rng = random.Random(f"{name}/{world}")
            ds = divisors(world)
            grid = [(tp, pp, cp, ep, etp)
                    for tp in ds if tp <= 16 for pp in ds for cp in ds for ep in ds for etp in sorted({1, tp})
                    if world % (tp * pp * cp) == 0 and world % (etp * ep * pp) == 0]
            for i in range(RANDOM_CASES_PER_MODEL_AND_WORLD):
                if i % 2 == 0:
                    tp, pp, cp, ep, etp = rng.choice(grid)
                else:
                    tp = rng.choice([1, 2, 3, 4, 8, 16])
                    pp = rng.choice([1, 1, 2, 3, 4, 5, 8])
                    cp = rng.choice([1, 1, 2, 3, 4, 8])
                    ep = rng.choice([1, 2, 3, 4, 8, 16, 32, 64])
                    etp = rng.choice([1, 1, tp, 2])
                vpp = rng.choice([1, 1, 1, 2, 3, 4]) if pp > 1 or rng.random() < 0.1 else 1
                params = dict(world_size=world, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp,
                              dispatcher=rng.choice(["alltoall", "alltoall", "flex"]),
                              **rng.choice(RECOMPUTES), **rng.choice(OFFLOADS))
                out.append(CrossCheckCase(model, params, global_batch=rng.choice([128, 128, 128, 96, 120, 6]),
                                          precision_aware=rng.random() > 0.1))
    return out


def targeted_cases() -> list[CrossCheckCase]:
    """At least one case per compared rule that breaks only that rule, and the canonical cases."""
    m = {name: load_model(name) for name in MODELS}
    q36, q30, ds3, moon, llama, oss = (m["qwen3.6-35b-a3b"], m["qwen3-30b-a3b"], m["deepseek-v3"],
                                      m["moonlight-16b-a3b"], m["llama3-8b"], m["gpt-oss-20b"])
    # No catalog model has query groups that are neither a multiple nor a divisor of a TP that divides
    # the heads: a Llama variant with 24 heads and 8 groups at TP 6 has.
    llama24 = dataclasses.replace(llama, name="llama3-8b-24-heads", display_name="Llama-3-8B (24 heads)",
                                  num_attention_heads=24)
    # Nor one with two MTP layers (EP overlap supports one): DeepSeek-V3 with a second.
    ds3_mtp2 = dataclasses.replace(ds3, name="deepseek-v3-mtp2", num_nextn_predict_layers=2)

    def c(tag, model, gbs=128, precision_aware=True, **params):
        # the cases were written when ETP defaulted to 1: keep that, and etp=None for "unset" (Megatron: TP)
        params.setdefault("etp", 1)
        if params["etp"] is None:
            del params["etp"]
        return CrossCheckCase(model, params, global_batch=gbs, precision_aware=precision_aware, tag=tag)

    return [
        # uneven pipeline splits (61 layers over PP 4) and ETP left unset
        c("valid", ds3, world_size=64, pp=4, ep=16, decoder_first_pipeline_num_layers=13),
        c("valid", ds3, world_size=64, pp=4, vpp=2, ep=16, decoder_first_pipeline_num_layers=14,
          decoder_last_pipeline_num_layers=16),
        c("uneven", ds3, world_size=64, pp=4, ep=16, decoder_last_pipeline_num_layers=8),
        c("uneven", ds3, world_size=64, pp=4, vpp=2, ep=16, decoder_first_pipeline_num_layers=3),
        c("etp-unset", q30, world_size=8, tp=2, ep=8, etp=None),
        c("valid", llama, world_size=8, tp=2, etp=None),
        # valid references
        c("valid", q36, world_size=8, tp=2, ep=8),
        c("valid", q36, world_size=8, tp=1, ep=8, dispatcher="flex", recompute_granularity="full",
          recompute_method="uniform", recompute_num_layers=1, optimizer_offload_fraction=1.0, overlap_d2h_h2d=True),
        c("valid", q36, world_size=64, tp=2, pp=4, vpp=5, cp=2, ep=16),
        c("valid", q30, world_size=32, tp=4, pp=2, vpp=3, cp=1, ep=8, etp=4, dispatcher="flex"),
        c("valid", ds3, world_size=64, tp=8, pp=1, ep=64, recompute_granularity="selective",
          recompute_modules=("mla_up_proj", "moe_act", "layernorm")),
        c("valid", moon, world_size=16, tp=4, pp=1, cp=2, ep=16, etp=1),
        c("valid", llama, world_size=16, tp=4, pp=4, vpp=2, etp=4, recompute_granularity="selective",
          recompute_modules=("core_attn", "mlp")),
        c("valid", oss, world_size=8, tp=2, ep=8, etp=1),
        # EP all-to-all overlap (--overlap-moe-expert-parallel-comm)
        c("valid", q30, world_size=8, ep=8, overlap_moe_expert_parallel_comm=True),
        c("valid", q30, world_size=16, pp=2, vpp=2, ep=8, dispatcher="flex", recompute_granularity="selective",
          recompute_modules=("moe_act",), overlap_moe_expert_parallel_comm=True),
        c("ep overlap without ep", q30, world_size=8, tp=1, ep=1, overlap_moe_expert_parallel_comm=True),
        c("ep overlap with full recompute", q30, world_size=8, ep=8, recompute_granularity="full",
          recompute_method="uniform", recompute_num_layers=1, overlap_moe_expert_parallel_comm=True),
        c("ep overlap with moe recompute", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_modules=("moe",), overlap_moe_expert_parallel_comm=True),
        c("ep overlap without vpp", q30, world_size=16, pp=2, ep=8, overlap_moe_expert_parallel_comm=True),
        c("ep overlap with 2 MTP layers", ds3_mtp2, world_size=128, pp=8, vpp=2, ep=16,
          pipeline_model_parallel_layout="Et*3|(tttt|)*14ttmmL", overlap_moe_expert_parallel_comm=True),
        c("valid", ds3_mtp2, world_size=128, pp=8, vpp=2, ep=16, pipeline_model_parallel_layout="Et*3|(tttt|)*14ttmmL"),
        # Layout constructor checks
        c("world % tp*pp*cp", q36, world_size=24, tp=2, pp=4, cp=4, ep=8, gbs=96),
        c("world % etp*ep*pp", q30, world_size=8, tp=2, ep=8, etp=2),
        c("vpp without pp", q36, world_size=8, tp=2, vpp=2, ep=8),
        c("full without method", q30, world_size=8, ep=8, recompute_granularity="full", recompute_num_layers=1),
        c("full without num_layers", q30, world_size=8, ep=8, recompute_granularity="full",
          recompute_method="uniform"),
        c("selective with method", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_method="block"),
        c("selective with num_layers", llama, world_size=8, recompute_granularity="selective",
          recompute_num_layers=2),
        c("unknown module", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_modules=("gdn_norm_out",)),
        c("flex with ep*etp 1", q36, world_size=8, tp=2, ep=1, etp=1, dispatcher="flex"),
        c("flex with ep*etp 1", ds3, world_size=8, tp=1, ep=1, etp=1, dispatcher="flex"),
        # model rules
        c("heads % tp", moon, world_size=32, tp=32, ep=1, etp=1),
        c("heads % tp", q30, world_size=64, tp=64, ep=1, etp=1, gbs=128),
        c("query groups vs tp", llama24, world_size=24, tp=6, etp=6, gbs=96),
        c("ep without experts", llama, world_size=8, ep=2),
        c("experts % ep", q30, world_size=24, ep=3, gbs=96),
        c("experts % ep", moon, world_size=24, tp=1, ep=24, gbs=96),
        c("moe bias etp", oss, world_size=8, tp=2, ep=4, etp=2),
        c("layers % pp", q36, world_size=24, tp=1, pp=3, ep=8),
        c("layers % pp (vpp)", ds3, world_size=16, tp=1, pp=2, vpp=2, ep=8, gbs=64),
        c("stage layers % vpp", q36, world_size=16, tp=1, pp=4, vpp=3, ep=4),
        c("stage layers % vpp", llama, world_size=8, tp=2, pp=2, vpp=3, etp=2),
        c("cp % (2 cp)", q36, world_size=24, tp=2, cp=3, ep=8, gbs=96),
        c("mla_up_proj without mla", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_modules=("mla_up_proj",)),
        c("moe_act on dense", llama, world_size=8, recompute_granularity="selective", recompute_modules=("moe_act",)),
        c("offload without precision-aware", q36, world_size=8, tp=2, ep=8, precision_aware=False,
          optimizer_offload_fraction=1.0),
        c("gbs % dp", q30, world_size=24, tp=1, ep=8, gbs=128),
        c("gbs % dp", llama, world_size=24, tp=2, etp=2, gbs=100),
        c("gbs < dp", q36, world_size=16, tp=1, ep=16, gbs=6),
        # canonical: we reject, Megatron accepts (checked)
        c("canonical etp dense", llama, world_size=8, tp=2, etp=1),
        c("canonical recompute > stage", q36, world_size=8, tp=2, ep=8, recompute_granularity="full",
          recompute_method="block", recompute_num_layers=41),
        c("canonical moe on dense", llama, world_size=8, recompute_granularity="selective", recompute_modules=("moe",)),
        c("canonical shared_experts", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_modules=("shared_experts",)),
        c("canonical flex on dense", llama, world_size=8, tp=2, etp=2, dispatcher="flex"),
        c("canonical flex on dense", llama, world_size=8, dispatcher="flex"),
        c("canonical full + modules", q30, world_size=8, ep=8, recompute_granularity="full",
          recompute_method="uniform", recompute_num_layers=2, recompute_modules=("core_attn",)),
        c("canonical fields without granularity", q30, world_size=8, ep=8, recompute_method="uniform",
          recompute_num_layers=1, recompute_modules=("moe_act",)),
        c("canonical repeated module", q30, world_size=8, ep=8, recompute_granularity="selective",
          recompute_modules=("moe_act", "moe_act")),
        c("canonical overlap without offload", q36, world_size=8, tp=2, ep=8, overlap_d2h_h2d=True),
        c("canonical fraction above 1", q36, world_size=8, tp=2, ep=8, optimizer_offload_fraction=1.5),
    ]


def all_cases() -> list[CrossCheckCase]:
    return targeted_cases() + random_cases()


# --------------------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    import megatron.training.arguments  # noqa: F401 - missing megatron-core errors here, clearly, not as disagreements

    cases = all_cases()
    start = time.perf_counter()
    results = [run(case) for case in cases]
    elapsed = time.perf_counter() - start
    print(summary(results, elapsed))
    return results


def summary(results: list[Outcome], elapsed: float) -> str:
    agree = sum(r.agree for r in results)
    table = Counter((r.ours_ok, r.megatron_ok) for r in results)
    by_model = Counter(r.case.model.name for r in results)
    reasons = Counter(reason for r in results if not r.ours_ok for reason in r.ours_reasons)
    canonical = Counter(note for r in results for note in r.canonical)
    lines = [
        f"Megatron cross-check: {len(results)} layouts, {agree} agree, {len(results) - agree} disagree "
        f"({elapsed:.1f} s, {1000 * elapsed / max(len(results), 1):.1f} ms per layout)",
        f"  both accept {table[(True, True)]}, both reject {table[(False, False)]}, "
        f"only we reject {table[(False, True)]}, only Megatron rejects {table[(True, False)]}",
        "  layouts per model: " + ", ".join(f"{k} {v}" for k, v in sorted(by_model.items())),
        "  our rejections by rule: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())),
        "  canonical (Megatron accepts): " + ", ".join(f"{k} {v}" for k, v in sorted(canonical.items())),
    ]
    for r in results:
        if not r.agree:
            lines.append(f"  DISAGREE {r.case.describe()}\n    ours: "
                         f"{'accept' if r.ours_ok else '; '.join(r.ours_messages)}\n    megatron: {r.megatron_message}")
    return "\n".join(lines)


def test_megatron_is_installed():
    """The cross-check needs megatron-core and torch (the `test` extra); missing, it fails, never skips."""
    import megatron.core
    import megatron.training.arguments  # noqa: F401
    import torch  # noqa: F401

    major, minor = (int(x) for x in megatron.core.__version__.split(".")[:2])
    assert (major, minor) >= (0, 17), f"megatron-core {megatron.core.__version__} is older than the test extra's 0.17"


def test_ours_agrees_with_megatron(outcomes):
    assert len(outcomes) >= MIN_CASES
    bad = [r for r in outcomes if not r.agree]
    assert not bad, summary(outcomes, 0.0)


def test_every_compared_rule_is_exercised_alone(outcomes):
    """Each compared rule rejects at least one targeted case on its own, and Megatron rejects that
    case in the stage the module docstring names. New megatron rules in rules.py must be added to
    WHERE. (Random cases are not used here: the Layout constructor reports only its first failed
    check, so a random case's single reason need not be its only one.)"""
    source = inspect.getsource(rules)
    megatron_rules = set(re.findall(r'Violation\(\s*"(\w+)",\s*MEGATRON\b', source))
    assert megatron_rules, "no megatron rules found in search_space/rules.py"
    missing = (megatron_rules | ALSO_COMPARED) - set(WHERE)
    assert not missing, f"megatron rules without a documented Megatron stage: {sorted(missing)}"
    alone = {}
    for r in outcomes:
        if r.case.tag != "random" and not r.ours_ok and len(r.ours_reasons) == 1:
            alone.setdefault(r.ours_reasons[0], []).append(r)
    for rule, stages in WHERE.items():
        assert rule in alone, f"no case breaks only {rule}"
        for r in alone[rule]:
            assert not r.megatron_ok and r.megatron_stage in stages, (
                f"{rule}: Megatron said '{r.megatron_message}' for {r.case.describe()}, expected a "
                f"rejection in {sorted(stages)}")


def test_canonical_settings_are_accepted_by_megatron(outcomes):
    """Every canonical setting occurs, and a case whose only issues are canonical passes Megatron."""
    expected = {"canonical:recompute_fields_without_granularity", "canonical:modules_with_full_recompute",
                "canonical:repeated_recompute_module", "canonical:overlap_without_offload",
                "canonical:offload_fraction_above_1", "canonical:flex_without_experts",
                "canonical:etp_dense", "canonical:recompute_num_layers", "canonical:moe_layer_recompute_needs_moe",
                "canonical:shared_experts_recompute", "canonical:flex_needs_moe"}
    seen = {note for r in outcomes for note in r.canonical}
    assert expected <= seen, f"canonical settings never exercised: {sorted(expected - seen)}"
    for r in outcomes:
        if r.canonical and r.ours_ok:
            assert r.megatron_ok, f"{r.case.describe()}: {r.megatron_message}"


def test_model_args_accepted_for_every_catalog_model():
    """Each catalog model's MODEL_ARGS pass Megatron's checks on one GPU (no parallelism)."""
    from cost_model.nouns.model_spec import catalog_names

    for name in catalog_names():
        model = load_model(name)
        case = CrossCheckCase(model, dict(world_size=1), global_batch=8, tag="model_args")
        ok, message = megatron_validate.validate(case_argv(case), 1)
        assert ok, f"{name}: {message}\n{' '.join(case_argv(case))}"


def test_validate_is_independent_between_calls():
    """A rejected call leaves no state behind that changes the next call's verdict."""
    model = load_model("qwen3-30b-a3b")
    good = case_argv(CrossCheckCase(model, dict(world_size=8, tp=2, ep=8, etp=1)))
    bad = case_argv(CrossCheckCase(model, dict(world_size=8, tp=2, ep=8, etp=2)))
    first = megatron_validate.validate(good, 8)
    assert first[0], first[1]
    assert not megatron_validate.validate(bad, 8)[0]
    assert megatron_validate.validate(good, 8) == first


def test_a_config_models_launch_args_pass_megatrons_checks():
    """The MODEL_ARGS a launch builds from a config.json (search_space.megatron_args.launch_model_args) pass Megatron's
    checks: Qwen2-57B-A14B's pre-softmax routing and gated shared expert, Llama 3.1's RoPE scaling."""
    from search_space.megatron_args import launch_model_args

    for name in ("benchmarks/models/qwen2-57b-a14b/config.json", "llama3.1-405b"):
        model = load_model(name)
        built, missing = launch_model_args(model)
        assert built is not None, missing
        case = CrossCheckCase(model, dict(world_size=1), global_batch=8, tag="launch_model_args")
        argv = case_argv(case)
        assert all(flag in argv for flag in built if flag.startswith("--"))
        ok, message = megatron_validate.validate(argv, 1)
        assert ok, f"{name}: {message}"
