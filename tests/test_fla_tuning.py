"""The shipped fla autotune choices: found on the loaded autotuners, recorded, merged, and seeded only where the GPU,
fla and Triton match (real Triton autotuners on stand-in kernels; no GPU)."""
import json
import sys
import types

import pytest
import triton
import triton.language as tl

from experiments.megatron import fla_tuning as ft

CONFIGS = [triton.Config({"BLOCK": 32}, num_warps=2, num_stages=2), triton.Config({"BLOCK": 64}, num_warps=4)]


def _kernels():
    @triton.autotune(configs=list(CONFIGS), key=["H"])
    @triton.jit
    def plain(x, H, BLOCK: tl.constexpr):
        pass

    @triton.heuristics({"EVEN": lambda args: True})
    @triton.autotune(configs=list(CONFIGS), key=["H", "K"])
    @triton.jit
    def wrapped(x, H, K, BLOCK: tl.constexpr, EVEN: tl.constexpr):
        pass
    return plain, wrapped


@pytest.fixture
def fake_fla(monkeypatch):
    module = types.ModuleType("flafake.ops")
    module.plain, module.wrapped = _kernels()
    module.not_a_kernel = 3
    monkeypatch.setitem(sys.modules, "flafake.ops", module)
    monkeypatch.setattr(ft, "versions", lambda: {"fla": "0.6.0", "triton": "3.6.0"})
    return module


def _shipped(tmp_path, gpu="NVIDIA H100 80GB HBM3", **over):
    data = {"gpu": gpu, "fla": "0.6.0", "triton": "3.6.0", "measured": "2026-12-07T12:00Z",
            "choices": [{"kernel": "flafake.ops.plain", "key": [16, "torch.bfloat16"],
                         "config": {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 3, "num_ctas": 1,
                                    "maxnreg": None}},
                        {"kernel": "flafake.ops.wrapped", "key": [16, 128, "torch.float32"],
                         "config": {"kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 2, "num_ctas": 1,
                                    "maxnreg": None}},
                        {"kernel": "flafake.ops.gone", "key": [1], "config": {"kwargs": {}}}], **over}
    (tmp_path / ft.gpu_file_name(gpu)).write_text(json.dumps(data))
    return data


def test_autotuners_are_found_through_heuristics(fake_fla):
    assert set(ft.autotuners("flafake.")) == {"flafake.ops.plain", "flafake.ops.wrapped"}


def test_seed_places_the_shipped_config_under_its_key(fake_fla, tmp_path):
    _shipped(tmp_path)
    status = ft.seed("NVIDIA H100 80GB HBM3", tmp_path, prefix="flafake.")
    assert status["seeded"] == 2 and status["of"] == 3   # the kernel this fla lacks is left out
    config = fake_fla.plain.cache[(16, "torch.bfloat16")]
    assert config.kwargs == {"BLOCK": 64} and config.num_warps == 4
    assert fake_fla.wrapped.fn.cache[(16, 128, "torch.float32")].num_stages == 2


def test_seed_keeps_a_choice_already_made(fake_fla, tmp_path):
    _shipped(tmp_path)
    fake_fla.plain.cache[(16, "torch.bfloat16")] = CONFIGS[0]
    assert ft.seed("NVIDIA H100 80GB HBM3", tmp_path, prefix="flafake.")["seeded"] == 1
    assert fake_fla.plain.cache[(16, "torch.bfloat16")] is CONFIGS[0]


@pytest.mark.parametrize("gpu, over, why", [
    ("NVIDIA H200", {}, "no shipped fla tuning for NVIDIA H200"),
    ("NVIDIA H100 80GB HBM3", {"triton": "3.5.1"}, "Triton 3.5.1; here fla 0.6.0, Triton 3.6.0"),
])
def test_seed_refuses_another_gpu_or_version(fake_fla, tmp_path, gpu, over, why):
    _shipped(tmp_path, **over)
    status = ft.seed(gpu, tmp_path, prefix="flafake.")
    assert status["seeded"] == 0 and why in status["why"]
    assert not fake_fla.plain.cache


def test_recorded_choices_merge_into_one_shipped_file(fake_fla, tmp_path, monkeypatch, capsys):
    fake_fla.plain.cache[(16, "torch.bfloat16")] = CONFIGS[1]
    rec = {"gpu": "NVIDIA H100 80GB HBM3", "fla": "0.6.0", "triton": "3.6.0", "measured": "2026-12-07T12:00Z",
           "choices": ft.choices("flafake.")}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.json").write_text(json.dumps(rec))
    (tmp_path / "a" / "2.json").write_text(json.dumps({**rec, "measured": "2026-12-07T12:05Z"}))
    out = tmp_path / ft.gpu_file_name(rec["gpu"])
    assert ft.main(["merge", str(tmp_path / "a"), "--out", str(out), "--source", "a test"]) == 0
    shipped = json.loads(out.read_text())
    assert shipped["measured"] == "2026-12-07T12:05Z" and len(shipped["choices"]) == 1
    fake_fla.plain.cache.clear()
    assert ft.seed(rec["gpu"], tmp_path, prefix="flafake.")["seeded"] == 1
    assert fake_fla.plain.cache[(16, "torch.bfloat16")].kwargs == {"BLOCK": 64}
    out = capsys.readouterr()
    assert "1 choices of 1 kernels from 2 processes" in out.out and not out.err
    assert ft.main(["merge", str(tmp_path / "a"), "--out", str(tmp_path / "choices.json")]) == 0
    assert f"seeded only as {ft.SHIPPED_DIR / 'NVIDIA_H100_80GB_HBM3.json'}" in capsys.readouterr().err


def test_merge_refuses_records_of_two_gpus():
    rec = {"gpu": "A", "fla": "0.6.0", "triton": "3.6.0", "measured": "x", "choices": []}
    with pytest.raises(ValueError, match="more than one GPU"):
        ft.merge([rec, {**rec, "gpu": "B"}], "")


def test_merge_with_nothing_recorded_says_so(tmp_path, capsys):
    assert ft.main(["merge", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    assert "no recorded choices" in capsys.readouterr().err


def test_record_is_off_without_its_variable(monkeypatch):
    monkeypatch.delenv(ft.RECORD_ENV, raising=False)
    assert ft.record() is None


def test_shipped_choices_are_named_for_their_gpu_and_complete():
    shipped = sorted(ft.SHIPPED_DIR.glob("*.json"))
    assert shipped, "no shipped fla autotune choices"
    for path in shipped:
        data = json.loads(path.read_text())
        assert ft.gpu_file_name(data["gpu"]) == path.name
        assert data["fla"] and data["triton"] and data["measured"] and data["source"]
        assert data["choices"] and all(c["kernel"].startswith("fla.") and isinstance(c["key"], list)
                                       and c["config"]["kwargs"] is not None for c in data["choices"])


def test_merge_of_a_broken_record_says_so_in_one_line(tmp_path, capsys):
    (tmp_path / "1.json").write_text("{not json")
    assert ft.main(["merge", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fla_tuning: ") and err.count("\n") == 1 and not (tmp_path / "x.json").exists()


def test_a_folder_of_ones_own_choices_is_read_instead(fake_fla, tmp_path, monkeypatch):
    _shipped(tmp_path, gpu="NVIDIA B200")
    assert ft.seed("NVIDIA B200", prefix="flafake.")["seeded"] == 0      # none shipped for it
    monkeypatch.setenv(ft.CHOICES_ENV, str(tmp_path))
    assert ft.seed("NVIDIA B200", prefix="flafake.")["seeded"] == 2
