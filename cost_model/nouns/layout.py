"""A training layout: how one training job spreads over `world_size` GPUs.

Field names are Megatron's and slime's (tp = --tensor-model-parallel-size, ...), so a layout
maps one-to-one to a command line and to a recipe's `layout` block. Building a Layout checks
the rules that need nothing but the layout itself; the rules that depend on the model, the
workload and the software stack live in `search_space.rules`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from cost_model.nouns.quick_init import quick_init
from operator import attrgetter

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown
from cost_model.nouns.pipeline_layout import InvalidPipelineLayout, parse_stages

RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
# Megatron's --recompute-modules choices (training/arguments.py at the slime pin).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DISPATCHERS = ("alltoall", "flex")
# Megatron's --exp-avg-dtype / --exp-avg-sq-dtype for the precision-aware optimizer (both moments alike).
MOMENT_DTYPES = ("fp32", "bf16")


UNEVEN_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
ACCOUNT_FIELDS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
LAYOUT_STRING_FIELD = "pipeline_model_parallel_layout"
SPLIT_FIELDS = UNEVEN_FIELDS + ACCOUNT_FIELDS + (LAYOUT_STRING_FIELD,)
EP_OVERLAP_FIELD = "overlap_moe_expert_parallel_comm"
# Fields added after studies stored layout keys: left out of a key while unset, so those keys stay the same.
LATER_FIELDS = SPLIT_FIELDS + (EP_OVERLAP_FIELD,)


# The fields that must be positive integers, read at once (in C: a space builds a Layout per layout it holds), and
# the pipeline-split fields.
_POSITIVE_NAMES = ("world_size", "tp", "pp", "vpp", "cp", "ep", "etp", "max_tokens_per_gpu", "rows_per_microbatch")
_positive_values = attrgetter(*_POSITIVE_NAMES)
_split_values = attrgetter(*SPLIT_FIELDS)


class InvalidLayout(AttuneError, ValueError):
    """A layout Megatron or slime would reject. The message names the rule and the numbers."""


@quick_init
@dataclass(frozen=True)
class Layout:
    world_size: int
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None      # unset: TP, as Megatron's --expert-tensor-parallel-size defaults
    max_tokens_per_gpu: int = 8192
    rows_per_microbatch: int = 1
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ()
    optimizer_offload_fraction: float = 0.0
    overlap_d2h_h2d: bool = False
    dispatcher: str = "alltoall"
    exp_avg_dtype: str = "fp32"
    # Megatron's uneven pipeline split (--decoder-first/last-pipeline-num-layers): the first and last stages
    # hold these many layers, the middle stages share the rest evenly. None: that stage is a middle one.
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    # Megatron's other way to split layers that do not divide: the embedding and/or the loss count as one
    # layer each of the first/last virtual stage (--account-for-embedding/loss-in-pipeline-split).
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Megatron's third way: every stage's layers spelled out (--pipeline-model-parallel-layout, "Et|(tt|)*30L":
    # E embedding, t decoder layer, m MTP layer, L loss; see cost_model.nouns.pipeline_layout). Sets VPP by itself.
    pipeline_model_parallel_layout: str | None = None
    # Megatron's EP all-to-all overlap (--overlap-moe-expert-parallel-comm): the combined 1F1B schedule runs one
    # micro-batch's dispatch and combine under another's compute.
    overlap_moe_expert_parallel_comm: bool = False

    def __post_init__(self):
        etp_defaulted = self.etp is None
        if etp_defaulted:
            object.__setattr__(self, "etp", self.tp)
        for name, value in zip(_POSITIVE_NAMES, _positive_values(self)):
            if value.__class__ is int and value >= 1:   # the usual case, decided without the checks below
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidLayout(f"{name} must be a positive integer, got {shown(value)}")
        n, tp, pp, cp, ep, etp = self.world_size, self.tp, self.pp, self.cp, self.ep, self.etp
        if n % (tp * pp * cp):
            raise InvalidLayout(f"world size {n} is not divisible by TP x PP x CP = {tp} x {pp} x {cp} = {tp * pp * cp}")
        if n % (etp * ep * pp):
            hint = (f"; ETP was not given and defaults to TP ({tp}) as Megatron's --expert-tensor-parallel-size does: "
                    "etp=1 shards experts by EP alone") if etp_defaulted and etp > 1 else ""
            raise InvalidLayout(f"world size {n} is not divisible by ETP x EP x PP = {etp} x {ep} x {pp} = "
                                f"{etp * ep * pp} (expert grid){hint}")
        if self.vpp > 1 and pp == 1:
            raise InvalidLayout(f"VPP {self.vpp} needs pipeline parallelism (PP > 1), got PP 1")
        self._check_uneven()
        self._check_choices()

    def _check_choices(self):
        """The checks that read the recompute, offload, moments and dispatcher fields (after the shape's)."""
        self._check_recompute()
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise InvalidLayout(f"optimizer_offload_fraction must be in [0, 1], got {self.optimizer_offload_fraction}")
        if self.overlap_d2h_h2d and self.optimizer_offload_fraction == 0:
            raise InvalidLayout("overlap_d2h_h2d needs optimizer CPU offload (optimizer_offload_fraction > 0)")
        if self.exp_avg_dtype not in MOMENT_DTYPES:
            raise InvalidLayout(f"exp_avg_dtype must be one of {', '.join(MOMENT_DTYPES)}, got {shown(self.exp_avg_dtype)}")
        if self.exp_avg_dtype != "fp32" and self.offloaded:
            raise InvalidLayout("bf16 Adam moments apply to the GPU-resident optimizer; CPU offload keeps fp32 moments")
        if self.dispatcher not in DISPATCHERS:
            raise InvalidLayout(f"dispatcher must be one of {', '.join(DISPATCHERS)}, got {shown(self.dispatcher)}")
        ep, etp = self.ep, self.etp
        if self.dispatcher == "flex" and ep * etp == 1:
            raise InvalidLayout(f"the flex dispatcher needs EP x ETP > 1, got EP {ep} x ETP {etp}")
        self._check_ep_overlap()

    def with_choices(self, max_tokens_per_gpu: int, rows_per_microbatch: int, **choices) -> "Layout":
        """This layout's parallel shape with another micro-batch and other choices (CHOICE_FIELDS given, the rest at
        their defaults): only the choices' checks are run, the shape's passed when this one was built (a space builds
        each parallel shape under every recompute, offload and dispatcher choice)."""
        if not choices.keys() <= _CHOICE_DEFAULTS.keys():
            return replace(self, max_tokens_per_gpu=max_tokens_per_gpu, rows_per_microbatch=rows_per_microbatch,
                           **{**_CHOICE_DEFAULTS, **choices})
        out = self.with_microbatch(max_tokens_per_gpu, rows_per_microbatch)
        d = out.__dict__
        for name in _CHOICE_DERIVED:   # worked out again from the new choices when read
            d.pop(name, None)
        d.update(_CHOICE_DEFAULTS)
        d.update(choices)
        out._check_choices()
        return out

    def with_microbatch(self, max_tokens_per_gpu: int, rows_per_microbatch: int) -> "Layout":
        """This layout with another micro-batch: the other fields passed their checks when it was built and no check
        or derived size reads the micro-batch but for being a positive integer, so they are not run again (a space
        builds each parallel shape's layouts at every micro-batch size)."""
        if not (max_tokens_per_gpu.__class__ is int and max_tokens_per_gpu >= 1
                and rows_per_microbatch.__class__ is int and rows_per_microbatch >= 1):
            return replace(self, max_tokens_per_gpu=max_tokens_per_gpu, rows_per_microbatch=rows_per_microbatch)
        out = object.__new__(Layout)
        d = out.__dict__
        d.update(self.__dict__)   # the fields and the derived sizes worked out so far (none reads the micro-batch)
        d.pop("_key", None)       # but the key, which reads every field
        d["max_tokens_per_gpu"], d["rows_per_microbatch"] = max_tokens_per_gpu, rows_per_microbatch
        return out

    def _check_ep_overlap(self):
        """TransformerConfig's checks of overlap_moe_expert_parallel_comm that need only the layout."""
        on = self.overlap_moe_expert_parallel_comm
        if not isinstance(on, bool):
            raise InvalidLayout(f"overlap_moe_expert_parallel_comm must be true or false, got {shown(on)}")
        if not on:
            return
        if self.ep == 1:
            raise InvalidLayout("overlap_moe_expert_parallel_comm needs expert parallelism (EP > 1), got EP 1")
        if self.recompute_granularity == "full":
            raise InvalidLayout("overlap_moe_expert_parallel_comm cannot run with full recompute (Megatron)")
        if "moe" in self.recompute_modules:
            raise InvalidLayout("overlap_moe_expert_parallel_comm cannot run with the 'moe' recompute module (Megatron)")
        if self.pp > 1 and self.vpp == 1:
            raise InvalidLayout(f"overlap_moe_expert_parallel_comm with PP {self.pp} needs an interleaved pipeline "
                                f"(VPP > 1, Megatron), got VPP 1")

    def _check_uneven(self):
        first, last, embedding, loss, text = _split_values(self)
        if first is None and last is None and embedding is False and loss is False and text is None:
            return   # an even split by count (most layouts): nothing below can fail
        for name in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidLayout(f"{name} must be a positive integer or unset, got {shown(value)}")
            if self.pp == 1:
                raise InvalidLayout(f"{name} {value} needs pipeline parallelism (PP > 1), got PP 1")
            if value % self.vpp:
                raise InvalidLayout(f"{name} {value} must be divisible by VPP {self.vpp} (each virtual stage of "
                                    f"that pipeline stage holds as many layers)")

        text = self.pipeline_model_parallel_layout
        if text is not None:
            if self.uneven or self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split:
                raise InvalidLayout("pipeline_model_parallel_layout cannot be set together with decoder_first/last_"
                                    "pipeline_num_layers or account_for_embedding/loss_in_pipeline_split (Megatron)")
            if not isinstance(text, str):
                raise InvalidLayout(f"pipeline_model_parallel_layout must be a string like 'Et|(tt|)*30L', got {shown(text)}")
            try:
                stages = parse_stages(text)
            except InvalidPipelineLayout as e:
                raise InvalidLayout(str(e)) from None
            if len(stages) % self.pp:
                raise InvalidLayout(f"pipeline_model_parallel_layout '{text}' has {len(stages)} stages, not a "
                                    f"multiple of PP {self.pp}")
            if len(stages) // self.pp != self.vpp:
                raise InvalidLayout(f"pipeline_model_parallel_layout '{text}' has {len(stages)} stages; PP {self.pp} "
                                    f"x VPP {self.vpp} needs {self.pp * self.vpp}")
        accounts = [name for name in ACCOUNT_FIELDS if getattr(self, name)]
        for name in ACCOUNT_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidLayout(f"{name} must be true or false, got {shown(getattr(self, name))}")
        if accounts and self.pp == 1:
            raise InvalidLayout(f"{accounts[0]} needs pipeline parallelism (PP > 1), got PP 1")
        if accounts and self.uneven:
            # transformer_config.py: "cannot be set at the same time with account_for_embedding_in_pipeline_split"
            raise InvalidLayout("decoder_first/last_pipeline_num_layers and account_for_embedding/loss_in_pipeline_"
                                "split cannot be set together (Megatron)")

    @property
    def uneven(self) -> bool:
        return self.decoder_first_pipeline_num_layers is not None or self.decoder_last_pipeline_num_layers is not None

    @property
    def split_set(self) -> bool:
        """Any of Megatron's pipeline-split arguments set (the layers are not split evenly by count alone)."""
        return (self.uneven or self.account_for_embedding_in_pipeline_split or self.account_for_loss_in_pipeline_split
                or self.pipeline_model_parallel_layout is not None)

    def _check_recompute(self):
        g, m, k, mods = self.recompute_granularity, self.recompute_method, self.recompute_num_layers, self.recompute_modules
        if g not in RECOMPUTE_GRANULARITIES:
            raise InvalidLayout(f"recompute_granularity must be full, selective or none, got {shown(g)}")
        if g == "full":
            if m not in RECOMPUTE_METHODS:
                raise InvalidLayout(f"full recompute needs recompute_method uniform or block, got {shown(m)}")
            if not isinstance(k, int) or k < 1:
                raise InvalidLayout(f"full recompute needs recompute_num_layers >= 1, got {shown(k)}")
            if mods:
                raise InvalidLayout(f"recompute_modules {list(mods)} apply to selective recompute only, not full")
        elif g == "selective":
            if m is not None or k is not None:
                raise InvalidLayout(
                    f"selective recompute takes no recompute_method or recompute_num_layers (got {m!r}, {k!r})")
            unknown = [x for x in mods if x not in RECOMPUTE_MODULES]
            if unknown:
                raise InvalidLayout(f"unknown recompute_modules {unknown}; known: {', '.join(RECOMPUTE_MODULES)}")
            if len(set(mods)) != len(mods):
                raise InvalidLayout(f"recompute_modules {list(mods)} repeat a module")
        elif m is not None or k is not None or mods:
            raise InvalidLayout("recompute_method, recompute_num_layers and recompute_modules need a recompute_granularity")

    # Derived sizes, as torchtitan's ParallelDims derives them. Worked out once per layout (cached_property: the
    # instance's dict answers later reads, as a field does; scoring a space reads them hundreds of thousands of
    # times) and left out of the pickled state (__getstate__).
    @cached_property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    @cached_property
    def edp(self) -> int:
        """Expert data parallel size (MoE parallel folding)."""
        return self.world_size // (self.etp * self.ep * self.pp)

    @cached_property
    def sequence_parallel(self) -> bool:
        # slime always passes --sequence-parallel when TP > 1; Megatron rejects it at TP 1.
        return self.tp > 1

    @cached_property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules selective recompute covers (Megatron's default is core_attn)."""
        if self.recompute_granularity != "selective":
            return ()
        return self.recompute_modules or ("core_attn",)

    @cached_property
    def offloaded(self) -> bool:
        return self.optimizer_offload_fraction > 0

    def __getstate__(self) -> dict:
        """The fields alone: what a layout caches of itself (derived sizes, its key) is worked out again."""
        state = self.__dict__
        return {name: state[name] for name in _KEY_NAMES}

    @property
    def label(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.uneven:   # the layers of the first and last stages: PP4 (15/16/16/14)-style is long; first+last
            first = self.decoder_first_pipeline_num_layers
            last = self.decoder_last_pipeline_num_layers
            parts[-1] += f"[{'' if first is None else first}:{'' if last is None else last}]"
        elif self.pipeline_model_parallel_layout is not None:
            parts[-1] += f"[{self.pipeline_model_parallel_layout}]"
        elif self.split_set:
            parts[-1] += "[" + "+".join(x for x, on in (("E", self.account_for_embedding_in_pipeline_split),
                                                          ("L", self.account_for_loss_in_pipeline_split)) if on) + "]"
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp > 1:
            parts.append(f"ETP{self.etp}")
        parts.append(f"DP{self.dp}")
        return " ".join(parts)

    @property
    def recompute_label(self) -> str:
        if self.recompute_granularity == "full":
            return f"full {self.recompute_method} {self.recompute_num_layers}"
        if self.recompute_granularity == "selective":
            return "selective " + "+".join(self.selective_modules)
        return "none"

    @property
    def long_label(self) -> str:
        """Everything that distinguishes two layouts, in one line."""
        offload = "off" if not self.offloaded else (
            f"{self.optimizer_offload_fraction:g}" + (" overlap" if self.overlap_d2h_h2d else ""))
        adam = "" if self.exp_avg_dtype == "fp32" else f" | adam {self.exp_avg_dtype}"
        overlap = "+overlap" if self.overlap_moe_expert_parallel_comm else ""
        return (f"{self.label} | mt {self.max_tokens_per_gpu} | rc {self.recompute_label} | "
                f"offload {offload} | {self.dispatcher}{overlap}{adam}")

    def key(self) -> str:
        """A stable identity, used to never evaluate the same layout twice in a study (computed once: the
        agent asks it of every candidate at every proposal)."""
        cached = self.__dict__.get("_key")
        if cached is None:
            cached = self._make_key()
            object.__setattr__(self, "_key", cached)
        return cached

    def _make_key(self) -> str:
        # fields added later only when set: keys of studies made before they existed stay the same
        return "|".join(f"{name}={value}" if value.__class__ in _PLAIN else f"{name}={_fmt(value)}"
                        for name, later, value in zip(_KEY_NAMES, _KEY_LATER, _key_values(self))
                        if not (later and value in (None, False)))

    def replace(self, **changes) -> "Layout":
        return replace(self, **changes)


# What a layout chooses beside its parallel shape and micro-batch, with the defaults (Layout.with_choices), and the
# derived values that read them.
CHOICE_FIELDS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
                 "optimizer_offload_fraction", "overlap_d2h_h2d", "dispatcher", "exp_avg_dtype")
_CHOICE_DEFAULTS = {f.name: f.default for f in fields(Layout) if f.name in CHOICE_FIELDS}
_CHOICE_DERIVED = ("selective_modules", "offloaded")

# Layout.key's fields in order, whether each came later, and their values read at once (in C): a study asks the key
# of every candidate
_KEY_NAMES = tuple(f.name for f in fields(Layout))
_KEY_LATER = tuple(name in LATER_FIELDS for name in _KEY_NAMES)
_key_values = attrgetter(*_KEY_NAMES)
_PLAIN = frozenset((int, bool, str, type(None)))   # formatted as str() formats them: _fmt's own answer, without the call


def _fmt(value) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
