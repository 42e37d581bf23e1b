"""Hardware profiles: rates measured on real GPUs (or derived from a measured one), by shape and size.

A profile is the YAML `tune profile` writes (experiments/checks/hardware_profile.py). This module reads it
and interpolates: GEMM TFLOP/s multilinearly in log2(m, n, k) on the measured grid, grouped GEMM and
attention by rows per expert and sequence length, collective bus bandwidth by message size.
Pure functions of the profile data; reading files happens in `load_profile`.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path


from cost_model.device_memory import DeviceMemory, DeviceMemoryError, parse_device_memory
from cost_model.nouns.hardware import gpu_names
from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import clean_name
from cost_model.runner_components import RunnerComponents, parse_runner_components
from cost_model.nouns.user_file import parse_yaml, read_user_text, unique_containers

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


class ProfileError(AttuneError, ValueError):
    """A profile file that is missing, malformed or of an unknown schema."""


@dataclass(frozen=True)
class Curve:
    """y(x) interpolated linearly in log2(x), clamped at the ends."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1 = math.log2(xs[i - 1]), math.log2(xs[i])
        t = (math.log2(x) - x0) / (x1 - x0)
        return ys[i - 1] + t * (ys[i] - ys[i - 1])

    def scaled(self, factor: float) -> "Curve":
        return Curve(self.xs, tuple(y * factor for y in self.ys))


@dataclass(frozen=True)
class GemmGrid:
    """TFLOP/s on a full m x n x k grid, interpolated multilinearly in log2 space."""

    ms: tuple[int, ...]
    ns: tuple[int, ...]
    ks: tuple[int, ...]
    tflops: tuple[float, ...]  # flattened [m][n][k]

    def __call__(self, m: float, n: float, k: float) -> float:
        (i0, i1, ti), (j0, j1, tj), (l0, l1, tl) = _bracket(self.ms, m), _bracket(self.ns, n), _bracket(self.ks, k)
        nn, nk = len(self.ns), len(self.ks)
        t = self.tflops

        def at(i, j, l):
            return t[(i * nn + j) * nk + l]

        c00 = at(i0, j0, l0) * (1 - tl) + at(i0, j0, l1) * tl
        c01 = at(i0, j1, l0) * (1 - tl) + at(i0, j1, l1) * tl
        c10 = at(i1, j0, l0) * (1 - tl) + at(i1, j0, l1) * tl
        c11 = at(i1, j1, l0) * (1 - tl) + at(i1, j1, l1) * tl
        return (c00 * (1 - tj) + c01 * tj) * (1 - ti) + (c10 * (1 - tj) + c11 * tj) * ti


def _bracket(grid: tuple[int, ...], x: float) -> tuple[int, int, float]:
    if x <= grid[0]:
        return 0, 0, 0.0
    if x >= grid[-1]:
        last = len(grid) - 1
        return last, last, 0.0
    i = bisect.bisect_right(grid, x)
    lo, hi = math.log2(grid[i - 1]), math.log2(grid[i])
    return i - 1, i, (math.log2(x) - lo) / (hi - lo)


@dataclass(frozen=True)
class GdnSeries:
    """Measured Gated DeltaNet kernel (fla chunk_gated_delta_rule) times for one head configuration:
    seconds per token over tokens (forward and forward+backward), interpolated in log2(tokens) and
    held at the ends (time grows linearly with tokens outside the measured range)."""

    qk_heads: int
    v_heads: int
    key_head_dim: int
    value_head_dim: int
    fwd_s_per_token: Curve
    fwd_bwd_s_per_token: Curve


