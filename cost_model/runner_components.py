"""The megatron runner's step, from its components as `tune profile` measured them on the GPU.

The profile (experiments.checks.runner_components) times the runner's own model, one process on one GPU:
builds of 1 and 2 (or more) layers of each layer kind with a small vocabulary, one of 1 layer with the model's
vocabulary, and one with the optimizer offloaded to the CPU, each at several tokens per micro-batch, with
and without full recompute. Where a kind and depth was built more than once, the latest build counts.
Differences of those builds give:

- a layer's forward-backward seconds per micro-batch (gradient accumulation into the fp32 buffers
  included), and with full recompute, from the 1-layer build and the deepest;
- the micro-batch's ends: embedding, final norm, LM head, cross-entropy and the schedule's own time;
- the per-step work: zeroing gradient buffers and the optimizer step, per parameter and per step;
- the CPU optimizer step per parameter (offload), and CPU Adam per rank with several ranks per host;
- a layer kind's host floor: builds marked `host_floor`, the kind at a shape too small for its GPU work to
  show (hidden 256), whose layer and ends take what the host takes to issue their kernels. They price no
  layer's GPU work (they are nobody's nearest layer) and stay out of the per-step line.

Each component is a host floor and a least-squares line through its measured points (`_point_curve`), looked
up at any token count. Pure
data and arithmetic: no I/O.
"""
from __future__ import annotations

import ast
import math
import statistics
from dataclasses import dataclass, field, fields, replace

from cost_model.nouns.model_spec import LATER_FIELD_DEFAULTS, LAUNCH_ONLY_FIELDS, at_later_default

# Attention kinds a measured layer of another may price (same MLP kind, GPU work ratio modelled): the pair the
# transfer was tried on both ways (benchmarks/layer_transfer.py); MLA and sliding windows are left to the fitted terms.
ACROSS_KINDS = ("full_attention", "linear_attention")

# ModelSpec fields that do not change what one decoder layer computes.
_NOT_LAYER = {"name", "display_name", "model_type", "num_hidden_layers", "vocab_size", "tie_word_embeddings",
              "layer_types", "mlp_types", "hf_repo", "sources", "num_nextn_predict_layers", "vision",
              *LAUNCH_ONLY_FIELDS}


def _written(name: str, value) -> bool:
    """Whether a signature names this field: where it is set (not zero, False, None or empty), and a later field
    where it is not at its default."""
    if name in LATER_FIELD_DEFAULTS:
        return not at_later_default(name, value)
    return value not in (0, False, None, "")


def layer_signature(model, attn_kind: str, mlp_kind: str) -> str:
    """What one layer of this kind computes, as text: two models whose layers match share measurements."""
    dims = ",".join(f"{f.name}={getattr(model, f.name)}" for f in fields(model)
                    if f.name not in _NOT_LAYER and _written(f.name, getattr(model, f.name)))
    return f"{attn_kind}+{mlp_kind}|{dims}"


def signature_dims(signature: str) -> dict:
    """The layer fields a signature names (`layer_signature`'s text back to values)."""
    out = {}
    for item in signature.split("|", 1)[1].split(","):
        if "=" not in item:
            continue
        k, v = item.split("=", 1)
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


def signature_model(model, signature: str):
    """`model` with the layer fields of `signature` (the fields it leaves out are zero/False/None there)."""
    dims = signature_dims(signature)
    changes = {}
    for f in fields(model):
        if f.name in _NOT_LAYER:
            continue
        cur = getattr(model, f.name)
        if f.name in dims:
            changes[f.name] = type(cur)(dims[f.name]) if isinstance(cur, (int, float)) and not isinstance(cur, bool) else dims[f.name]
        elif f.name in LATER_FIELD_DEFAULTS:
            changes[f.name] = LATER_FIELD_DEFAULTS[f.name]    # a signature leaves it out at its default
        elif cur not in (0, False, None, ""):
            changes[f.name] = type(cur)() if not isinstance(cur, bool) else False
    return replace(model, **changes)


