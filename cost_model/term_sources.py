"""Where each term of a step's seconds comes from: one line a term, "measured: ...", "modelled: ..." or "fitted: ...",
for the fitted Megatron stack and for the megatron runner's measured components (`term_sources`; `tune predict
--explain` prints them). Pure text from a step's inputs (cost_model.step_time.StepContext)."""
from __future__ import annotations

import re
from functools import lru_cache

from cost_model.constants import Constants, constants_sources
from cost_model.runner_components import RunnerComponents
from cost_model.allocator_strain import remap_source
from cost_model.step_time import RUNNER_FALLBACK_TERMS, TERMS, StepContext, nearest_ends, runner_layer_terms


@lru_cache(maxsize=1)
def _constant_sources() -> dict[str, str]:
    return constants_sources()


def _constant(c: Constants, name: str, unit: str = "") -> tuple[str, str]:
    """("fitted" or "modelled", "NAME = VALUE UNIT (where, when)") from the constant's source in constants.yaml:
    fitted where its source says "fitted (where, when)", else a modelling estimate or assumption."""
    source = _constant_sources().get(name, "")
    fitted = re.search(r"fitted\s*\(([^)]*)\)", source)
    if fitted:
        where = fitted.group(1)
    elif source.startswith("estimate"):
        where = "estimate"
    else:
        where = source if len(source) <= 70 else source[:70].rsplit(" ", 1)[0] + "..."
    return ("fitted" if fitted else "modelled"), f"{name} = {getattr(c, name):g}{unit} ({where})"


def _bus(ctx: StepContext, what: str, span: int) -> str:
    """The collective bandwidth a communication term is priced at (`Rates.collective`): the profile's inside
    one NVLink domain, the catalog's inter-node one for a group spread over `span` GPUs beyond it."""
    if span > ctx.rates.gpu.nvlink_domain:
        return (f"{what} at the catalog's inter-node bandwidth x internode_bus_efficiency "
                f"{ctx.c.internode_bus_efficiency:g} (estimate)")
    borrowed = getattr(getattr(ctx.rates, "profile", None), "collectives_source", "")
    return f"{what} at the NCCL bus bandwidth of the {ctx.rates.source}" + (f" ({borrowed})" if borrowed else "")


def _fitted_sources(ctx: StepContext) -> dict[str, str]:
    """Each term of the fitted step (`step_breakdown` without runner components): FLOPs and bytes at the rates
    the profile measured, and the constants fitted to tuned stacks."""
    r, c, layout = ctx.rates, ctx.c, ctx.layout
    of = f"of the {r.source}"
    launch_name = "layer_launch_overhead_s" if ctx.framework == "slime" else "megatron_layer_launch_overhead_s"
    kind, launch = _constant(c, launch_name, " s per layer pass")
    launch_line = f"{kind}: {launch}, exposed where the pass's GPU work is shorter"
    if layout.dispatcher == "flex":
        launch_line += f", x {_constant(c, 'flex_overhead_factor')[1]}"
    kind, call = _constant(c, "expert_gemm_call_s", " s per expert GEMM call")
    if layout.recompute_granularity == "full":
        recompute = f"modelled: the recomputed forward's FLOPs and forward collectives at the same rates {of}"
    else:
        recompute = f"modelled: the selected modules' forward work at the same rates {of}"
    ep = f"modelled: {_bus(ctx, f'token dispatch and combine ({layout.dispatcher})', layout.ep * layout.etp)}"
    if layout.overlap_moe_expert_parallel_comm:
        ep += "; the share under the other micro-batch's compute modelled"
    _, cp_exposed = _constant(c, "cp_exposed_fraction")   # an estimate: the line says modelled
    chunk_kind, chunk = _constant(c, "pipeline_chunk_overhead_s", " s per scheduled chunk")
    dp_name = "dp_exposed_fraction" if ctx.framework == "slime" else "megatron_dp_exposed_fraction"
    dp_kind, dp_exposed = _constant(c, dp_name)
    dp_what = "gradient reduce-scatter and parameter all-gather"
    offload_kind, share = (_constant(c, "cpu_adam_share_of_profile") if hasattr(r, "profile")
                           else _constant(c, "cpu_adam_params_per_s_per_gpu", " params/s"))
    cpu_rate = "of the profile's measured CPU Adam rate" if hasattr(r, "profile") else "(no profile)"
    if ctx.framework == "slime":
        step_kind, step = _constant(c, "step_overhead_s", " s")
        step_line = f"{step_kind}: {step} + the bf16 weight backup at the host-device bandwidth {of}"
    else:
        step_kind, step = _constant(c, "megatron_step_overhead_s", " s")
        step_line = f"{step_kind}: {step}"
    return {
        "compute_attention": f"modelled: FLOPs at the GEMM and attention rates {of}",
        "compute_linear_attention": f"modelled: projection FLOPs at the GEMM rates {of}, causal conv at "
                                    f"linear_attention_efficiency x peak; delta-rule kernel {r.gdn_source}",
        "compute_mlp": f"modelled: FLOPs (dense MLP, shared experts, router) at the GEMM rates {of}",
        "compute_experts": f"modelled: FLOPs of the rows the busiest GPU receives (routing imbalance "
                           f"{ctx.imbalance:g}) at the grouped GEMM rates {of}",
        "compute_logits": f"modelled: LM head FLOPs at the GEMM rates {of}",
        "compute_vision": f"modelled: the vision encoder's FLOPs at the GEMM and attention rates {of}",
        "elementwise": f"modelled: bytes (elementwise_bytes_per_token_per_layer_h "
                       f"{c.elementwise_bytes_per_token_per_layer_h:g} x hidden per token per layer, permute_passes "
                       f"{c.permute_passes:g}: estimates; fp32 softmax and cross-entropy) at the HBM bandwidth {of}",
        "launch_overhead": launch_line,
        "expert_calls": f"{kind}: {call}, exposed where the expert GEMMs are shorter",
        "recompute": recompute,
        "tp_comm": f"modelled: {_bus(ctx, 'sequence-parallel all-gathers and reduce-scatters', layout.tp)}",
        "ep_comm": ep,
        "cp_comm": f"modelled: {_bus(ctx, 'context-parallel exchanges', layout.tp * layout.cp)}, x {cp_exposed} "
                   f"exposed",
        "pp_p2p": f"modelled: {_bus(ctx, 'activation and gradient sends between stages', layout.world_size)}; "
                  f"{chunk_kind}: {chunk}",
        "pp_bubble": "modelled: (PP - 1) / VPP x the slowest rank's micro-batch",
        "dp_comm": f"modelled: {_bus(ctx, dp_what, layout.world_size // layout.pp)}; {dp_kind}: {dp_exposed} exposed",
        "optimizer": f"modelled: Adam's bytes over the optimizer shard and a pass over the fp32 gradients at the "
                     f"HBM bandwidth {of}",
        "offload": f"{offload_kind}: CPU Adam at {share} {cpu_rate}; PCIe copies at the host-device bandwidth {of}",
        "step_overhead": step_line,
        "allocator_remap": remap_source(ctx),
    }