@dataclass(frozen=True)
class GdnKernel:
    """The profile's measured linear-attention kernel: its series and where they come from."""

    series: tuple[GdnSeries, ...]
    source: str

    def series_for(self, v_heads: int) -> GdnSeries:
        """Megatron and HF both call the kernel with q and k repeated to the value heads: prefer a series
        measured that way, then the one with the most value heads."""
        return max(self.series, key=lambda s: (s.qk_heads == s.v_heads, s.v_heads == v_heads, s.v_heads))

    def seconds(self, tokens: float, v_heads: float, key_head_dim: int, value_head_dim: int,
                backward: bool = True) -> float:
        """Kernel seconds for `tokens` tokens over `v_heads` value heads, scaled from the measured
        series by heads and by the state size (key x value head dims)."""
        s = self.series_for(int(round(v_heads)))
        per_token = (s.fwd_bwd_s_per_token if backward else s.fwd_s_per_token)(tokens)
        scale = v_heads / s.v_heads * (key_head_dim * value_head_dim) / (s.key_head_dim * s.value_head_dim)
        return per_token * tokens * scale


@dataclass(frozen=True)
class HardwareProfile:
    gpu_type: str
    provenance: str                   # measured or derived
    source: str
    date: str
    device: str
    count: int
    gemm_bf16: GemmGrid
    fp8_speedup: float                # fp8 over bf16 TFLOP/s: the largest measured ratio (or the profile's figure)
    grouped: dict                     # (k, n) -> Curve of fwd+bwd TFLOP/s over rows per expert
    attention: dict                   # head_dim -> Curve of fwd+bwd TFLOP/s over sequence length
    linear_attention_efficiency: float
    hbm_copy_tb_s: float
    h2d_gb_s: float
    d2h_gb_s: float
    cpu_adam_params_per_s: float
    cpu_adam_threads: int
    collectives: dict                 # op -> Curve of bus bandwidth (GB/s) over message bytes
    collective_gpus: int              # GPUs the collective curves were measured on
    collectives_source: str = ""      # where the curves come from when not from this profile's own GPUs
    gdn: GdnKernel | None = None      # measured Gated DeltaNet kernel times (None: the efficiency estimate)
    device_memory: DeviceMemory | None = None   # measured capacity and memory outside the model's tensors
    raw: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    # (m, n, k, fp8 / bf16 TFLOP/s) at each measured fp8 GEMM shape; empty: fp8_speedup for every shape
    fp8_points: tuple[tuple[float, float, float, float], ...] = ()
    runner: RunnerComponents | None = None      # the megatron runner's step components, measured on this GPU

    def gemm_tflops(self, m: float, n: float, k: float, precision: str = "bf16") -> float:
        tf = self.gemm_bf16(m, n, k)
        return tf * self.fp8_ratio(m, n, k) if precision == "fp8" else tf

    def fp8_ratio(self, m: float, n: float, k: float) -> float:
        """fp8 over bf16 speed at this GEMM shape: the ratio measured at the nearest fp8 shape (log distance
        in m, n and k), never extrapolated; a small GEMM gains less from fp8 than the largest square one."""
        if not self.fp8_points:
            return self.fp8_speedup
        point = min(self.fp8_points, key=lambda p: abs(math.log2(p[0] / max(m, 1))) + abs(math.log2(p[1] / max(n, 1)))
                    + abs(math.log2(p[2] / max(k, 1))))
        return point[3]

    def grouped_tflops(self, rows_per_expert: float, k: float, n: float) -> float:
        key = min(self.grouped, key=lambda kn: abs(math.log2(kn[0] / k)) + abs(math.log2(kn[1] / n)))
        return self.grouped[key](rows_per_expert)

    def attention_tflops(self, seq: float, head_dim: float) -> float:
        key = min(self.attention, key=lambda d: abs(math.log2(d / head_dim)))
        return self.attention[key](seq)

    def busbw_gb_s(self, op: str, nbytes: float) -> float:
        curve = self.collectives.get(op) or self.collectives.get("all_gather")
        return curve(nbytes)

    def digest(self) -> str:
        """A short digest of what the profile file holds (`content_digest`): a study records it, so a resume with
        another profile's figures under the same name is refused."""
        return content_digest(self.raw)

    def summary(self) -> dict:
        """The headline figures `tune gpus --json` shows."""
        big = self.gemm_bf16(self.gemm_bf16.ms[-1], self.gemm_bf16.ns[-1], self.gemm_bf16.ks[-1])
        out = {"provenance": self.provenance, "source": self.source, "date": self.date, "device": self.device,
               "gpus": self.count, "gemm_bf16_large_tflops": round(big, 1),
               "gemm_bf16_8192_tflops": round(self.gemm_bf16(8192, 8192, 8192), 1),
               "hbm_copy_tb_s": self.hbm_copy_tb_s, "h2d_gb_s": self.h2d_gb_s}
        for op in ("all_reduce", "all_to_all"):
            if op in self.collectives:
                out[f"{op}_busbw_gb_s_at_256MB"] = round(self.collectives[op](256 * 2 ** 20), 1)
        if self.runner is not None:
            d = self.runner.derived
            out["runner_components"] = (self.runner.source if d is None else
                                        d.basis + (f" (fitted to {d.calibration})" if d.calibration else ""))
        return out