@dataclass(frozen=True)
class Curve:
    """Seconds as a function of tokens per micro-batch. With `line`: max(host floor, fixed + per-token x tokens),
    the floor being what the host takes to launch the kernels (the same for any work per kernel); without it, the
    measured points, linear between them."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    floor: float = 0.0
    line: tuple[float, float] | None = None    # (fixed, per-token) seconds of the GPU-bound part

    def __call__(self, tokens: float, work: float = 1.0, on_target=None) -> float:
        """Seconds at `tokens`, the GPU's work per token scaled by `work` (a shard or a layer of another size
        timed on this one's measurement: its kernels are as many, each doing `work` times the work). `on_target`:
        the GPU-bound part's seconds on another GPU type as a function of its measured seconds (`Derivation`);
        the host floor stays as measured."""
        if self.line is not None:
            fixed, slope = self.line
            gpu = max(fixed + slope * tokens * work, 0.0)
            return max(self.floor, on_target(gpu) if on_target else gpu)
        if on_target is not None:
            return on_target(self(tokens, work))
        xs, ys = self.tokens, self.seconds
        tokens = tokens * work
        if len(xs) == 1:
            return ys[0] * tokens / xs[0]
        i = 1
        while i < len(xs) - 1 and tokens > xs[i]:
            i += 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        y = y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
        return max(y, 0.0)

    @property
    def span(self) -> str:
        return f"{int(self.tokens[0]):,}-{int(self.tokens[-1]):,} tokens"


@dataclass(frozen=True)
class LayerCurves:
    """One layer kind's measured seconds per micro-batch, without and with full recompute. `borrowed`: taken from
    another profile of this GPU type (`RunnerComponents.with_layers_of`), said where; `derived`: that profile's
    derivation, where its builds were measured on another GPU type."""

    model: str
    none: Curve
    full: Curve | None
    borrowed: str = ""
    derived: Derivation | None = None


@dataclass(frozen=True)
class HostFloor:
    """The host's seconds per micro-batch to issue one layer of a kind (without and with full recompute) and a
    micro-batch's ends, from the kind's host-floor builds: the median over their models and token counts."""

    layer_s: float
    layer_full_s: float
    ends_s: float
    models: tuple[str, ...]
    points: int
    composed: str = ""       # for a kind with no host-floor builds: the three measured kinds it adds up from
    borrowed: str = ""       # taken from another profile of this GPU type (RunnerComponents.with_layers_of)


@dataclass(frozen=True)
class Derivation:
    """How components measured on one GPU type price another nobody measured (`tune profile --derive`): by the
    ratios of the two (target over source). A layer's or the ends' GPU time splits into its modelled GEMM,
    attention and delta-rule work, which runs at the compute ratio, and the rest of the measured time (the
    torch-native stack's unfused elementwise passes, gradient accumulation, kernel gaps), run at the `rest` ratio;
    the optimizer's passes over the parameters at the HBM ratio. The host's time to issue kernels is kept as
    measured, and the CPU optimizer too unless `cpu` gives a host measured with the target (the host CPU is not a
    property of the GPU type: it is what a `tune profile` on such a machine measured).

    From datasheets alone `rest` is the HBM ratio (the rest taken as memory-bound). Where one model's builds were
    measured on both types (benchmarks/derivation_check.py --calibrate), `hbm` is their optimizers' ratio and
    `rest` the ratio that prices the builds measured on the target best, `cpu` their offloaded optimizer steps'
    ratio, `calibration` says which builds, and `calibration_sd` is the rms log error left on them. A Gated DeltaNet
    layer's rest (its chunked delta-rule recurrence, gated norm and conv: memory-bound passes of its own) can run at
    another ratio than an attention layer's: `rest_linear`, fitted to a GDN model's builds measured on both types
    with the other ratios held (benchmarks/derivation_check.py --calibrate-linear)."""

    compute: float        # target / source dense bf16 peak
    hbm: float            # target / source HBM bandwidth (the optimizer's memory-bound passes)
    basis: str            # what it was derived from, for the terms' sources
    rest: float | None = None     # target / source for the rest of a layer's and the ends' GPU time (None: hbm)
    cpu: float | None = None      # the target's host over the source's for the CPU optimizer (None: as measured there)
    calibration: str = ""         # the builds measured on both types that `hbm` and `rest` were fitted to
    calibration_sd: float = 0.0   # rms log error of the step on those builds after the fit
    rest_linear: float | None = None   # `rest` for a Gated DeltaNet layer kind (None: rest)
    calibration_linear: str = ""       # the GDN builds measured on both types that `rest_linear` was fitted to

    def __post_init__(self):
        for name in ("compute", "hbm") + tuple(n for n in ("rest", "cpu", "rest_linear") if getattr(self, n) is not None):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"runner_components.derived.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.calibration_sd) and self.calibration_sd >= 0):
            raise ValueError(f"runner_components.derived.calibration_sd must be a number >= 0, "
                             f"got {self.calibration_sd!r}")

    @property
    def rest_ratio(self) -> float:
        return self.hbm if self.rest is None else self.rest

    def rest_for(self, linear: bool) -> float:
        """The rest ratio of a layer: a Gated DeltaNet kind's own where one was fitted."""
        return self.rest_linear if linear and self.rest_linear is not None else self.rest_ratio

    @property
    def error_sd(self) -> float:
        """The log sd the derivation adds to a prediction: a part's time on the target lies between all of it at
        the compute ratio and all at the rest ratio, and the split is modelled, so the truth is taken as anywhere
        between, uniform in log: |log(compute / rest)| / sqrt(12) (0.10 for H100 from H200 by datasheets); a
        calibrated derivation adds the error left on its calibration builds (another model may differ more)."""
        return math.hypot(abs(math.log(self.compute / self.rest_ratio)) / math.sqrt(12), self.calibration_sd)

    @property
    def note(self) -> str:
        fitted = (f" (fitted to {self.calibration}, rms log error {self.calibration_sd:.3f} there)"
                  if self.calibration else "")
        if self.rest_linear is not None:
            fitted += (f", a Gated DeltaNet layer's rest at x{self.rest_linear:.3f}"
                       + (f" (fitted to {self.calibration_linear})" if self.calibration_linear else ""))
        cpu = ("the CPU optimizer as measured there" if self.cpu is None
               else f"the CPU optimizer at x{self.cpu:.3f} (a host measured with this GPU type)")
        return (f"{self.basis}; the runner's builds priced at the compute ratio x{self.compute:.3f} for "
                f"their modelled GEMM, attention and delta-rule work, at x{self.rest_ratio:.3f} for the rest of their "
                f"GPU time and at the HBM ratio x{self.hbm:.3f} for the optimizer{fitted}, the host's launch time "
                f"as measured there, {cpu}; not measured on this GPU type for this model "
                f"(`tune profile --model M` on one measures them)")

    def seconds(self, measured_s: float, compute_s: float, linear: bool = False) -> float:
        """The target GPU's seconds for a part measured as `measured_s` on the source GPU, of which `compute_s`
        (source seconds, modelled) is GEMM/attention work: that at the compute ratio, the rest at the rest ratio
        (`linear`: a Gated DeltaNet layer's, `rest_for`)."""
        compute = min(max(compute_s, 0.0), measured_s)
        return compute / self.compute + (measured_s - compute) / self.rest_for(linear)


@dataclass(frozen=True)
class RunnerComponents:
    """The runner's components measured on one GPU type (a profile's `runner_components` section); with `derived`,
    measured on another type and priced here by `Derivation` (not measured on this one)."""

    layers: dict                 # layer_signature -> LayerCurves
    ends: dict                   # (hidden_size, vocab_size) -> (model name, Curve of a micro-batch's ends)
    optimizer_s_per_param: float
    optimizer_s_per_step: float
    cpu_adam: tuple              # ((ranks per host, parameters/s per rank), ...)
    seq_len: int
    source: str
    offload_s_per_param: float | None = None   # the optimizer step's extra seconds per parameter on the CPU (1 rank)
    host_floors: dict = field(default_factory=dict)   # "attn+mlp" -> HostFloor
    derived: Derivation | None = None

    @property
    def optimizer_s_per_param_here(self) -> float:
        """The optimizer step's seconds per parameter on this GPU type: Adam's and the grad norm's passes over the
        parameters are memory-bound (the HBM ratio where the components were derived)."""
        return self.optimizer_s_per_param / (self.derived.hbm if self.derived is not None else 1.0)

    @property
    def _host_cpu(self) -> float:
        """This GPU type's host over the one that measured the components, for the CPU optimizer."""
        return (self.derived.cpu or 1.0) if self.derived is not None else 1.0

    @property
    def offload_s_per_param_here(self) -> float | None:
        """The offloaded optimizer step's seconds per parameter on this GPU type's host (`Derivation.cpu`)."""
        return None if self.offload_s_per_param is None else self.offload_s_per_param / self._host_cpu

    def layer(self, signature: str) -> LayerCurves | None:
        return self.layers.get(signature)

    def layer_for(self, model, attn_kind: str, mlp_kind: str) -> tuple[str | None, LayerCurves] | None:
        """What prices `model`'s layer of this kind: (None, its own measured curves), else `nearest`'s (the measured
        layer's signature, its curves); None where the fitted terms price it."""
        curves = self.layer(layer_signature(model, attn_kind, mlp_kind))
        return (None, curves) if curves is not None else self.nearest(attn_kind, mlp_kind, model)

    def derivation_of(self, curves: LayerCurves) -> Derivation | None:
        """How a layer's measured curves price this GPU type: its own profile's derivation where it was borrowed,
        else these components'."""
        return curves.derived if curves.borrowed else self.derived

    def derivation_for(self, model) -> Derivation | None:
        """The derivation that prices `model`'s layers here, if any: these components', else that of a layer
        borrowed from a derived profile (`with_layers_of`)."""
        if self.derived is not None:
            return self.derived
        for attn_kind, mlp_kind in dict.fromkeys(zip(model.layer_types, model.mlp_types)):
            found = self.layer_for(model, attn_kind, mlp_kind)
            if found is not None and found[1].borrowed and found[1].derived is not None:
                return found[1].derived
        return None

    def with_layers_of(self, other: RunnerComponents, where: str) -> RunnerComponents:
        """These components, with `other`'s measured layers and host floors of the kinds these lack (a user's
        `tune profile --model A` priced against model B: B's layer kinds from the shipped profile of the GPU type
        rather than from the fitted terms), and `other`'s layers of B's own shape where these have its kind only
        from another model (B's own layer, derived, rather than A's scaled to B: Mixtral-8x7B's H100 runs from the
        Qwen3.6 profile of that H100 came out 12.9% off, 2.8% from its own derived builds), each marked as borrowed
        from `where` and priced by `other`'s derivation where it has one. These components' own measurements win
        wherever both have a layer, and in a kind they measured they alone price a layer neither ran (same_kind)."""
        borrowed = {sig: replace(c, borrowed=c.borrowed or where, derived=other.derivation_of(c))
                    for sig, c in other.layers.items() if sig not in self.layers}
        floors = {k: replace(f, borrowed=f.borrowed or where) for k, f in other.host_floors.items()
                  if k not in self.host_floors}
        if not borrowed and not floors:
            return self
        return replace(self, layers={**self.layers, **borrowed}, host_floors={**self.host_floors, **floors})

    def host_floor(self, attn_kind: str, mlp_kind: str) -> HostFloor | None:
        """The host floor measured for this layer kind; for a kind with no host-floor builds, composed from three
        measured kinds (the host issues a layer's kernels one by one, so a layer's launches add up by part: this
        attention kind's launches over another MLP kind, plus this MLP kind's under another attention kind, less
        the two others' together), e.g. dense Gated DeltaNet = dense softmax + GDN MoE - softmax MoE; else none."""
        floor = self.host_floors.get(f"{attn_kind}+{mlp_kind}")
        if floor is not None:
            return floor
        split = [k.split("+") for k in self.host_floors]
        for a, m in split:
            same_mlp, same_attn = self.host_floors.get(f"{a}+{mlp_kind}"), self.host_floors.get(f"{attn_kind}+{m}")
            if a == attn_kind or m == mlp_kind or same_mlp is None or same_attn is None:
                continue
            other = self.host_floors[f"{a}+{m}"]
            return HostFloor(layer_s=max(same_mlp.layer_s + same_attn.layer_s - other.layer_s, 0.0),
                             layer_full_s=max(same_mlp.layer_full_s + same_attn.layer_full_s - other.layer_full_s, 0.0),
                             ends_s=same_mlp.ends_s, models=same_mlp.models + same_attn.models + other.models,
                             points=min(same_mlp.points, same_attn.points, other.points),
                             composed=f"{a}+{mlp_kind} + {attn_kind}+{m} - {a}+{m}")
        return None

    def measures_layers_of(self, model) -> bool:
        """Whether every layer kind of `model` has its own measurement (else some layer is timed as another
        model's, its GPU work scaled: a prediction with a larger error, runner_scaled_layer_error_sd)."""
        kinds = set(zip(model.layer_types, model.mlp_types))
        return all(self.layer(layer_signature(model, a, m)) is not None for a, m in kinds)

    def _donor_attention(self, attn_kind: str, mlp_kind: str) -> list[str]:
        """The other attention kinds whose measured layers of this MLP kind may price a layer of this kind: only
        between the kinds the transfer was tried on (ACROSS_KINDS)."""
        if attn_kind not in ACROSS_KINDS:
            return []
        return sorted({a for a, m in (sig.split("|")[0].split("+") for sig in self.layers)
                       if m == mlp_kind and a != attn_kind and a in ACROSS_KINDS})

    def unmeasured_kinds(self, model) -> tuple[list[str], list[str]]:
        """The layer kinds of `model` without a measured layer of their own kind: (those a measured layer of their MLP
        kind with another attention kind prices: `nearest`; those the fitted terms price)."""
        kinds = dict.fromkeys(zip(model.layer_types, model.mlp_types))
        measured = {sig.split("|")[0] for sig in self.layers}
        unmeasured = {f"{a}+{m}": bool(self._donor_attention(a, m)) for a, m in kinds if f"{a}+{m}" not in measured}
        return [k for k, donor in unmeasured.items() if donor], [k for k, donor in unmeasured.items() if not donor]

    def nearest(self, attn_kind: str, mlp_kind: str, model) -> tuple[str, LayerCurves] | None:
        """The measured layer that prices a layer the profile did not run: of its kind (`same_kind`), else of its MLP
        kind with another attention kind where the transfer was tried (their GPU work ratio modelled: leave-kind-out
        on the H200 builds, benchmarks/layer_transfer.py), else none (the fitted terms price it)."""
        near = self.same_kind(attn_kind, mlp_kind, model)
        if near is not None:
            return near
        found = [f for f in (self.same_kind(a, mlp_kind, model) for a in self._donor_attention(attn_kind, mlp_kind))
                 if f is not None]
        return min(found, key=lambda sc: _layer_distance(signature_dims(sc[0]), model)) if found else None

    def same_kind(self, attn_kind: str, mlp_kind: str, model) -> tuple[str, LayerCurves] | None:
        """The measured layer of this kind nearest `model`'s (for a model the profile did not run): nearest in
        the log of every size that sets a layer's kernels (`NEAR_DIMS`), so Mixtral-8x7B's layer is priced
        from Mixtral-8x22B's, not from a 128-expert one of the same hidden size. Its host floor is the lowest
        measured for the kind: a larger donor's first point is GPU work, not host launch time (leave-one-model-
        out on the H200 builds, benchmarks/layer_transfer.py: Mixtral-8x7B at 4k tokens 55% over without)."""
        prefix = f"{attn_kind}+{mlp_kind}|"
        found = [(sig, c) for sig, c in self.layers.items() if sig.startswith(prefix)]
        own = [(sig, c) for sig, c in found if not c.borrowed]
        found = own or found    # a kind measured here is priced from these measurements, not a borrowed layer
        if not found:
            return None
        sig, curves = min(found, key=lambda sc: _layer_distance(signature_dims(sc[0]), model))
        host = self.host_floor(attn_kind, mlp_kind)
        return sig, replace(curves, none=_lowest_floor(curves.none, [c.none for _, c in found], host and host.layer_s),
                            full=_lowest_floor(curves.full, [c.full for _, c in found], host and host.layer_full_s))

    def cpu_adam_rate(self, ranks_per_host: int) -> float:
        """CPU Adam parameters/s of one rank when `ranks_per_host` ranks step at once: measured at 1, 2, 4
        ranks, beyond them the last rate shared by the extra ranks; on a derived GPU type's host, x `cpu`."""
        here = self._host_cpu
        points = sorted(self.cpu_adam)
        for ranks, rate in points:
            if ranks >= ranks_per_host:
                return rate * here
        ranks, rate = points[-1]
        return rate * here * ranks / ranks_per_host


# The sizes that set what one layer's kernels do: the nearest measured layer of a kind is the one closest in
# the sum of |log| ratios of these (0 where a model has none, so a shared expert counts).
NEAR_DIMS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
             "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")


