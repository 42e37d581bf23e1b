"""The precision-aware Adam component test: TE's BF16 parameter + int16 remainder format, the arms against
FP64 Adam with their negative controls, its CLI and the recipe entry it records."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from experiments.checks import adam_arms
from experiments.checks import adam_component_test as adam

pytestmark = pytest.mark.torch

SMALL = [("expert0.fc1", 64, 256), ("expert0.fc2", 128, 64), ("expert1.fc1", 64, 256), ("expert1.fc2", 128, 64)]


@pytest.fixture(scope="module")
def adam_result():
    return adam.run(adam.TensorSet("qwen3.6-35b-a3b", shapes=SMALL), "cpu", steps=(1, 3), seed=0)


def test_adam_main_arm_passes_and_controls_fail(adam_result):
    r = adam_result
    arms = r["arms"]
    for s in ("1", "3"):
        main_arm = arms["main"]["steps"][s]
        assert main_arm["update"] < 1e-3 / 5 and main_arm["master"] < 1e-6      # comfortably inside
        for control in ("drop_remainder", "bf16_master"):
            assert arms[control]["steps"][s]["update"] > 0.5                      # most of the update is lost
            assert not arms[control]["steps"][s]["within_bound"]
        assert r["bitwise_identical_to_fp32_master"][s] is True
    assert arms["main"]["within_bound"] and r["main_passed"]
    assert r["controls_failed"] and r["passed"]
    assert r["bound"] == 1e-3
    assert r["hyperparameters"]["lr"] == 1e-5 and r["hyperparameters"]["beta2"] == 0.98
    assert "within bound" in adam.format_result(r) and "result: PASS" in adam.format_result(r)


def test_adam_recipe_component_block(adam_result):
    block = adam.recipe_component_block(adam_result, "H200")
    assert set(block) == {"test", "shape", "gpu", "date", "result", "detail", "note"}
    assert block["gpu"] == "H200" and block["result"] == "pass"
    assert "worst tensor (update) relative L2 error" in block["detail"]
    assert "bitwise identical" in block["detail"] and "negative controls fail" in block["detail"]


@pytest.fixture
def tiny_moe_config(tmp_path) -> Path:
    """A small qwen3_moe config.json (16 experts, hidden 64) for fast CPU runs of the Adam test."""
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000, "num_experts": 16, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_adam_cli_on_cpu_from_a_model_config(tiny_moe_config, capsys):
    path = tiny_moe_config
    assert adam.main(["adam", "--model", str(path), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["shape_info"]["local_experts"] == 2 and out["shape_info"]["tested_experts"] == 2
    assert out["tensors"][0] == {"name": "expert0.fc1", "rows": 64, "cols": 64}
    assert adam.main(["--model", str(path), "--device", "cpu", "--ep", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: EP 3") and err.count("\n") == 1


def test_adam_result_is_recorded_in_a_recipe_and_a_bad_recipe_stops_before_the_test(tmp_path, tiny_moe_config,
                                                                                      capsys, monkeypatch):
    model = tiny_moe_config
    source = Path(__file__).parent / "fixtures" / "reference_recipes" / "attune-tp1-ep8-mt16k.yaml"
    out = tmp_path / "out.yaml"
    # A CPU run is never recorded: one line, exit 2, nothing written.
    assert adam.main(["adam", "--model", str(model), "--device", "cpu", "--recipe", str(source),
                      "--recipe-out", str(out)]) == 2
    assert "not recorded in a recipe" in capsys.readouterr().err and not out.exists()
    # The recording path itself, exercised on this GPU-less machine as a GPU run would take it.
    monkeypatch.setattr(adam, "RECORDED_DEVICES", ("cuda", "cpu"))
    assert adam.main(["adam", "--model", str(model), "--device", "cpu", "--recipe", str(source),
                      "--recipe-out", str(out)]) == 0
    assert "recorded in" in capsys.readouterr().err
    recipe = yaml.safe_load(out.read_text())
    block = recipe["correctness"]
    assert [t["result"] for t in block["component_tests"]] == ["pass"]
    assert block["component_tests"][0]["test"].startswith("precision-aware Adam")
    assert block["result"] == "pass" and recipe["status"] == "verified"  # its convergence had passed
    assert block["summary"] == "passed; 1 of 1 component test passed on this image; convergence passed"
    # Run again in place: the entry is replaced, not duplicated.
    assert adam.main(["adam", "--model", str(model), "--device", "cpu", "--recipe", str(out)]) == 0
    assert len(yaml.safe_load(out.read_text())["correctness"]["component_tests"]) == 1
    # A malformed recipe: one line, exit 2, before any test runs; the file is left as it was.
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    capsys.readouterr()
    assert adam.main(["adam", "--model", str(model), "--device", "cpu", "--recipe", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: ") and "bad.yaml: malformed YAML" in err and err.count("\n") == 1
    assert bad.read_text() == "model: [unclosed\n"
    assert adam.main(["adam", "--device", "cpu", "--recipe-out", str(out)]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_adam_cli_without_gpu_exits_2(capsys):
    assert adam.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and err.count("\n") == 1


def test_moe_layer_shapes_cap():
    from cost_model.nouns.model_spec import load_model
    shapes, info = adam.moe_layer_shapes(load_model("qwen3.6-35b-a3b"), ep=8, max_elements=1 << 25)
    assert info["local_experts"] == 32 and info["tested_experts"] == 10 and len(shapes) == 20
    assert shapes[:2] == [("expert0.fc1", 2048, 1024), ("expert0.fc2", 512, 2048)]
    assert info["elements"] <= 1 << 25
    _, info = adam.moe_layer_shapes(load_model("qwen3.5-397b-a17b"), ep=8, max_elements=1)
    assert info["tested_experts"] == 1     # at least one expert, whatever the cap


def _edge_bit_patterns() -> torch.Tensor:
    lows = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    highs = [0x0000, 0x0001, 0x3C00, 0x3F80, 0x7F7F, 0x7F80, 0x7FFF, 0x8000, 0x8001, 0xBF80, 0xFF7F, 0xFF80, 0xFFFF]
    values = [(h << 16) | l for h in highs for l in lows]
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int64).to(torch.int32)


def test_remainder_split_merge_is_bit_exact():
    gen = torch.Generator().manual_seed(0)
    random_bits = torch.randint(-(1 << 31), 1 << 31, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    bits = torch.cat([random_bits, _edge_bit_patterns()])
    master = bits.view(torch.float32)          # every pattern, NaNs and infinities included
    param, rem = adam_arms.split_master(master)
    assert param.dtype == torch.bfloat16 and rem.dtype == torch.int16
    back = adam_arms.merge_master(param, rem)
    assert torch.equal(back.view(torch.int32), bits)
    # Realistic weights too.
    w = torch.randn(4096, generator=gen) * 0.02
    assert torch.equal(adam_arms.merge_master(*adam_arms.split_master(w)).view(torch.int32), w.view(torch.int32))


def test_remainder_param_is_the_rounded_bf16_of_the_master():
    """TE rounds the BF16 parameter to nearest (adam.cu L271-277), it does not truncate."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(1 << 16, generator=gen) * 0.02
    param, rem = adam_arms.split_master(w)
    low = w.view(torch.int32) & 0xFFFF
    not_tie = low != 0x8000
    assert torch.equal(param[not_tie].view(torch.int16), w[not_tie].to(torch.bfloat16).view(torch.int16))
    truncated = (w.view(torch.int32) >> 16).to(torch.int16)
    assert not torch.equal(param.view(torch.int16), truncated)        # about half the elements round up
    # The remainder's sign bit says whether the parameter was rounded up.
    assert torch.equal((rem < 0), (param.view(torch.int16) != truncated))
    # A BF16-exact master (a fresh optimizer state) has a zero remainder.
    exact = w.to(torch.bfloat16).float()
    p2, r2 = adam_arms.split_master(exact)
    assert torch.equal(r2, torch.zeros_like(r2)) and torch.equal(p2.float(), exact)
