"""Published throughput rows as cost-model cases (benchmarks/public_data.py) and their scoring."""
import math

import pytest

from benchmarks.cost_model_accuracy import evaluate, ordered_pairs, report, stated_memory
from benchmarks.public_data import (DEFAULT, REFERENCE_GROUP, STACK, Unusable, load_cases, map_dispatcher,
                                    map_precision, map_recompute, map_routing, reference_cases)
from cost_model.nouns.batching import rows_per_microbatch
from search_space.rules import MEGATRON, violations


@pytest.fixture(scope="module")
def loaded():
    return load_cases()


@pytest.fixture(scope="module")
def cases(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def unusable(loaded):
    return loaded[1]


def _case(cases, index):
    found = [c for c in cases if c.index == index]
    assert found, f"row {index} is not usable"
    return found[0]


def _reason(unusable, predicate):
    found = [why for row, why in unusable if predicate(row)]
    assert found, "no such unusable row"
    return found


def test_enough_usable_rows_and_every_row_accounted_for(loaded):
    cases, unusable = loaded
    assert len(cases) >= 20  # 24 on the vendored CSV: Megatron-style rows with tokens/s, VLM runs excluded
    assert len(cases) + len(unusable) == 127
    assert len({c.name for c in cases}) == len(cases)
    assert all(why and "\n" not in why for _, why in unusable)


def test_every_case_passes_the_megatron_rules(cases):
    for m in cases:
        c = m.case
        assert c.workload.framework == "megatron" and c.stack == STACK
        assert c.workload.precision in ("bf16", "fp8")
        assert c.layout.rows_per_microbatch == rows_per_microbatch(c.layout.max_tokens_per_gpu, c.layout.cp,
                                                                    c.workload.seq_len)
        broken = [v for v in violations(c.layout, c.model, c.workload, STACK) if v.source == MEGATRON
                  and v.rule != "global_batch_divisible_by_dp"]
        assert not broken, (m.name, broken)
        assert m.measured_tokens_per_s_per_gpu > 0
        if not c.model.is_moe:
            assert c.layout.ep == 1 and c.layout.etp == c.layout.tp and c.layout.dispatcher == "alltoall"


def test_cases_of_one_group_differ_only_in_layout(cases):
    by_group = {}
    for c in cases:
        by_group.setdefault(c.group, []).append(c)
    for group in by_group.values():
        first = group[0]
        for m in group[1:]:
            assert m.case.replace(layout=first.case.layout) == first.case and m.source == first.source


def test_moonlight_recompute_study_maps_to_selective_modules(cases):
    study = {m.index: m.case for m in cases if "recompute" in m.source and m.case.model.name == "moonlight-16b-a3b"}
    assert len(study) == 6
    assert study[29].layout.recompute_granularity is None  # 'selective: [] (empty control)'
    assert study[30].layout.recompute_modules == ("core_attn",)
    assert study[31].layout.recompute_modules == ("mla_up_proj",)
    assert study[32].layout.recompute_modules == ("mla_up_proj", "mlp")
    assert study[33].layout.recompute_modules == ("moe_act",)
    assert study[34].layout.recompute_modules == ("layernorm", "moe_act")
    assert {c.layout.recompute_granularity for i, c in study.items() if i != 29} == {"selective"}
    assert len({m.group for m in cases if m.index in study}) == 1
    first = study[29]
    assert (first.layout.tp, first.layout.ep, first.layout.world_size, first.workload.global_batch) == (2, 8, 8, 4)


def test_vlm_and_lora_rows_are_cases_with_their_images_and_frozen_base(cases):
    vlm = [c for c in cases if "VLM" in c.row["notes"] or "MedPix" in c.row["notes"]]
    assert len(vlm) >= 6 and all(c.vlm and c.case.workload.images_per_row == 1 for c in vlm)
    lora = [c for c in cases if "LoRA" in c.row["notes"]]
    assert len(lora) >= 5 and all(c.case.workload.peft == "lora" for c in lora)
    # the card's "16/24 language-layer PP split": the encoder's stage holds fewer decoder layers
    split = _case(cases, 18).case.layout
    assert (split.decoder_first_pipeline_num_layers, split.decoder_last_pipeline_num_layers) == (16, 24)


def test_known_rows_map(cases):
    qwen = _case(cases, 0)  # Qwen3-30B-A3B Bridge perf recipe: forced balance, HybridEP
    assert qwen.case.model.name == "qwen3-30b-a3b" and qwen.case.gpu.name == "h100"
    assert (qwen.case.workload.routing, qwen.case.layout.dispatcher) == ("balanced", "flex")
    assert (qwen.case.layout.ep, qwen.case.layout.etp) == (16, 1)
    assert qwen.case.workload.seq_len == 4096 and qwen.case.workload.global_batch == 1024
    natural = _case(cases, 2)  # 'NATURAL routing, not forced-balanced'
    assert natural.case.workload.routing == "natural" and natural.group != qwen.group
    gb200 = _case(cases, 1).case  # etp empty -> 1, MBS 4, FP8-MX
    assert (gb200.layout.etp, gb200.layout.rows_per_microbatch, gb200.workload.precision) == (1, 4, "fp8")
    assert gb200.layout.max_tokens_per_gpu == 4 * 4096
    gpt = _case(cases, 10).case.layout  # 'alltoall dispatcher' stated
    assert gpt.dispatcher == "alltoall" and (gpt.tp, gpt.pp) == (2, 4)
    assert not _case(cases, 22).vlm and _case(cases, 22).case.layout.recompute_label == "full uniform 1"
    nxt = _case(cases, 77).case.layout
    assert nxt.recompute_modules == ("layernorm", "moe_act", "shared_experts")
    assert (nxt.pp, nxt.vpp) == (4, 3)
    llama = _case(cases, 90).case  # dense: etp = tp, ep = 1; 'FP8 (hybrid format)'
    assert llama.model.name == "llama3-70b" and llama.workload.precision == "fp8"
    assert (llama.layout.tp, llama.layout.pp, llama.layout.vpp, llama.layout.etp, llama.layout.ep) == (4, 8, 5, 4, 1)
    cp = _case(cases, 22).case.layout  # CP2, MBS 2: max tokens per GPU = MBS x seq / CP
    assert (cp.cp, cp.rows_per_microbatch, cp.max_tokens_per_gpu) == (2, 2, 8192)


def test_unusable_rows_say_why(unusable):
    assert all("FSDP" in why for why in _reason(unusable, lambda r: "torchtitan" in r["source"]))
    # the framework is checked first: an Automodel run is refused as FSDP even when its model is not in the catalog
    assert all("FSDP" in why for why in _reason(unusable, lambda r: "Automodel" in r["source"]))
    assert _reason(unusable, lambda r: r["model"] == "Kimi-K2")
    assert _reason(unusable, lambda r: r["model"] == "DeepSeek-V4-Flash")
    assert all(r["model"] not in ("Kimi-K2", "DeepSeek-V4-Flash") and not r["model"].startswith("Nemotron")
               for r in [c.row for c in load_cases()[0]])
    assert all("FSDP" in why for why in _reason(unusable, lambda r: r["precision"].startswith("BF16 +")))  # torchtitan


@pytest.mark.parametrize("text, expected", [
    ("BF16", "bf16"), ("FP8-MX", "fp8"), ("FP8-CS", "fp8"), ("FP8-blockwise", "fp8"), ("FP8 (hybrid format)", "fp8"),
    ("FP8 (torchao float8 linears)", "fp8"), ("FP8", "fp8")])
def test_precision_mapping(text, expected):
    assert map_precision(text) == expected


def test_precision_mapping_rejects_mixed():
    with pytest.raises(Unusable):
        map_precision("BF16 + MXFP8 routed-expert GEMMs")


def test_recompute_mapping():
    assert map_recompute("none") == ({}, [])
    assert map_recompute("")[0] == {}
    full = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    assert map_recompute("full")[0] == full
    assert map_recompute("full (uniform, 1 layer)")[0] == full
    kw, notes = map_recompute("selective: layernorm, moe_act, shared_expert")
    assert kw["recompute_modules"] == ("layernorm", "moe_act", "shared_experts") and not notes
    kw, notes = map_recompute("selective: core_attn, GDN output-norm, moe_act")
    assert kw["recompute_modules"] == ("core_attn", "moe_act") and notes
    with pytest.raises(Unusable):
        map_recompute("selective (SAC)")
    with pytest.raises(Unusable):
        map_recompute("selective: attention_sink")


def test_routing_and_dispatcher_from_notes():
    assert map_routing("mock data; forced router balance; HybridEP") == "balanced"
    assert map_routing("forced balance") == "balanced"
    assert map_routing("pretrain (NATURAL routing, not forced-balanced)") == "natural"
    assert map_routing("SFT (Tulu3)") == "natural"
    assert map_dispatcher("HybridEP flex dispatcher 32 SMs") == "flex"
    assert map_dispatcher("dispatcher DeepEP") == "flex"
    assert map_dispatcher("dispatcher A2A; DP=4") == "alltoall"
    assert map_dispatcher("SP on, alltoall dispatcher") == "alltoall"
    assert map_dispatcher("SFT long-context 8K, SP on") == "alltoall"


def test_reference_cases():
    refs = reference_cases()
    assert len(refs) == 2
    for m in refs:
        assert m.group == REFERENCE_GROUP and m.case.workload.framework == "slime"
        assert m.case.model.name == "qwen3.6-35b-a3b" and m.case.gpu.name == "h200"
        assert m.measured_tokens_per_s_per_gpu > 0


def test_evaluate(cases):
    result = evaluate(cases)
    assert math.isfinite(result["median_ape"]) and result["median_ape"] >= 0
    assert result["pairs_total"] > 0
    assert 0 <= result["pairs_ordered"] <= result["pairs_total"]
    table = result["table"]
    assert list(table.name) == [m.name for m in cases]
    assert (table.predicted > 0).all() and table.ape.map(math.isfinite).all()
    assert ordered_pairs(table)[:2] == (result["pairs_ordered"], result["pairs_total"])
    assert math.isnan(evaluate([])["median_ape"])


def test_stated_memory():
    assert stated_memory("step 20147.29 ms; peak alloc <65 GiB")[:2] == ("below", 65.0)
    kind, gib, _ = stated_memory("mean step 45.65 s; 61.351 GB peak; other")
    assert kind == "about" and gib == pytest.approx(61.351e9 / 2 ** 30)
    assert stated_memory("ran OOM at step 3")[0] == "oom"
    assert stated_memory("no memory here") is None


def test_report_runs():
    import io

    out = io.StringIO()
    result = report(DEFAULT, verbose=True, out=out)
    text = out.getvalue()
    assert "median APE" in text and "correctly ordered pairs" in text and "Unusable rows" in text
    assert result["pairs_total"] > 0


def test_fields_a_source_leaves_out_are_searched_or_implied(cases):
    """PP/EP not stated: searched over what divides the GPUs (the fastest predicted to fit, the note says so);
    a global batch not stated: the whole number of rows the published step time implies."""
    by_gpus = {(c.row["model"], c.row["num_gpus"]): c for c in cases}
    searched = by_gpus[("GPT-OSS-120B", "32")]
    assert any("searched: PP" in n and "EP" in n for n in searched.notes), searched.notes
    assert searched.case.layout.etp == 1   # GPT-OSS's biased experts: Megatron needs ETP 1
    implied = by_gpus[("GPT-OSS-120B", "48")]
    assert implied.case.workload.global_batch == 4 and any("GBS not stated: 4" in n for n in implied.notes)


@pytest.mark.slow
def test_the_fit_leaves_out_rows_it_misses_by_more_than_the_trim_factor(cases):
    """A row 10x slower than its layout explains (a long-context SFT card row's kind of miss) must not move
    the fitted Megatron constants: the trimmed fit gives what it gives without that row; untrimmed, it does not."""
    import dataclasses

    from benchmarks.calibrate import TRIM_FACTOR, fit_megatron, search_megatron, trimmed
    from cost_model.constants import default_constants

    rows = [c for c in cases if c.source.startswith("NVIDIA-NeMo/Megatron-Bridge skills/")][:4]
    assert len(rows) == 4
    slow = dataclasses.replace(rows[0], name="slow-copy",
                               measured_tokens_per_s_per_gpu=rows[0].measured_tokens_per_s_per_gpu / 10)
    start = default_constants()
    assert TRIM_FACTOR < 10
    assert [m.name for m in trimmed(start, rows + [slow])] == [m.name for m in rows]
    clean = fit_megatron(start, rows)
    assert fit_megatron(start, rows + [slow]) == clean
    assert search_megatron(start, rows + [slow]) != clean
