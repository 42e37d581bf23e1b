"""benchmarks/saved_tensors_cpu.py: what a dense layer of the runner keeps for its backward, per selective-recompute
module set, traced on the CPU."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.torch]


def test_recomputing_core_attn_keeps_the_same_bytes_and_recomputing_mlp_drops_its_ffn_tensors():
    from benchmarks import saved_tensors_cpu as st

    ffn = 2 * st.toy_model(1).intermediate_size * st.SEQ
    with st.cpu_rank():
        layer = {mods: st.saved_bf16_bytes(2, mods) - st.saved_bf16_bytes(1, mods)
                 for mods in ((), ("core_attn",), ("mlp",))}
    assert layer[()] > 0
    assert layer[("core_attn",)] == layer[()]          # the checkpoint's output is what the projection keeps anyway
    # the SwiGLU's fc1 output (2 x ffn), its offset copy, silu and product (ffn each): five ffn-wide tensors
    assert layer[()] - layer[("mlp",)] == 5 * ffn


def test_the_runner_dense_count_is_the_trace_for_every_module_set():
    from benchmarks import saved_tensors_cpu as st

    hidden = st.toy_model(1).hidden_size
    with st.cpu_rank():
        for mods in st.MODULE_SETS:
            traced = (st.saved_bf16_bytes(2, mods) - st.saved_bf16_bytes(1, mods)) / st.SEQ
            assert st.model_count(mods) == pytest.approx(st.gpu_equivalent(traced, mods, hidden), rel=1e-9), mods


def test_a_shared_expert_keeps_five_ffn_tensors_its_input_and_gate_and_the_count_is_the_trace():
    from benchmarks import saved_tensors_cpu as st

    with st.cpu_rank():
        for mods in st.MOE_MODULE_SETS:
            traced = st.shared_expert_traced(mods, 512)
            assert st.shared_expert_count(mods, 512) == pytest.approx(traced, rel=1e-9), mods
        kept = st.shared_expert_traced((), 1024) - st.shared_expert_traced((), 512)
        recomputed = st.shared_expert_traced(("shared_experts",), 512)
    assert kept == 5 * 2 * 512                        # five ffn-wide bf16 tensors per token, as the dense SwiGLU's
    assert recomputed == 0                            # its checkpoint's input is the block's, kept anyway
