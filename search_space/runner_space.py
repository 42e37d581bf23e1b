"""The search space a trial runner can run: SpaceOptions narrowed to the runner's stack, with reasons.

A runner declares what its software stack can run (cost_model.nouns.stack.Stack: DeepEP, Transformer
Engine, the precision-aware optimizer, CP, MLA, fla, optimizer offload). Every dimension it cannot run
leaves the space before ranking, with one line saying why (the CLI prints them); `RunnerSpace.refusal`
names why a layout outside it (an Optuna sampler's proposal, a --reference) cannot run there.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import LINEAR_ATTENTION, MLA, ModelSpec
from cost_model.nouns.stack import Stack
from search_space.enumerate import SpaceOptions, covering_sets, selective_module_sets


class RunnerSpaceError(AttuneError, ValueError):
    """The runner cannot run the model at all, whatever the layout."""


@dataclass(frozen=True)
class RunnerSpace:
    options: SpaceOptions                       # the space the runner can run
    reasons: tuple[str, ...] = ()               # one line per narrowing that removed something
    notes: tuple[str, ...] = ()                 # what else differs from the full model on slime's image
    why: tuple[tuple[str, str], ...] = ()       # (SpaceOptions field, reason) for each narrowing

    def refusal(self, layout: Layout) -> str | None:
        """Why the runner cannot run `layout` (None: it can)."""
        o, why = self.options, dict(self.why)
        outside = {
            "dispatchers": layout.dispatcher not in o.dispatchers,
            "exp_avg_dtypes": not layout.offloaded and layout.exp_avg_dtype not in o.exp_avg_dtypes,
            "max_cp": o.max_cp is not None and layout.cp > o.max_cp,
            "offload_fractions": layout.optimizer_offload_fraction not in o.offload_fractions,
        }
        for name, out in outside.items():
            if out and name in why:
                return why[name]
        return None


def narrow(options: SpaceOptions, model: ModelSpec, world_size: int, stack: Stack, runner: str = "the runner",
           model_run: ModelSpec | None = None) -> RunnerSpace:
    """`options` narrowed to what `stack` can run for `model` on `world_size` GPUs.
    `model_run` is the model a trial trains (default `model`). Raises RunnerSpaceError when the runner
    cannot run the model at all."""
    where = stack.source
    if model.count(MLA) and not stack.mla:
        raise RunnerSpaceError(f"the {runner} runner cannot run {model.display_name}: its multi-latent attention "
                               f"(MLA) is not supported there ({stack.source})")
    changes, why = {}, []
    if not stack.deepep and "flex" in options.dispatchers:
        changes["dispatchers"] = tuple(d for d in options.dispatchers if d != "flex")
        if model.is_moe:
            why.append(("dispatchers", f"no flex dispatcher: it needs DeepEP, not importable ({where})"))
    if not stack.precision_aware_optimizer and "bf16" in options.exp_avg_dtypes:
        changes["exp_avg_dtypes"] = tuple(d for d in options.exp_avg_dtypes if d != "bf16") or ("fp32",)
        why.append(("exp_avg_dtypes", "no bf16 Adam moments: they need the precision-aware optimizer "
                                      f"(Transformer Engine's FusedAdam), not available ({where})"))
    if not stack.context_parallel and (options.max_cp is None or options.max_cp > 1):
        changes["max_cp"] = 1
        if world_size > 1:
            why.append(("max_cp", f"no context parallelism (CP 1 only): it needs Transformer Engine's ring "
                                  f"attention, not available ({where})"))
    if not stack.optimizer_offload and any(f > 0 for f in options.offload_fractions):
        changes["offload_fractions"] = (0.0,)
        why.append(("offload_fractions", f"no optimizer CPU offload: not supported ({where})"))
    run = model_run or model
    sets = options.selective_module_sets
    sets = selective_module_sets(model) if sets is None else list(sets)
    run_sets = covering_sets(sets, run)
    if run_sets != sets:   # a truncated run without some layer kind (e.g. no softmax attention in 2 GDN layers)
        changes["selective_module_sets"] = tuple(run_sets)
        gone = sorted({m for s in sets for m in s} - {m for s in run_sets for m in s})
        layers = f"the {run.num_hidden_layers} layers the {runner} runner trains ({run.display_name})"
        why.append(("selective_module_sets",
                    f"no selective recompute of {', '.join(gone)}: it covers none of {layers}" if gone else
                    f"fewer selective-recompute module sets: on {layers} some cover the same modules"))
    return RunnerSpace(replace(options, **changes), tuple(r for _, r in why),
                       _notes(model, model_run or model, stack, runner), tuple(why))


def _notes(model: ModelSpec, run: ModelSpec, stack: Stack, runner: str) -> tuple[str, ...]:
    notes = []
    if run.num_hidden_layers != model.num_hidden_layers or run.layer_types != model.layer_types:
        notes.append(f"ranked by predictions for {run.display_name} ({run.num_hidden_layers} of "
                     f"{model.num_hidden_layers} layers), the model the {runner} runner trains")
    if run.count(LINEAR_ATTENTION) and not stack.gdn_kernels:
        notes.append(f"Gated DeltaNet layers run megatron's torch gated delta rule (fla is not importable): "
                     f"slower than fla's kernels ({stack.source})")
    return tuple(notes)