# How a measured layer's seconds per micro-batch are read from its points (runner_components._point_curve).
_LAYER_CURVE = ("each a host floor, then a line through its measured points whose fixed cost per micro-batch is at least "
                "the layer's gradient accumulation (modelled: 10 bytes per parameter at the profile's measured copy rate)")


def _host_floor_source(comps: RunnerComponents, c: Constants, kinds, fitted: str, fitted_used: bool) -> str:
    """Where the runner's exposed host time comes from: the host-floor builds of the layer kinds, and `fitted`
    (the fitted launch term's line) where kinds the profile did not measure use it; `fitted` alone without floors."""
    # a kind whose 1-layer build is not above its marginal layer (host jitter) gives no ends of its own: the
    # micro-batch's ends are the largest any of its kinds measured
    floors = [f"{a}+{m} {1e3 * f.layer_s:.2f} ms a layer ({1e3 * f.layer_full_s:.2f} with full recompute), "
              + (f"{1e3 * f.ends_s:.2f} ms the ends" if f.ends_s > 0 else "no ends of its own")
              + (f" (composed, modelled: launches add up by part, {f.composed})" if f.composed else
                 f" ({', '.join(f.models)}'s builds, median of {f.points} points)")
              for a, m in kinds if (f := comps.host_floor(a, m)) is not None]
    if not floors:
        return fitted
    device = comps.source.split(" on ", 1)[-1].split(" (")[0]
    return (f"measured: the host's time to issue a micro-batch's kernels, per layer kind ({'; '.join(floors)}: "
            f"the profile's host-floor builds on the {device}), beyond the micro-batch's GPU work as (host^p + "
            f"GPU^p)^(1/p) - GPU ({_constant(c, 'runner_host_overlap_exponent')[1]}: the two overlap imperfectly "
            f"where they are close); selective recompute adds its modules' modelled share; hosts differ: the same "
            f"build's floor over machines spreads with log sd {c.runner_host_launch_error_sd:g} "
            f"(runner_host_launch_error_sd, benchmarks/host_floor_spread.py), `tune profile` on the training host "
            f"measures its own" + (f"; {fitted}" if fitted_used else ""))


