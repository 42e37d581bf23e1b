"""How fast a GPU executes each kind of work: the one place the step-time model asks.

`ProfileRates` reads a hardware profile measured on the GPU (or derived from one), interpolated by
shape and message size; `ConstantRates` is the datasheet fallback for a GPU type with no profile,
using the saturating efficiency curves of constants.yaml. Traffic that leaves the NVLink domain
always uses the catalog's inter-node bandwidth: profiles are measured inside one machine.
"""
from __future__ import annotations

from cost_model.constants import Constants
from cost_model.nouns.hardware import GpuSpec
from cost_model.profile import HardwareProfile


class Rates:
    """FLOP/s, bytes/s and seconds for the work of one GPU."""

    def __init__(self, gpu: GpuSpec, c: Constants, precision: str):
        self.gpu, self.c, self.precision = gpu, c, precision
        self.peak = gpu.peak_tflops(precision) * 1e12
        self.internode = gpu.internode_gb_s * 1e9 * c.internode_bus_efficiency

    source = "datasheet"

    def gemm(self, m: float, n: float, k: float) -> float:
        raise NotImplementedError

    def grouped(self, rows_per_expert: float, k: float, n: float) -> float:
        raise NotImplementedError

    def attention(self, seq: float, head_dim: float) -> float:
        raise NotImplementedError

    def linear_attention(self) -> float:
        raise NotImplementedError

    def gdn_kernel(self, tokens: float, v_heads: float, key_head_dim: int, value_head_dim: int) -> float | None:
        """Measured forward+backward seconds of the Gated DeltaNet kernel (None: not measured)."""
        return None

    gdn_source = "estimate: linear_attention_efficiency x dense peak (not measured)"

    def _nvlink_time(self, op: str, nbytes: float, size: int) -> float:
        raise NotImplementedError

    hbm: float
    pcie: float
    cpu_adam: float

    def collective(self, op: str, nbytes: float, size: int, span: int) -> float:
        """Seconds for a collective over `size` ranks spread over `span` consecutive GPUs; nbytes per rank."""
        if size <= 1 or nbytes <= 0:
            return 0.0
        if span <= self.gpu.nvlink_domain:
            return self._nvlink_time(op, nbytes, size)
        factor = 1.0 if op == "p2p" else (size - 1) / size
        return self.c.collective_latency_s + nbytes * factor / self.internode


class ConstantRates(Rates):
    source = "datasheet peaks x efficiency curves of constants.yaml (no profile for this GPU)"

    def __init__(self, gpu: GpuSpec, c: Constants, precision: str):
        super().__init__(gpu, c, precision)
        self.hbm = gpu.hbm_tb_s * 1e12 * c.hbm_efficiency
        self.pcie = gpu.pcie_gb_s * 1e9 * c.pcie_efficiency
        self.cpu_adam = c.cpu_adam_params_per_s_per_gpu
        self.nvlink = gpu.nvlink_gb_s * 1e9 * c.nvlink_bus_efficiency

    def gemm(self, m, n, k):
        c = self.c
        return self.peak * (c.gemm_max_efficiency * m / (m + c.gemm_half_m)
                            * n / (n + c.gemm_half_nk) * k / (k + c.gemm_half_nk))

    def grouped(self, rows_per_expert, k, n):
        c = self.c
        return self.peak * c.grouped_gemm_max_efficiency * rows_per_expert / (rows_per_expert + c.grouped_gemm_half_rows)

    def attention(self, seq, head_dim):
        return self.peak * self.c.attention_efficiency

    def linear_attention(self):
        return self.peak * self.c.linear_attention_efficiency

    def _nvlink_time(self, op, nbytes, size):
        factor = 1.0 if op == "p2p" else (size - 1) / size
        return self.c.collective_latency_s + nbytes * factor / self.nvlink


class ProfileRates(Rates):
    def __init__(self, gpu: GpuSpec, c: Constants, precision: str, profile: HardwareProfile):
        super().__init__(gpu, c, precision)
        self.profile = profile
        # a derived profile's device is the GPU type itself ("H100 (derived)"): not repeated after the GPU's name
        device = profile.device or profile.gpu_type
        self.source = f"{profile.provenance} profile" + ("" if "(derived)" in device else f" of {device}") + (
            f" ({profile.date})" if profile.date else "")
        self.hbm = profile.hbm_copy_tb_s * 1e12
        self.pcie = min(profile.h2d_gb_s, profile.d2h_gb_s) * 1e9
        # The profile's CPU Adam ran alone on the host; in training each GPU's rank shares it.
        self.cpu_adam = profile.cpu_adam_params_per_s * c.cpu_adam_share_of_profile
        self._fp8 = precision == "fp8"
        # Scoring a search space asks for the same shapes over and over: remember the answers.
        self._memo: dict = {}

    def _remember(self, key, compute):
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = compute()
        return value

    def gemm(self, m, n, k):
        return self._remember(("g", m, n, k), lambda: self.profile.gemm_bf16(m, n, k) * self._fp8_ratio(m, n, k) * 1e12)

    def grouped(self, rows_per_expert, k, n):
        # each expert's GEMM is rows_per_expert x n x k: its fp8 gain is that shape's
        return self._remember(("e", rows_per_expert, k, n),
                              lambda: self.profile.grouped_tflops(rows_per_expert, k, n)
                              * self._fp8_ratio(rows_per_expert, n, k) * 1e12)

    def _fp8_ratio(self, m, n, k) -> float:
        return self.profile.fp8_ratio(m, n, k) if self._fp8 else 1.0

    def attention(self, seq, head_dim):
        return self._remember(("a", seq, head_dim), lambda: self.profile.attention_tflops(seq, head_dim) * 1e12)

    def linear_attention(self):
        return self.peak * self.profile.linear_attention_efficiency

    def gdn_kernel(self, tokens, v_heads, key_head_dim, value_head_dim):
        gdn = self.profile.gdn
        if gdn is None:
            return None
        return self._remember(("gdn", tokens, v_heads, key_head_dim, value_head_dim),
                              lambda: gdn.seconds(tokens, v_heads, key_head_dim, value_head_dim))

    @property
    def gdn_source(self):
        if self.profile.gdn is None:
            return (f"estimate: efficiency {self.profile.linear_attention_efficiency:g} x dense peak "
                    f"({self.profile.provenance} profile has no measured kernel times)")
        kind = "measured" if self.profile.provenance == "measured" else "modelled"
        return f"{kind}: {self.profile.gdn.source}"

    def _nvlink_time(self, op, nbytes, size):
        # Bus bandwidth as NCCL tests define it already folds in latency at small messages.
        factor = 1.0 if op == "p2p" else (size - 1) / size
        return nbytes * factor / self._remember(("c", op, nbytes), lambda: self.profile.busbw_gb_s(op, nbytes) * 1e9)


# Rates objects are pure functions of their inputs; keeping the last few lets their memos serve a
# whole search space. Keyed by identity (profiles hold dicts); the entry keeps its inputs alive.
_RECENT: dict = {}


def rates_for(gpu: GpuSpec, c: Constants, precision: str, profile: HardwareProfile | None) -> Rates:
    key = (id(gpu), id(c), precision, id(profile))
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is gpu and hit[1] is c and hit[2] is profile:
        return hit[3]
    rates = ProfileRates(gpu, c, precision, profile) if profile is not None else ConstantRates(gpu, c, precision)
    if len(_RECENT) >= 64:
        _RECENT.clear()
    _RECENT[key] = (gpu, c, profile, rates)
    return rates