# Measured rates and sizes the model divides by or takes the log of: each must be a positive finite number.
POSITIVE_FIELDS = frozenset({"tflops", "fwd_tflops", "fwd_bwd_tflops", "hbm_copy_tb_s", "h2d_gb_s", "d2h_gb_s",
                             "params_per_s", "busbw_gb_s", "fwd_ms", "fwd_bwd_ms", "tokens", "bytes", "m", "n", "k",
                             "seq", "rows_per_expert", "head_dim", "gpus", "count", "qk_heads", "v_heads",
                             "key_head_dim", "value_head_dim", "fp8_speedup", "efficiency"})
# The numbers a rate of at most this much is a typo (or an attack) rather than a measurement.
MAX_PROFILE_NUMBER = 1e18
MIN_PROFILE_NUMBER = 1e-6


def _check_number(value, key, where: str, origin: str) -> None:
    if key in POSITIVE_FIELDS and value is not None and (isinstance(value, bool)
                                                          or not isinstance(value, (int, float))):
        shown = repr(value) if isinstance(value, (str, bool)) else type(value).__name__
        raise ProfileError(f"{origin}: {where} must be a number, got {shown[:40]}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, int) and abs(value) > MAX_PROFILE_NUMBER:
        raise ProfileError(f"{origin}: {where} is {str(value)[:40]}, larger than {MAX_PROFILE_NUMBER:g}")
    if not math.isfinite(value):
        raise ProfileError(f"{origin}: {where} is {value}, not a finite number")
    if key in POSITIVE_FIELDS and value <= 0:
        raise ProfileError(f"{origin}: {where} must be positive, got {value}")
    if key in POSITIVE_FIELDS and not MIN_PROFILE_NUMBER <= value <= MAX_PROFILE_NUMBER:
        # 3e-308 GB/s or 1e300 TFLOP/s is no measurement; its reciprocal overflows the step time
        raise ProfileError(f"{origin}: {where} is {value:g}, outside {MIN_PROFILE_NUMBER:g} to {MAX_PROFILE_NUMBER:g}")
    if key == "efficiency" and value > 1:
        raise ProfileError(f"{origin}: {where} is a share of the peak, at most 1, got {value}")


def _size(point: dict, key: str, origin: str) -> int:
    """A dimension of a measured point (k, n, head_dim): a whole number of at least 1."""
    value = point[key]
    if value is None or value < 1 or value != int(value):
        raise ProfileError(f"{origin}: {key} must be a whole number of at least 1, got {repr(value)[:40]}")
    return int(value)


def check_numbers(data, origin: str) -> None:
    """Every number in the profile finite; the rates and sizes in POSITIVE_FIELDS numbers above zero
    (a string or a boolean where one belongs is refused, not converted)."""
    for container, path in unique_containers(data):
        pairs = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in pairs:
            if isinstance(value, (dict, list)):
                continue
            where = (f"{path}.{key}" if path else str(key)) if isinstance(container, dict) else f"{path}[{key}]"
            _check_number(value, key if isinstance(container, dict) else None, where, origin)


def _require_curves(grouped: dict, attention: dict, collectives: dict, origin: str) -> None:
    """The sections the model reads a rate from at every layout: each needs a measured point."""
    for section, found in (("grouped_gemm_bf16", grouped), ("attention_bf16", attention)):
        if not found:
            raise ProfileError(f"{origin}: {section} has no point with fwd_bwd_tflops")
    missing = [op for op in COLLECTIVE_OPS if op not in collectives]
    if missing and "all_gather" not in collectives:   # an op without a curve reads all_gather's (none: 1 GPU)
        raise ProfileError(f"{origin}: collectives has no curve for {', '.join(missing)} and no all_gather "
                           f"curve to stand in for them")


def content_digest(data: dict) -> str:
    """The digest of a profile's parsed content: the same figures written with other spacing, key order, quoting
    or number forms (6.80, 6.8; 2, 2.0) give the same digest. Its free-text `notes` price nothing and are left out."""
    body = _canonical({k: v for k, v in data.items() if k != "notes"})
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _canonical(value):
    """`value` as plain JSON: numbers as floats, mapping keys as strings, anything else (a date) as its text."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return str(value)


# The sections every profile has (`tune profile` writes them), with the fields the model reads from each mapping.
REQUIRED_SECTIONS = {"gemm_bf16": (), "grouped_gemm_bf16": (), "attention_bf16": (),
                     "memory": ("hbm_copy_tb_s", "h2d_gb_s", "d2h_gb_s"), "cpu_adam": ("params_per_s",)}


PROVENANCES = ("measured", "derived")


def check_sections(data: dict, origin: str) -> None:
    """A hand-edited profile missing a section or one of its figures, or with a non-string gpu_type, is refused in
    one line naming it (not a KeyError)."""
    for key, what in (("gpu_type", "a GPU type name such as h200"), ("provenance", "measured or derived")):
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            shown = "nothing" if value is None else f"{type(value).__name__} {repr(value)[:40]}"
            raise ProfileError(f"{origin}: {key} must be {what}, got {shown}")
    if data["provenance"] not in PROVENANCES:   # it heads every figure's label: measured, or derived from one
        raise ProfileError(f"{origin}: provenance must be measured or derived, got {repr(data['provenance'])[:40]}")
    for section, fields in REQUIRED_SECTIONS.items():
        value = data.get(section)
        if value is None:
            raise ProfileError(f"{origin}: the {section} section is missing (every profile `tune profile` "
                               f"writes has it)")
        kind = dict if fields else list
        if not isinstance(value, kind):
            raise ProfileError(f"{origin}: the {section} section must be a {'mapping' if fields else 'list'}, "
                               f"got {type(value).__name__}")
        missing = [f for f in fields if value.get(f) is None]
        if missing:
            raise ProfileError(f"{origin}: the {section} section has no {', '.join(missing)}")


def profile_from_dict(data: dict, origin: str = "profile", shipped: bool = False) -> HardwareProfile:
    try:
        if data.get("schema_version") != 1:
            raise ProfileError(f"{origin}: unknown schema_version {repr(data.get('schema_version'))[:40]} (expected 1)")
        check_sections(data, origin)
        check_numbers(data, origin)
        if not [p for p in data["gemm_bf16"] or [] if not p.get("label")]:
            raise ProfileError(f"{origin}: gemm_bf16 has no measured points")
        grid = _grid(data["gemm_bf16"], origin)
        fp8 = _fp8_speedup(data, grid)
        fp8_points = tuple((float(p["m"]), float(p["n"]), float(p["k"]), float(p["tflops"]) / grid(p["m"], p["n"], p["k"]))
                           for p in data.get("gemm_fp8") or [] if float(p.get("tflops") or 0) > 0)
        grouped: dict = {}
        for p in data["grouped_gemm_bf16"]:
            if p.get("fwd_bwd_tflops") is None:
                continue
            shape = (_size(p, "k", origin), _size(p, "n", origin))
            # One curve through every expert count's points (at a repeated rows value, the largest rate last).
            # A curve per expert count was tried (2026-12-05) and measured worse on what it was not fitted to:
            # the public rows' nested median 16.5% -> 23.1%, two held-out runner grids of MoE layers timed as
            # another model's (Spearman 0.93 -> 0.90, 0.90 -> 0.40); the fitted constants absorb this curve.
            grouped.setdefault(shape, []).append((float(p["rows_per_expert"]), float(p["fwd_bwd_tflops"])))
        attention: dict = {}
        for p in data["attention_bf16"]:
            if p.get("fwd_bwd_tflops") is None:
                continue
            attention.setdefault(_size(p, "head_dim", origin), []).append((float(p["seq"]), float(p["fwd_bwd_tflops"])))
        collectives: dict = {}
        gpus = max([int(c["gpus"]) for c in data.get("collectives", [])], default=1)
        for c in data.get("collectives", []):
            if int(c["gpus"]) == gpus:
                collectives.setdefault(c["op"], []).append((float(c["bytes"]), float(c["busbw_gb_s"])))
        curves, collectives_source = {op: _curve(v) for op, v in collectives.items()}, ""
        if not collectives and int(data.get("count", 1)) == 1:
            curves, gpus, collectives_source = _collectives_of_shipped(clean_name(data["gpu_type"]), origin)
        _require_curves(grouped, attention, curves, origin)
        linear = data.get("linear_attention") or {}
        mem, adam = data["memory"], data["cpu_adam"]
        return HardwareProfile(
            # the names reach the terminal, reports and recipes: no control characters
            gpu_type=clean_name(data["gpu_type"]), provenance=clean_name(data["provenance"]),
            source=clean_name(data.get("source", ""), 400), date=clean_name(data.get("date", "")),
            device=clean_name(data.get("device", "")), count=int(data.get("count", 1)),
            gemm_bf16=grid, fp8_speedup=fp8,
            grouped={k: _curve(v) for k, v in grouped.items()},
            attention={k: _curve(v) for k, v in attention.items()},
            linear_attention_efficiency=float(linear.get("efficiency") or 0.15),
            hbm_copy_tb_s=float(mem["hbm_copy_tb_s"]), h2d_gb_s=float(mem["h2d_gb_s"]),
            d2h_gb_s=float(mem["d2h_gb_s"]), cpu_adam_params_per_s=float(adam["params_per_s"]),
            cpu_adam_threads=int(adam.get("threads", 0)),
            collectives=curves, collective_gpus=gpus, collectives_source=collectives_source,
            gdn=_gdn_kernel(linear), device_memory=parse_device_memory(data.get("device_memory"), origin), raw=data,
            fp8_points=fp8_points,
            runner=_runner(data, float(mem["hbm_copy_tb_s"]) * 1e12, shipped, origin))
    except ProfileError:
        raise
    except DeviceMemoryError as e:
        raise ProfileError(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, IndexError, OverflowError) as e:
        raise ProfileError(f"{origin}: malformed profile ({type(e).__name__}: {e})") from None


# A timed point of a build longer than this is no measurement of one layer's step (a typo, or an edit).
MAX_POINT_S = 3600.0
# runner_components' whole counts of at least 1, by where they stand; a point's timed seconds (above zero where work
# was timed, else at least zero)
_RUNNER_COUNTS = {"section": ("microbatches", "seq_len"), "build": ("layers", "vocab", "hidden_size", "params"),
                  "point": ("tokens",), "cpu_adam": ("ranks", "threads_per_rank")}
_POINT_SECONDS = (("fwd_bwd_s", True), ("zero_grad_s", False), ("optimizer_s", False))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_runner_section(section, origin: str) -> None:
    """ProfileError naming the field of a user's runner_components that no measurement could hold: a count that is
    not a whole number of at least 1, a time that is negative, zero where work was timed, or over an hour, a CPU
    Adam rate that is not positive."""
    def need(ok: bool, where: str, what: str, value) -> None:
        if not ok:
            raise ProfileError(f"{origin}: runner_components{where} must be {what}, got {repr(value)[:40]}")

    def counts(record, kind: str, where: str, optional: bool = False) -> None:
        for key in _RUNNER_COUNTS[kind]:
            value = record.get(key)
            if value is None and (optional or kind == "section"):
                continue
            need(_finite(value) and float(value).is_integer() and value >= 1, f"{where}.{key}",
                 "a whole number of at least 1", value)

    need(isinstance(section, dict), "", "a mapping", type(section).__name__)
    counts(section, "section", "")
    for i, b in enumerate(section.get("builds") or []):
        need(isinstance(b, dict), f".builds[{i}]", "a mapping", type(b).__name__)
        counts(b, "build", f".builds[{i}]")
        for j, p in enumerate(b.get("points") or []):
            where = f".builds[{i}].points[{j}]"
            need(isinstance(p, dict), where, "a mapping", type(p).__name__)
            counts(p, "point", where)
            for key, positive in _POINT_SECONDS:
                v = p.get(key)
                need(_finite(v) and (v > 0 if positive else v >= 0) and v <= MAX_POINT_S, f"{where}.{key}",
                     f"seconds {'above' if positive else 'at least'} 0 and at most {MAX_POINT_S:g}", v)
    for i, r in enumerate(section.get("cpu_adam_ranks") or []):
        need(isinstance(r, dict), f".cpu_adam_ranks[{i}]", "a mapping", type(r).__name__)
        counts(r, "cpu_adam", f".cpu_adam_ranks[{i}]", optional=True)
        v = r.get("params_per_s_per_rank")
        need(_finite(v) and v > 0, f".cpu_adam_ranks[{i}].params_per_s_per_rank", "a positive number", v)


def _runner(data: dict, hbm_bytes_per_s: float, shipped: bool, origin: str) -> RunnerComponents | None:
    """The profile's runner components; a user's profile (`tune profile --model A`) takes the layer kinds it did not
    build from its GPU type's shipped profile, marked so (RunnerComponents.with_layers_of): model B's kinds priced
    by measured builds, not by the fitted terms (30-47% over on Mixtral-8x7B's H100 runs from a Llama3-8B profile)."""
    if not data.get("runner_components"):
        # a user's profile without builds (`tune profile` without --model) prices the runner stack with its GPU
        # type's shipped builds, as it does the layer kinds it did not build, never with the image stack's constants
        base = None if shipped else shipped_profile(clean_name(data["gpu_type"]))
        return base.runner if base is not None else None
    if not shipped:
        check_runner_section(data["runner_components"], origin)
    runner = parse_runner_components(data["runner_components"], hbm_bytes_per_s)
    if shipped:
        return runner
    gpu_type = clean_name(data["gpu_type"])
    base = shipped_profile(gpu_type)
    if base is None or base.runner is None:
        return runner
    return runner.with_layers_of(base.runner, f"the shipped {gpu_type} profile ({base.provenance}, {base.date})")


def _collectives_of_shipped(gpu_type: str, origin: str) -> tuple[dict, int, str]:
    """A profile measured on one GPU has no collectives (nothing to talk to): its GPU type's shipped profile
    gives them, and says so wherever they price a term."""
    shipped = shipped_profile(gpu_type)
    if shipped is None or not shipped.collectives:
        raise ProfileError(f"{origin}: measured on 1 GPU, so it has no collectives, and no profile is shipped for "
                           f"{gpu_type} to take them from: run `tune profile` on 2 or more GPUs")
    return (shipped.collectives, shipped.collective_gpus,
            f"collectives from the shipped {gpu_type} profile ({shipped.provenance}, {shipped.date}): this profile "
            f"measured 1 GPU")


def _gdn_kernel(linear: dict) -> GdnKernel | None:
    """The measured points of the linear_attention section (`points`: tokens, fwd_ms, fwd_bwd_ms and the
    head configuration), grouped by head configuration; None when it holds only an estimate."""
    rows = [p for p in linear.get("points") or [] if p.get("fwd_bwd_ms")]
    if not rows:
        return None
    groups: dict = {}
    for p in rows:
        key = (int(p.get("qk_heads", linear.get("qk_heads"))), int(p.get("v_heads", linear.get("v_heads"))),
               int(p.get("key_head_dim", linear.get("key_head_dim", 128))),
               int(p.get("value_head_dim", linear.get("value_head_dim", 128))))
        groups.setdefault(key, []).append(p)
    series = []
    for (qk, v, dk, dv), pts in sorted(groups.items()):
        fb = [(float(p["tokens"]), float(p["fwd_bwd_ms"]) / 1e3 / float(p["tokens"])) for p in pts]
        fwd = [(float(p["tokens"]), float(p["fwd_ms"]) / 1e3 / float(p["tokens"])) for p in pts if p.get("fwd_ms")]
        series.append(GdnSeries(qk, v, dk, dv, _curve(fwd or fb), _curve(fb)))
    return GdnKernel(tuple(series), str(linear.get("source") or linear.get("note") or "profile linear_attention"))


def _curve(points: list[tuple[float, float]]) -> Curve:
    points = sorted(points)
    return Curve(tuple(p[0] for p in points), tuple(p[1] for p in points))


def _grid(points: list[dict], origin: str) -> GemmGrid:
    # Rows with a label are the model's own shapes, measured beside the grid; the grid is the rest.
    table = {(int(p["m"]), int(p["n"]), int(p["k"])): float(p["tflops"]) for p in points if not p.get("label")}
    ms = sorted({m for m, _, _ in table})
    ns = sorted({n for _, n, _ in table})
    ks = sorted({k for _, _, k in table})
    try:
        flat = tuple(table[(m, n, k)] for m in ms for n in ns for k in ks)
    except KeyError as e:
        raise ProfileError(f"{origin}: gemm_bf16 is not a full m x n x k grid (missing {e.args[0]})") from None
    return GemmGrid(tuple(ms), tuple(ns), tuple(ks), flat)


def _fp8_speedup(data: dict, grid: GemmGrid) -> float:
    ratios = [float(p["tflops"]) / grid(p["m"], p["n"], p["k"]) for p in data.get("gemm_fp8") or []
              if float(p.get("tflops") or 0) > 0]
    return max(ratios) if ratios else float(data.get("fp8_speedup", 1.0))


def parse_profile(text: str, origin: str, shipped: bool = False) -> HardwareProfile:
    data = parse_yaml(text, origin, ProfileError, shipped)
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile must be a YAML mapping")
    return profile_from_dict(data, origin, shipped)


def load_profile(path: str | Path) -> HardwareProfile:
    """A user's profile file; one of a GPU type tune has no catalog entry for is refused (nothing could use it)."""
    profile = parse_profile(read_user_text(path, ProfileError, "profile"), str(path))
    if profile.gpu_type not in gpu_names():
        raise ProfileError(f"{path}: gpu_type {profile.gpu_type[:40]} is not a GPU type tune knows "
                           f"(known: {', '.join(gpu_names())})")
    return profile


@lru_cache(maxsize=16)
def shipped_profile(gpu_type: str) -> HardwareProfile | None:
    """The profile shipped for a GPU type (cost_model/data/profiles/<gpu>.yaml), or None."""
    res = resources.files("cost_model").joinpath(f"data/profiles/{gpu_type}.yaml")
    if not res.is_file():
        return None
    return parse_profile(res.read_text(), f"cost_model/data/profiles/{gpu_type}.yaml", shipped=True)