def _runner_sources(ctx: StepContext) -> dict[str, str]:
    """Each term of the runner's step (`runner_step_breakdown`): its measured components, what is modelled
    around them, and the fitted terms of layer kinds the profile did not measure."""
    comps, layout, tokens = ctx.runner, ctx.layout, ctx.tokens
    # "runner components on GPU, date" (the layers line gives the whole source, versions included)
    short = re.match(r"measured: (runner components on [^(]*?) \(([^,)]*)", comps.source)
    where = f"{short.group(1)}, {short.group(2)}" if short else comps.source.removeprefix("measured: ")
    lines = _fitted_sources(ctx)
    measured, unmeasured, recompute_modelled, borrowed = [], [], [], []
    kinds = dict.fromkeys((a, m) for rank in ctx.ranks for a, m, _ in rank.kinds)
    for attn_kind, mlp_kind in kinds:
        name = f"{attn_kind}+{mlp_kind}"
        terms, source = runner_layer_terms(ctx, attn_kind, mlp_kind, 0.0, 0.0)
        if terms is None:
            unmeasured.append(name)
            continue
        curves = comps.layer_for(ctx.model, attn_kind, mlp_kind)[1]
        notes = [n for n in source.removeprefix("measured (").removesuffix(")").split("; ") if n != "measured"]
        if "recompute modelled" in notes:
            recompute_modelled.append(name)
        if not curves.none.tokens[0] <= tokens <= curves.none.tokens[-1]:
            notes.append(f"{tokens:,.0f} tokens extrapolated from {curves.none.span}")
        if curves.borrowed:   # a user's profile without this kind: the shipped profile's build
            borrowed.append(curves.derived is not None)
            notes.append(f"from {curves.borrowed}, which this profile lacks"
                         + (f"; modelled: {curves.derived.note}" if curves.derived is not None else ""))
        measured.append(f"{name} ({curves.model}'s build{''.join(f'; {n}' for n in notes)})")
    fallback = (f"modelled: fitted Megatron terms (no measurement of {', '.join(unmeasured)}: a kind left out of the "
                f"profile is priced so with rms log error {ctx.c.runner_modelled_layer_error_sd:g}, "
                f"runner_modelled_layer_error_sd; `tune profile --model` on a GPU measures it)") if unmeasured else ""
    # where every kind is another profile's build, that profile leads, not this one's (a derived one: modelled)
    lead = comps.source if len(borrowed) < len(measured) else (
        "modelled: derived builds" if any(borrowed) else "measured: builds") + " of the GPU type's shipped profile"
    layers = f"{lead}, layer kinds {', '.join(measured)}; {_LAYER_CURVE}" if measured else ""
    lines["layers"] = "; ".join(x for x in (layers, fallback) if x)
    for key in RUNNER_FALLBACK_TERMS:
        lines[key] += f"; for the layer kinds the runner profile did not measure ({', '.join(unmeasured) or 'none'})"
    lines["launch_overhead"] = _host_floor_source(comps, ctx.c, kinds, lines["launch_overhead"], bool(unmeasured))
    recompute = []
    if measured and layout.recompute_granularity == "full":
        recompute.append(f"measured: the full-recompute builds' extra seconds per layer, for the recomputed layers "
                         f"({where})")
    elif measured:
        recompute.append("modelled: the selected modules' share of the forward (FLOPs model) of the measured "
                         "full-recompute time")
    if recompute_modelled:
        recompute.append(f"modelled: one forward pass of {', '.join(recompute_modelled)} (no recompute measured)")
    if unmeasured:
        recompute.append(f"{lines['recompute']}, for {', '.join(unmeasured)} (no runner measurement)")
    lines["recompute"] = "; ".join(recompute)
    lines["pp_bubble"] = ("modelled: the 1F1B fill and drain, each pipeline stage but the slowest running one "
                          "micro-batch (its priced terms) that nothing overlaps, over VPP")
    h, v = ctx.model.hidden_size, ctx.model.vocab_size
    tp = f", / TP {layout.tp} (modelled)" if layout.tp > 1 else ""
    if (h, v) in comps.ends:
        name, curve = comps.ends[(h, v)]
        span = "" if curve.tokens[0] <= tokens <= curve.tokens[-1] else f", extrapolated from {curve.span}"
        lines["microbatch_ends"] = (f"measured: embedding, LM head, cross-entropy and schedule of {name}'s build "
                                    f"(hidden {h}, vocab {v:,}; {where}){span}{tp}")
    elif comps.ends:
        near = nearest_ends(comps.ends, h, v)
        lines["microbatch_ends"] = (f"modelled: {comps.ends[near][0]}'s measured ends (hidden {near[0]}, vocab "
                                    f"{near[1]:,}; {where}) with its LM head GEMMs replaced by this model's "
                                    f"({h} x {v:,}, at the profile's measured GEMM rates) and the rest scaled by "
                                    f"the vocabulary{tp}")
    lines["optimizer"] = (f"measured: per-step work (zero grads, grad norm, clip, Adam) "
                          f"{comps.optimizer_s_per_step * 1e3:.2f} ms + {comps.optimizer_s_per_param * 1e12:.1f} ms "
                          f"per 1e9 parameters of the optimizer shard (line through the builds; {where})")
    offload = _runner_offload_source(ctx, where)
    if offload:
        lines["offload"] = offload
    lines["pp_p2p"] = f"modelled: {_bus(ctx, 'activation and gradient sends between stages', layout.world_size)}"
    dp_what = "gradient reduce-scatter and parameter all-gather"
    lines["dp_comm"] = (f"modelled: {_bus(ctx, dp_what, layout.world_size // layout.pp)}, all exposed (the runner "
                        f"does not overlap it)")
    lines["step_overhead"] = "modelled: none on the runner (its per-step work is in optimizer)"
    lines["allocator_remap"] = remap_source(ctx)
    if comps.derived is not None:
        _mark_derived(lines, comps.derived)
    return lines