def _layer_distance(dims: dict, model) -> float:
    moe = bool(getattr(model, "num_experts", 0))
    total = 0.0
    for name in NEAR_DIMS:
        if moe and name == "intermediate_size":
            continue  # an MoE layer's dense size is unused (Qwen3-30B-A3B's 6144)
        a, b = float(dims.get(name, 0) or 0), float(getattr(model, name, 0) or 0)
        total += abs(math.log((a + 1) / (b + 1)))
    return total


def _lowest_floor(curve: Curve | None, curves: list, host_s: float | None = None) -> Curve | None:
    """`curve` with the lowest floor of `curves`, and no higher than `host_s` (the kind's host floor measured by its
    host-floor builds, where there are any): a donor's own first points are its GPU work where it is the larger
    layer, and a kind measured on one model alone has no other floor to take."""
    floors = [c.floor for c in curves if c is not None] + ([host_s] if host_s is not None else [])
    if curve is None or not floors:
        return curve
    return replace(curve, floor=min(curve.floor, min(floors)))


# An extra host-bound point must cut the summed squared relative error by this much (about 2% rms on one point)
HOST_BOUND_POINT_GAIN = 5e-4


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(fixed, per-token) of the least-squares line through the points."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _line_through(xs: list[float], ys: list[float], min_fixed: float) -> tuple[float, float]:
    """(fixed, per-token) of the least-squares line, its fixed part at least `min_fixed` (a cost every
    micro-batch pays whatever its tokens: the line's intercept is the least certain thing the points give)."""
    fixed, slope = _line(xs, ys)
    if fixed < min_fixed:
        fixed = min_fixed
        slope = sum(x * (y - fixed) for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return fixed, slope


def _point_curve(points: dict, min_fixed: float = 0.0) -> Curve | None:
    """A component's seconds per micro-batch through its measured (tokens, seconds) points, kept at those tokens:
    max(host floor, fixed + per-token). At few tokens a layer is bound by the host launching its kernels (the
    marginal layer of the 1- and 2-layer builds costs as much at 4k tokens as at 8k on the MoE and GDN layers),
    above that by the GPU: the first k points (k from 0, as long as each cuts the squared relative error by
    HOST_BOUND_POINT_GAIN) are the floor, the least-squares line runs through the rest. A difference of two
    builds carries both builds' noise, and a line keeps what the points agree on (Llama3-8B's 16k-token layer
    read 7% dearer per token than its 8k one); a line through host-bound points too overstates the fixed cost
    (Qwen3.6's GDN layer at 8k tokens by 17%). The line's fixed part is at least `min_fixed`: what the component
    pays per micro-batch whatever its tokens (its parameters' gradient accumulation), which points dominated by
    per-token work leave uncertain."""
    xs = sorted(points)
    if len(xs) < 3:
        return Curve(tuple(float(x) for x in xs), tuple(float(points[x]) for x in xs)) if xs else None
    ys = [float(points[x]) for x in xs]
    best = None
    for k in range(len(xs) - 2):
        fixed, slope = _line_through(xs[k:], ys[k:], min_fixed)
        if k == 0:
            fixed, slope = max(fixed, 0.0), max(slope, 0.0)
        floor = max(ys[:k], default=0.0)
        fit = [max(floor, fixed + slope * x, 0.0) for x in xs]
        err = sum(((f - y) / y) ** 2 for f, y in zip(fit, ys) if y > 0) + HOST_BOUND_POINT_GAIN * k
        if slope >= 0 and (best is None or err < best[0]):
            best = (err, fit, floor, (fixed, slope))
    _, fit, floor, line = best
    return Curve(tuple(float(x) for x in xs), tuple(fit), floor, line)


# Bytes a parameter's gradient accumulation moves per micro-batch: the bf16 gradient read, the fp32 main
# gradient read and written (megatron's DDP without gradient-accumulation fusion).
GRAD_ACCUMULATION_BYTES = 2 + 4 + 4


def parse_runner_components(section: dict, hbm_bytes_per_s: float | None = None) -> RunnerComponents:
    """Derive the components from the measured builds (differences of 1- and 2-layer builds, see the module
    docstring). With `hbm_bytes_per_s` (the profile's measured copy rate) a layer's and the ends' fixed cost per
    micro-batch is at least their parameters' gradient accumulation at that rate. Raises KeyError/TypeError/
    ValueError on a malformed section (the profile parser reports it)."""
    derived = section.get("derived")
    if derived is not None:
        if not isinstance(derived, dict) or not {"compute", "hbm", "basis"} <= set(derived):
            raise ValueError("runner_components.derived must be a mapping of compute, hbm and basis (the ratios of "
                             "the GPU type it prices to the one that measured the builds, and what they come from)")
        derived = Derivation(float(derived["compute"]), float(derived["hbm"]), str(derived["basis"]),
                             None if derived.get("rest") is None else float(derived["rest"]),
                             None if derived.get("cpu") is None else float(derived["cpu"]),
                             str(derived.get("calibration") or ""), float(derived.get("calibration_sd") or 0.0),
                             None if derived.get("rest_linear") is None else float(derived["rest_linear"]),
                             str(derived.get("calibration_linear") or ""))
    if derived is not None and hbm_bytes_per_s:
        hbm_bytes_per_s /= derived.hbm    # the builds ran on the source GPU: its copy rate bounds their fixed costs
    accumulate = GRAD_ACCUMULATION_BYTES / hbm_bytes_per_s if hbm_bytes_per_s else 0.0
    mb = int(section["microbatches"])
    offloaded = [b for b in section["builds"] if b.get("offload")]
    floor_builds = [b for b in section["builds"] if b.get("host_floor") and not b.get("offload")]
    builds = [b for b in section["builds"] if not b.get("offload") and not b.get("host_floor")]

    small = {}
    for b in builds:
        if int(b["vocab"]) < 4096:
            small[(b["signature"], int(b["layers"]))] = b
    layers, first_kind = {}, {}
    for (sig, n), one in small.items():
        more = [k for s2, k in small if s2 == sig and k > n]
        if n != 1 or not more:
            continue
        two, extra = small[(sig, max(more))], max(more) - 1
        per_layer = (float(two["params"]) - float(one["params"])) / extra
        curves = []
        for full in (False, True):
            a, b2 = _per_microbatch(one, full, mb), _per_microbatch(two, full, mb)
            curves.append(_point_curve({t: max(b2[t] - a[t], 0.0) / extra for t in a if t in b2},
                                       per_layer * accumulate))
        if curves[0] is not None:
            layers[sig] = LayerCurves(str(one["model"]), curves[0], curves[1])
            first_kind.setdefault(str(one["model"]), sig)
    ends = {}
    for b in builds:
        if int(b["vocab"]) < 4096 or int(b["layers"]) != 1 or b["signature"] not in layers:
            continue
        layer = layers[b["signature"]].none
        per_mb = {t: s - layer(t) for t, s in _per_microbatch(b, False, mb).items()}
        tables = float(b["params"]) - float(small[(b["signature"], 1)]["params"])   # the model's vocabulary's rows
        curve = _point_curve(per_mb, max(tables, 0.0) * accumulate)
        if curve is not None:
            ends[(int(b["hidden_size"]), int(b["vocab"]))] = (str(b["model"]), curve)
    # The per-step work against the build's parameter count: a least-squares line through every build.
    xs, ys = [], []
    for b in builds:
        steps = [p["zero_grad_s"] + p["optimizer_s"] for p in b["points"]]
        if steps:
            xs.append(float(b["params"]))
            ys.append(statistics.median(steps))
    intercept, slope = _line(xs, ys) if len(set(xs)) > 1 else (0.0, 0.0)
    intercept = max(intercept, 0.0)
    # The offloaded optimizer: its step's extra seconds per parameter over the GPU step's line (one rank on the
    # host: CPU Adam and the copies both ways as megatron's HybridDeviceOptimizer runs them).
    per_param = [(statistics.median(p["zero_grad_s"] + p["optimizer_s"] for p in b["points"])
                  - (intercept + slope * float(b["params"]))) / float(b["params"]) / float(b.get("offload", 1.0))
                 for b in offloaded if b["points"]]
    offload = statistics.median(per_param) if per_param else None
    cpu = tuple((int(p["ranks"]), float(p["params_per_s_per_rank"])) for p in section.get("cpu_adam_ranks") or ())
    source = (f"measured: runner components on {section.get('device', '?')} ({section.get('date', '?')}, "
              f"megatron-core {section.get('megatron_core', '?')}, torch {section.get('torch', '?')})")
    return RunnerComponents(layers, ends, slope, intercept, cpu, int(section["seq_len"]), source, offload,
                            _host_floors(floor_builds, mb), derived)


def _per_microbatch(build: dict, full: bool, mb: int) -> dict:
    """A build's forward-backward seconds per micro-batch by tokens, with or without full recompute (`mb`: the
    section's micro-batches per timed step, where the build does not give its own)."""
    n = int(build.get("microbatches", mb))
    return {p["tokens"]: p["fwd_bwd_s"] / n for p in build["points"] if bool(p.get("full_recompute")) == full}


def _host_floors(builds: list[dict], mb: int) -> dict:
    """Per layer kind, the host's time for one layer and for a micro-batch's ends, from the host-floor builds:
    per model the deepest build less the 1-layer one over the extra layers (a layer) and the 1-layer build less
    that (the ends), per token count; the median over the kind's models and token counts (a host's timings
    jitter by tens of percent from point to point; the GPU work these shapes do is a few percent of them)."""
    by_model: dict = {}
    for b in builds:
        by_model.setdefault((tuple(b["kind"]), str(b["model"])), {})[int(b["layers"])] = b
    per_kind: dict = {}
    for (kind, model), depths in by_model.items():
        if 1 not in depths or len(depths) < 2:
            continue
        deep = max(depths)
        one, many = depths[1], depths[deep]
        acc = per_kind.setdefault("+".join(kind), ([], [], [], []))
        for full, out in ((False, acc[0]), (True, acc[1])):
            a, b2 = _per_microbatch(one, full, mb), _per_microbatch(many, full, mb)
            for t in a:
                if t in b2:
                    out.append(max(b2[t] - a[t], 0.0) / (deep - 1))
                    if not full:
                        acc[2].append(max(a[t] - out[-1], 0.0))
        acc[3].append(model)
    return {k: HostFloor(statistics.median(v[0]), statistics.median(v[1]) if v[1] else statistics.median(v[0]),
                         statistics.median(v[2]), tuple(v[3]), len(v[0]))
            for k, v in per_kind.items() if v[0]}
