"""fla's TileLang kernel compiled ahead (experiments.megatron.tilelang_ahead): what is built, that nothing is
launched, and how the profile starts and waits for it."""
import importlib.util
import subprocess
import sys
import types

import pytest

from cost_model.nouns.model_spec import load_model
from experiments.checks import hardware_profile
from experiments.checks.runner_components import gdn_kernel_batches
from experiments.megatron import tilelang_ahead as ta

SHAPE = ta.KernelShape(32, 32, 128, 128)

FAKE_FLA = '''
calls = []
def _build_chunk_bwd_dqkwg_kernel(**kw):
    calls.append(("build", kw))
    return lambda *a: calls.append(("launch", len(a)))
def chunk_bwd_dqkwg_tilelang(q, k, v, do, h, dh, w=None, g=None, dv=None, chunk_size=64):
    B, T, H, K = k.shape
    kernel = _build_chunk_bwd_dqkwg_kernel(B=B, H=H, HV=v.shape[2], K=K, V=v.shape[-1], hD1=h.shape[-2],
                                           hD2=h.shape[-1], USE_G=g is not None, USE_DW=w is not None,
                                           dtype_str=str(q.dtype))
    kernel(q, k, v)
'''


@pytest.fixture
def fake_fla(monkeypatch):
    module = types.ModuleType(ta.MODULE)
    exec(FAKE_FLA, module.__dict__)
    monkeypatch.setitem(sys.modules, ta.MODULE, module)
    monkeypatch.setattr(ta, "_tilelang_in_use", lambda torch: None)
    return module


def test_kernel_built_for_the_batch_and_never_launched(fake_fla):
    out = ta.compile_kernel(4, ta.KernelShape(16, 32, 128, 64))
    assert "built_s" in out and out["batch"] == 4, out
    [(what, kw)] = fake_fla.calls
    assert what == "build"   # the launch on meta tensors is skipped
    assert (kw["B"], kw["H"], kw["HV"], kw["K"], kw["V"]) == (4, 16, 32, 128, 64)
    assert (kw["hD1"], kw["hD2"], kw["USE_G"], kw["USE_DW"]) == (128, 64, True, True)
    assert kw["dtype_str"] == "torch.bfloat16"
    # fla's own builder is back in place for whatever runs after
    assert fake_fla._build_chunk_bwd_dqkwg_kernel.__name__ == "_build_chunk_bwd_dqkwg_kernel"


def test_an_fla_without_the_kernel_is_skipped_with_the_reason(fake_fla):
    del fake_fla._build_chunk_bwd_dqkwg_kernel
    out = ta.compile_kernel(1, SHAPE)
    assert "built_s" not in out and ta.BUILDER in out["skipped"]


def test_an_fla_that_fails_is_reported_not_raised(fake_fla):
    def broken(**kw):
        raise RuntimeError("nvcc not found")
    fake_fla._build_chunk_bwd_dqkwg_kernel = broken
    out = ta.compile_kernel(2, SHAPE)
    assert out["error"] == "RuntimeError: nvcc not found"
    assert fake_fla._build_chunk_bwd_dqkwg_kernel is broken


@pytest.mark.parametrize("args, problem", [((0, 32, 128, 128), "qk_heads must be positive, got 0"),
                                           ((3, 32, 128, 128), "v_heads 32 is not a multiple of qk_heads 3")])
def test_shape_names_the_failing_numbers(args, problem):
    with pytest.raises(ValueError, match=problem):
        ta.KernelShape(*args)


def test_cli_bad_batch_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", ta.__name__, "--batch", "0", *SHAPE.argv()], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["tilelang_ahead: batch must be positive, got 0"]


def test_processes_report_why_nothing_was_built_here():
    ahead = ta.CompileAhead(SHAPE, [2, 1, 2])
    try:
        results = ahead.wait(timeout_s=120)
    finally:
        ahead.close()
    assert [r["batch"] for r in results] == [1, 2]
    if any("built_s" in r for r in results):   # a machine with fla, TileLang and a Hopper GPU
        pytest.skip("this machine compiles the kernel")
    assert all(r.get("skipped") or r.get("error") for r in results)
    assert "not built:" in ahead.note() and ahead.note().startswith("tilelang_ahead: ")


def test_a_process_still_compiling_at_the_deadline_is_stopped():
    ahead = ta.CompileAhead(SHAPE, [1])
    results = ahead.wait(timeout_s=0.01)   # an interpreter that imports torch takes longer than this
    assert results == [{"batch": 1, "error": "still compiling after 0 s: stopped"}]
    assert all(p.poll() is not None for p in ahead.procs)
    assert ahead.wait() is results


def test_primary_context_is_asked_without_creating_one():
    assert ta.primary_context_active() in (None, False, True)


def test_gdn_kernel_batches_are_the_rows_of_the_gdn_builds():
    assert gdn_kernel_batches(load_model("qwen3.6-35b-a3b")) == (1, 2, 4, 8)
    assert gdn_kernel_batches(load_model("llama3-8b")) == ()


def test_profile_compiles_ahead_only_where_the_gdn_kernel_is_timed(monkeypatch):
    shape = dict(qk_heads=16, v_heads=32, key_head_dim=128, value_head_dim=128, tokens=[8192])
    assert hardware_profile._compile_ahead(None, None, (1,)) is None
    assert hardware_profile._compile_ahead(shape, ["gemm_bf16"], (1,)) is None
    monkeypatch.setenv(hardware_profile.TILELANG_AHEAD_ENV, "0")
    assert hardware_profile._compile_ahead(shape, None, (1,)) is None
    monkeypatch.delenv(hardware_profile.TILELANG_AHEAD_ENV)
    started = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())   # fla and TileLang "installed"
    monkeypatch.setattr(ta, "CompileAhead", lambda s, b: started.append((s, tuple(b))) or "ahead")
    assert hardware_profile._compile_ahead(shape, None, (1, 2)) == "ahead"
    assert started == [(ta.KernelShape(32, 32, 128, 128), (1, 2))]   # q/k repeated to the value heads


def test_tune_profile_of_a_gdn_model_compiles_ahead_for_its_builds_rows(tmp_path, monkeypatch):
    from experiments.checks import runner_components as rc
    from tuner import catalog_commands
    from tuner.cli import main

    asked = []

    def fake_run_profile(model, quick=False, gpu_shared=None, kernel_batches=(1,)):
        asked.append(kernel_batches)
        raise RuntimeError("stop here")

    class Ahead:
        def close(self):
            pass

    monkeypatch.setattr(catalog_commands, "_has_megatron", lambda: True)
    monkeypatch.setattr(hardware_profile, "run_profile", fake_run_profile)
    monkeypatch.setattr(rc, "start_builds_ahead", lambda m, out: Ahead())
    with pytest.raises(RuntimeError, match="stop here"):
        main(["profile", "--model", "qwen3.6-35b-a3b", "--out", str(tmp_path / "p.yaml")])
    assert asked == [(1, 2, 4, 8)]