def _mark_derived(lines: dict[str, str], derived) -> None:
    """Components measured on another GPU type: every line read from their builds is modelled here, said how."""
    first = True
    for key in ("layers", "recompute", "microbatch_ends", "optimizer", "launch_overhead", "offload"):
        if lines.get(key, "").startswith("measured: "):
            how = derived.note if first else "derived as the layers are"
            lines[key] = f"modelled: {how}; from what was {lines[key]}"
            first = False


# What a CPU optimizer's price says of the host it was measured on (the spread runner_host_cpu_error_sd was taken from)
HOSTS_DIFFER = ("hosts differ: two H100 hosts' offload builds took x0.62 and x1.11 the H200 host's time; the "
                "runner's stored offload runs imply x0.55-0.99 of the shipped profile's on H100 hosts (median 0.75, "
                "18 runs) and x0.40-3.03 on H200 hosts (median 0.90, 61 runs; benchmarks/offload_hosts.py); "
                "`tune profile` on the training host measures its own")


def _runner_offload_source(ctx: StepContext, where: str) -> str | None:
    """Where the runner's offloaded optimizer step comes from: the profile's offload build, else its CPU Adam rate
    for this many ranks per host (measured or shared out); None without either."""
    comps, ranks = ctx.runner, ctx.ranks_per_host
    points = sorted(comps.cpu_adam)
    at = next((n for n, _ in points if n >= ranks), None)
    pcie = f"PCIe copies at the host-device bandwidth of the {ctx.rates.source}"
    if comps.offload_s_per_param is not None:
        return (f"measured: the offloaded optimizer step {comps.offload_s_per_param_here * 1e12:.0f} ms per 1e9 "
                f"parameters on the CPU with 1 rank per host (megatron's HybridDeviceOptimizer: copies and "
                f"CPU Adam; {where}; on the host that ran those builds: {HOSTS_DIFFER})" + ("" if ranks == 1 else
                f", slowed by the CPU Adam rate measured with {ranks} ranks per host (modelled)"))
    if at is not None:
        return (f"measured: CPU Adam {comps.cpu_adam_rate(ranks) / 1e6:,.0f} M params/s per rank with "
                f"{at} ranks per host{'' if at == ranks else f' (for {ranks})'} ({where}); {pcie}")
    if points:
        return (f"modelled: CPU Adam measured with {points[-1][0]} ranks per host, shared by {ranks} "
                f"({comps.cpu_adam_rate(ranks) / 1e6:,.0f} M params/s per rank); {pcie}")
    return None


def term_sources(ctx: StepContext, breakdown: dict[str, float] | None = None) -> dict[str, str]:
    """Where each term's seconds come from, one line each, starting "measured:", "modelled:" or "fitted:"
    (a term composed of several says each part). With `breakdown`, only its non-zero terms (and, on the
    runner's stack, "layers": how the layers were priced). Not cheap on the runner's stack (it looks up
    every layer kind again): `cost_model.predict.Prediction.term_sources` computes it on demand."""
    lines = _runner_sources(ctx) if ctx.runner is not None else _fitted_sources(ctx)
    keep = TERMS if breakdown is None else [k for k in TERMS if breakdown.get(k, 0.0) > 0
                                             or (k == "layers" and ctx.runner is not None)]
    out = {k: lines[k] for k in keep if k in lines}
    for k, v in (breakdown or {}).items():   # a hypothesis's own term (cost_model.hypotheses: "unexplained")
        if k not in TERMS and v > 0:
            out[k] = f"fitted: the hypothesis's {k} time, calibrated with its constants (cost_model/hypotheses.py)"
    return out
