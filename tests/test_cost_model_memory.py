"""The device-level memory model (issue 12): the allocator's peak by part, the loss path, the optimizer
step's temporary, the allocator's reserve and what a process holds outside PyTorch, against the code it
models (megatron-core's process groups) and against the megatron runner's stored H200 measurements."""
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from cost_model.nouns.case import Case
from cost_model.constants import default_constants
from cost_model.device_memory import DeviceMemory, NcclMemory, nccl_gib, overheads, parse_device_memory
from cost_model.nouns.layout import Layout
from cost_model.loss_path import loss_path_bytes, padded_vocab
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.profile import ProfileError, profile_from_dict
from cost_model.nouns.runtime import MEGATRON, MEGATRON_RUNNER, SLIME, communicators, default_runtime, \
    megatron_process_groups
from cost_model.nouns.units import GIB
from cost_model.nouns.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WL = Workload(seq_len=4096, global_batch=16, framework="megatron")
FULL1 = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def trial_model_of(model, layers=4):
    from experiments.megatron.model_run import trial_model
    return trial_model(model, layers, True)


def runner_prediction(model, h200, layers, layout, seq_len=4096, global_batch=16, replace_gdn=True):
    """What the megatron runner predicts for its model run (no TE here or on the H200 machine)."""
    from experiments.megatron.model_run import predict_run, trial_model
    wl = Workload(seq_len=seq_len, global_batch=global_batch, framework="megatron")
    return predict_run(Case(trial_model(model, layers, replace_gdn), h200, wl, layout))


# ------------------------------------------------------------------------------------------ parts
def test_the_parts_add_up_to_the_device_level_peak(qwen36, h200):
    p = predict(qwen36, h200, WL, Layout(8, ep=8, **FULL1), precision_aware_optimizer=False)
    m = p.memory
    d = m.as_dict()
    assert all(isinstance(v, float) for v in d.values())            # the runner rounds every value
    assert d["allocated"] == pytest.approx(sum(d[k] for k in ("weights", "grads", "optimizer", "activations",
                                                              "loss_path", "optimizer_step")))
    assert d["outside_pytorch"] == pytest.approx(d["cuda_context"] + d["nccl"] + d["deepep"])
    assert d["total"] == pytest.approx(d["allocated"] + d["allocator_reserve"] + d["outside_pytorch"])
    assert d["device_peak"] == pytest.approx(d["total"] + d["allocator_cache"]) and d["device_peak"] <= d["usable"]
    assert p.peak_memory_gib == m.total and p.gpu_memory_gib == m.usable == d["usable"]
    nccl = p.to_dict()["memory_sources"]["nccl"]
    # the shipped profile measured single-rank communicators only: the 8-rank ones are the fallback's
    assert nccl.startswith("profile device_memory.nccl") and "of 8 ranks not measured there: constants.yaml" in nccl


def test_usable_is_the_measured_visible_capacity_else_the_catalog(qwen36, h200):
    layout = Layout(8, ep=8, **FULL1)
    shipped = predict(qwen36, h200, WL, layout)
    from cost_model.profile import shipped_profile
    assert shipped.gpu_memory_gib == shipped_profile("h200").device_memory.visible_gib
    assert 139 < shipped.gpu_memory_gib < h200.memory_gib                # measured, below the catalog's figure
    assert "device_memory.visible_gib" in shipped.memory.sources["usable"]
    from tests.test_profile import synthetic_profile
    bare = predict(qwen36, h200, WL, layout, profile=profile_from_dict(synthetic_profile()))
    assert bare.gpu_memory_gib == h200.memory_gib and "catalog" in bare.memory.sources["usable"]


def test_the_allocator_cache_fills_room_but_never_decides_the_fit(qwen36, h200):
    from experiments.megatron.model_run import trial_model
    small = predict(trial_model(qwen36, 4, True), h200, WL, Layout(2, ep=2, max_tokens_per_gpu=4096),
                    precision_aware_optimizer=False)
    from cost_model.memory import allocator_gap_gib
    c = default_constants()
    # MoE: the gap grows with the micro-batch's routed rows (4 layers, EP2: 4096 tokens x 8 rows x 2048 x bf16)
    gap = allocator_gap_gib(trial_model(qwen36, 4, True),
                            Layout(2, ep=2, max_tokens_per_gpu=4096), 4096, 8, c)
    assert gap == pytest.approx(c.allocator_gap_moe_gib + c.allocator_gap_per_dispatched_gib * 4096 * 8 * 2048 * 2 / 2**30)
    assert small.memory.allocator_cache == pytest.approx(gap - small.memory.allocator_reserve, rel=0.05)
    big = predict(trial_model(qwen36, 7, True), h200, WL, Layout(1, max_tokens_per_gpu=4096),
                  precision_aware_optimizer=False)
    assert not big.fits and big.memory.allocator_cache == 0 and big.memory.device_peak == big.peak_memory_gib
    for layers in range(4, 7):
        p = predict(trial_model(qwen36, layers, True), h200, WL, Layout(1, max_tokens_per_gpu=4096),
                    precision_aware_optimizer=False)
        assert p.fits is (p.peak_memory_gib <= p.gpu_memory_gib)
        assert p.memory.device_peak <= max(p.gpu_memory_gib, p.peak_memory_gib)


def test_a_moe_model_cut_to_its_dense_layers_has_a_dense_models_allocator_gap():
    from cost_model.memory import allocator_gap_gib, dispatched_gib
    from cost_model.nouns.model_spec import load_model
    from experiments.megatron.model_run import trial_model
    c, layout = default_constants(), Layout(1, max_tokens_per_gpu=32768)
    glm = load_model("glm4.5-air")   # 1 dense first layer, then MoE layers
    first, two = trial_model(glm, 1, False), trial_model(glm, 2, False)
    assert first.is_moe and not first.has_moe_layers and two.has_moe_layers
    assert dispatched_gib(first, layout, 32768, 8) == 0.0
    assert allocator_gap_gib(first, layout, 32768, 8, c) == c.allocator_gap_dense_gib
    assert allocator_gap_gib(two, layout, 32768, 8, c) > c.allocator_gap_moe_gib


def test_loss_path_counts_the_logits_tensors_alive_at_once(qwen36):
    tokens, v = 8192, padded_vocab(qwen36.vocab_size, 1)
    h = qwen36.hidden_size
    # megatron: bf16 logits + their fp32 copy (forward); the fp32 gradient + its bf16 cast (backward)
    assert loss_path_bytes(qwen36, Layout(1), tokens, MEGATRON) == pytest.approx(6 * tokens * v + 2 * tokens * h)
    # slime: the model's bf16 logits, slime's clone, the fp32 upcast, plus fp32 per-token log-probs
    assert loss_path_bytes(qwen36, Layout(1), tokens, SLIME) == pytest.approx(8 * tokens * v + 4 * tokens
                                                                              + 2 * tokens * h)
    tp2 = loss_path_bytes(qwen36, Layout(2, tp=2, etp=1), tokens, MEGATRON)
    assert tp2 == pytest.approx(6 * tokens * padded_vocab(qwen36.vocab_size, 2) / 2 + 2 * tokens * h * 1.5)
    assert padded_vocab(128256, 1) == 128256 and padded_vocab(151936, 2) == 152064 and padded_vocab(1000, 4) == 1024


def test_the_issue_12_loss_path_oom_is_counted(qwen36, h200):
    """b1 (2 GPUs, DP2, 4 x 8,192-token rows): the OOM asked for 30.31 GiB (the fp32 copy of 32,768 x
    248,320 logits) with 86.31 GiB allocated: the allocator's peak is at least their sum."""
    layout = Layout(2, max_tokens_per_gpu=32768, rows_per_microbatch=4)
    p = runner_prediction(qwen36, h200, 4, layout, seq_len=8192)
    assert 32768 * 248320 * 4 / GIB == pytest.approx(30.31, abs=0.01)
    assert p.memory.loss_path > 45.5
    # This run (GDN replaced, no expandable segments, an earlier runner) puts the MoE activation factor at
    # 1.093 or more; 12 later runs fit 0.86-0.91 (benchmarks/runner_activation_fit.py reports the bound
    # beside the fit). The allocated peak is held within 4% of the bound until a current run settles it.
    assert p.memory.allocated >= (86.31 + 30.31) * 0.96
    # the 8-layer EP2 full-recompute layout: 84.9 GiB allocated when it asked for the same 30.31 GiB
    # (within 0.5 GiB, 0.4%: the MoE activation factor, fitted, moves this full-recompute peak by tenths)
    ep2 = Layout(2, ep=2, max_tokens_per_gpu=32768, rows_per_microbatch=4, **FULL1)
    assert runner_prediction(qwen36, h200, 8, ep2, seq_len=8192).memory.allocated >= 84.9 + 30.31 - 0.5


def test_optimizer_step_temporary_only_without_a_fused_adam(qwen36, h200):
    layout = Layout(1, max_tokens_per_gpu=4096)
    runner = runner_prediction(qwen36, h200, 4, layout)
    assert runner.memory.optimizer_step > 5                        # 1 GPU: the step, not the loss, sets the peak
    # TP2 EP1 (experts have their own groups, ETP != TP): the temporary is the larger shard, the experts'
    tp2 = runner_prediction(qwen36, h200, 4, Layout(2, tp=2, etp=1, max_tokens_per_gpu=4096))
    assert tp2.memory.allocated == pytest.approx(51.67, rel=0.01)
    # measured on H200 (benchmarks/results/megatron-h200-suite.jsonl): 89.46 GiB allocated
    assert runner.memory.allocated == pytest.approx(89.46, rel=0.01)
    from experiments.megatron.model_run import trial_model
    te = predict(trial_model(qwen36, 4, True), h200, WL, layout)
    assert te.memory.optimizer_step == 0


# ------------------------------------------------------------------------------------------ measured
# the runner's stored H200 results with their suites: Qwen3.6 with its GDN layers replaced by full attention
REPLACED_GDN_RESULTS = {"megatron-h200-suite.jsonl": "megatron_h200_suite.json",
                        "x2-h200-vs-leaderboard-suite.jsonl": "x2_vs_leaderboard_suite.json",
                        "sdpa-mbs-h200-suite.jsonl": "sdpa_mbs_suite.json",
                        "convergence-pipeline-h200-suite.jsonl": "convergence_pipeline_suite.json"}
# ... and with the real layer pattern (GDN through fla), Qwen3-30B-A3B and Llama3-8B (issue 12's runs)
REAL_LAYERS_RESULTS = {"megatron-h200-gdn-suite.jsonl": "megatron_h200_gdn_suite.json",
                       "x2-h200-vs-leaderboard-gdn-suite.jsonl": "x2_vs_leaderboard_gdn_suite.json",
                       "gdn-h200-2g-suite.jsonl": "gdn_h200_suite.json",
                       "memory-boundary-h200-v2.jsonl": "memory_boundary_h200_v2_suite.json",
                       "memory-boundary-h200-v2-gdn.jsonl": "memory_boundary_h200_v2_gdn_suite.json"}


def _stored_results(pairs=None):
    """(trial, suite) of the runner's stored H200 results with their suites."""
    pairs = pairs or REPLACED_GDN_RESULTS
    from experiments.megatron.suite import parse_suite
    for result, suite in pairs.items():
        trials = {t.name: t for t in parse_suite(ROOT / "benchmarks" / suite)[0]}
        for line in (RESULTS / result).read_text().splitlines():
            yield json.loads(line), trials


@pytest.mark.torch
@pytest.mark.parametrize("pairs, low, n", [(REAL_LAYERS_RESULTS, -0.015, 20), (REPLACED_GDN_RESULTS, -0.04, 10)],
                         ids=["real-layers", "gdn-replaced"])
def test_allocated_peak_matches_the_runners_h200_measurements(qwen36, h200, pairs, low, n):
    """Every stored layout that ran: the predicted allocator peak within a median 1% and each within
    +3% / -1.5% of max_memory_allocated. With the real layers the MoE factor, fitted when it also scaled the
    Gated DeltaNet block's count, leaves Qwen3.6's runs up to 1.3% under since that block is counted from its
    source (constants.yaml unfused_moe_activation_factor). The runs with Qwen3.6's GDN layers replaced by full
    attention hold up to 3.4% more than predicted: replaced layers keep more."""
    from experiments.runner import TrialResult
    errors, seen = [], set()
    for line, trials in _stored_results(pairs):
        r = TrialResult.from_dict(line)
        t, d = trials.get(line["trial"]), r.details
        if r.status != "ok" or t is None or not d.get("memory_gib_per_rank"):
            continue
        gb, layers = d["global_batch_rows"], d["model_run"]["layers"]
        key = (t.layout, layers, gb, t.workload.seq_len)
        if key in seen:
            continue
        seen.add(key)
        p = runner_prediction(load_model(t.model), h200, layers, t.layout, t.workload.seq_len, gb, t.replace_gdn)
        measured = max(m["peak_allocated"] for m in d["memory_gib_per_rank"].values())
        errors.append(p.memory.allocated / measured - 1)
    assert len(errors) >= n
    assert statistics.median(abs(e) for e in errors) < 0.01
    assert all(low < e < 0.03 for e in errors), errors


# ------------------------------------------------------------------------------------------ outside PyTorch
@pytest.mark.torch
@pytest.mark.parametrize("world, kw", [
    (1, {}), (2, dict(ep=2)), (2, dict(tp=2)), (2, dict(pp=2)), (2, dict(cp=2)), (2, dict(tp=2, ep=2, etp=1)),
    (8, dict(tp=2, ep=4, etp=1)), (8, dict(pp=2, ep=2, etp=2)), (8, dict(cp=2, ep=4)), (8, dict(pp=4, vpp=2, ep=2)),
])
def test_process_groups_are_megatrons(world, kw):
    """The NCCL groups initialize_model_parallel makes rank 0 a member of (fake process group, no GPU)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore
    layout = Layout(world, **kw)
    made = []
    real = dist.new_group

    def spy(*args, **kwargs):
        ranks = kwargs["ranks"] if "ranks" in kwargs else args[0]
        group = real(*args, **kwargs)
        if kwargs.get("backend") != "gloo" and 0 in ranks:
            made.append((kwargs.get("group_desc"), len(ranks)))
        return group

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        dist.new_group = spy
        ps.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
            context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp, create_gloo_process_groups=False)
    finally:
        dist.new_group = real
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    ours = megatron_process_groups(layout)
    assert ours[0] == ("DEFAULT_PROCESS_GROUP", world)
    assert sorted(ours[1:]) == sorted(made)


def test_eager_initialisation_creates_every_group_lazy_only_the_used(qwen36):
    layout = Layout(1)
    created, used = communicators(layout, MEGATRON_RUNNER)
    assert len(created) == 21 and len(used) == 4
    lazy_created, lazy_used = communicators(layout, MEGATRON)
    assert lazy_created == lazy_used == used
    ep2 = communicators(Layout(2, ep=2), MEGATRON)[1]
    assert {"EXPERT_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP"} <= {g for g, _ in ep2}
    assert "EXPERT_DATA_PARALLEL_GROUP" not in {g for g, _ in communicators(Layout(2), MEGATRON, is_moe=False)[1]}
    assert default_runtime("slime") is SLIME and default_runtime("megatron") is MEGATRON
    assert default_runtime("megatron", precision_aware_optimizer=False) is MEGATRON_RUNNER


def test_outside_pytorch_covers_the_issue_12_ooms_and_the_boundary_runs(qwen36, h200):
    """8.8-9.4 GiB outside PyTorch in the OOM messages (1 and 2 GPUs, without expandable segments) and
    8.42-8.9 GiB in the boundary runs without Gated DeltaNet layers (with expandable segments), 9.2 with them: the
    shipped profile's figure for the runner is the boundary runs' largest without them, and a model with them adds
    their kernels' 0.30 GiB; the constants' fallback is not below the OOM messages."""
    for layout in (Layout(1, max_tokens_per_gpu=16384, rows_per_microbatch=4),
                   Layout(2, max_tokens_per_gpu=32768, rows_per_microbatch=4)):
        p = runner_prediction(qwen36, h200, 4, layout)
        assert 8.86 <= p.memory.outside_pytorch <= 8.9, p.memory.as_dict()
        assert "measured at this GPU count" in p.memory.sources["cuda_context"]
        gdn = runner_prediction(qwen36, h200, 4, layout, replace_gdn=False)
        assert 9.15 <= gdn.memory.outside_pytorch <= 9.2 + 1e-9, gdn.memory.as_dict()
        assert gdn.memory.outside_pytorch == pytest.approx(p.memory.outside_pytorch
                                                           + default_constants().runner_gdn_kernels_gib)
        assert "Gated DeltaNet kernels" in gdn.memory.sources["cuda_context"]
        from tests.test_profile import synthetic_profile
        bare = predict(trial_model_of(qwen36), h200, WL, layout, precision_aware_optimizer=False,
                       profile=profile_from_dict(synthetic_profile()))
        assert 9.4 <= bare.memory.outside_pytorch <= 11.0, bare.memory.as_dict()


def test_measured_nccl_rows_replace_the_fallback():
    c = default_constants()
    dev = DeviceMemory(nccl=(NcclMemory(1, 0.1, 0.5), NcclMemory(2, 0.2, 0.3), NcclMemory(8, 0.25, 0.4)))
    assert dev.nccl_at(1).ranks == 1 and dev.nccl_at(2).ranks == 2 and dev.nccl_at(4).ranks == 8
    assert dev.nccl_at(16).ranks == 8
    created, used = (("A", 1), ("B", 2), ("C", 1)), (("B", 2),)
    assert nccl_gib(created, used, dev, c) == pytest.approx(0.1 + 0.2 + 0.1 + 0.3)
    assert nccl_gib(created, used, None, c) == pytest.approx(3 * c.nccl_init_gib_per_communicator
                                                              + c.nccl_buffers_gib_per_communicator)


def test_profile_device_memory_section_is_read_with_its_provenance(h200):
    data = {"provenance": "measured by tune profile", "date": "2026-12-01", "visible_gib": 139.8,
            "context_gib": 1.1, "allocator_reserve": {"fraction": 0.004},
            "nccl": [{"ranks": 2, "init_gib": 0.05, "buffers_gib": 0.3}, {"ranks": 1, "init_gib": 0.02,
                                                                          "buffers_gib": 0.5}]}
    dev = parse_device_memory(data, "p.yaml")
    over = overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, dev, default_constants())
    assert over.usable == 139.8 and over.cuda_context == 1.1 and over.allocator_reserve == pytest.approx(0.4)
    assert over.allocator_cache(100.0, 1.5) == pytest.approx(1.5 - 0.4)
    assert over.allocator_cache(139.0, 1.5) == 0.0        # no room: the cache is given back
    assert over.nccl == pytest.approx(21 * 0.02 + 4 * 0.5)
    assert all("2026-12-01" in over.sources[k] for k in ("usable", "cuda_context", "allocator_reserve"))
    assert over.sources["nccl"].startswith("profile device_memory.nccl") and "21 communicators" in over.sources["nccl"]
    assert parse_device_memory({"provenance": "not measured: no CUDA device"}) == DeviceMemory()
    from tests.test_profile import synthetic_profile
    bad = dict(synthetic_profile(), device_memory={"visible_gib": "lots"})
    with pytest.raises(ProfileError, match="visible_gib must be a number"):
        profile_from_dict(bad, "p.yaml")


def test_flex_adds_deepep_buffers(qwen36, h200):
    base = Layout(8, ep=8, **FULL1)
    a = predict(qwen36, h200, WL, base)
    b = predict(qwen36, h200, WL, dataclasses.replace(base, dispatcher="flex"))
    assert a.memory.deepep == 0 and b.memory.deepep == default_constants().deepep_buffers_gib
    assert "deepep" in b.memory.sources and "deepep" not in a.memory.sources


# ------------------------------------------------------------------------------------------ published runs
def test_no_published_run_that_ran_becomes_a_refusal():
    """The public rows all ran: none is predicted not to fit. (r026, refused until issue 16, states no recompute:
    the row's unknown is now searched, and the fastest setting predicted to fit is taken, with a note.)"""
    from benchmarks.public_data import load_cases
    cases, _ = load_cases()
    refused = [m.name for m in cases if not predict(m.case.model, m.case.gpu, m.case.workload, m.case.layout).may_fit]
    assert refused == []
    r026 = next(m for m in cases if m.name == "r026-moonlight-16b-a3b-h100x8")
    assert any("searched" in note for note in r026.notes)


def test_the_runner_probe_is_a_floor_for_the_runner_only(h200):
    dev = parse_device_memory({"provenance": "measured", "context_gib": 0.8,
                               "nccl": [{"ranks": 1, "init_gib": 0.05, "buffers_gib": 0.5}],
                               "runner_outside": [{"gpus": 1, "outside_gib": 8.9}, {"gpus": 2, "outside_gib": 9.3}]})
    c = default_constants()
    one = overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, dev, c)
    assert one.outside_pytorch == pytest.approx(8.9) and "measured at this GPU count" in one.sources["cuda_context"]
    assert overheads(Layout(2, ep=2), MEGATRON_RUNNER, True, 100.0, h200, dev, c).outside_pytorch == pytest.approx(9.3)
    lazy = overheads(Layout(1), MEGATRON, True, 100.0, h200, dev, c)
    assert lazy.outside_pytorch < 8.9 and "megatron runner" not in lazy.sources["cuda_context"]
    # measured at this GPU count, the runner's figure replaces the parts, also when it is below them
    low = parse_device_memory({"context_gib": 5.0, "runner_outside": [{"gpus": 1, "outside_gib": 1.0}]})
    below = overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, low, c)
    assert below.outside_pytorch == pytest.approx(1.0)
    # a whole below the modelled communicators is split in the modelled proportion: no part is negative
    assert below.cuda_context >= 0 and below.nccl >= 0
    tiny = parse_device_memory({"context_gib": 0.5, "runner_outside": [{"gpus": 1, "outside_gib": 0.01}]})
    split = overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, tiny, c)
    assert split.cuda_context > 0 and split.nccl > 0 and split.outside_pytorch == pytest.approx(0.01)
    assert "scaled by" in split.sources["nccl"]
    # at another GPU count it is a floor only
    four = overheads(Layout(4, ep=4), MEGATRON_RUNNER, True, 100.0, h200, low, c)
    assert four.cuda_context == 5.0 and "megatron runner" not in four.sources["cuda_context"]


def test_a_probe_without_gdn_kernels_adds_theirs_to_a_model_with_gdn_layers_only(h200):
    """A runner probe run with its Gated DeltaNet layers replaced (a profile of a model without them) misses what
    fla's kernels hold: a model with GDN layers gets runner_gdn_kernels_gib on top, said in the source; a model
    without them, and a probe that ran them, get the figure as measured."""
    c = default_constants()
    rows = [{"gpus": 1, "outside_gib": 8.9, "without_gdn": True}]
    without = parse_device_memory({"context_gib": 0.8, "runner_outside": rows})
    gdn = overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, without, c, has_gdn=True)
    assert gdn.outside_pytorch == pytest.approx(8.9 + c.runner_gdn_kernels_gib)
    assert "Gated DeltaNet kernels it did not load" in gdn.sources["cuda_context"]
    assert overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, without, c).outside_pytorch == pytest.approx(8.9)
    ran = parse_device_memory({"context_gib": 0.8, "runner_outside": [{"gpus": 1, "outside_gib": 9.2}]})
    assert not ran.runner_without_gdn
    assert overheads(Layout(1), MEGATRON_RUNNER, True, 100.0, h200, ran, c, has_gdn=True).outside_pytorch == pytest.approx(9.2)


def test_qk_norm_inputs_are_saved_whatever_core_attn_recompute_does():
    """The q and k RMSNorms (Qwen3) keep their inputs for the backward: one bf16 query and one bf16 key per token,
    sharded over TP, and recomputing core_attn (which starts after them) does not drop them."""
    from cost_model.activations import softmax_attention_bytes
    from cost_model.nouns.units import BF16
    qwen3 = load_model("qwen3-30b-a3b")
    assert qwen3.qk_norm
    plain = dataclasses.replace(qwen3, qk_norm=False)
    q = qwen3.num_attention_heads * qwen3.head_dim
    k = qwen3.num_key_value_heads * qwen3.head_dim
    for layout, mods in ((Layout(1), set()), (Layout(2), {"core_attn"}), (Layout(1), {"core_attn", "layernorm"})):
        extra = softmax_attention_bytes(qwen3, layout, mods, 4096) - softmax_attention_bytes(plain, layout, mods, 4096)
        assert extra == pytest.approx(BF16 * (q + k) / layout.tp * 4096)


def test_the_activations_term_says_how_it_was_counted_and_what_was_fitted():
    """`tune predict --explain` lists a source for every memory part: the activations name the CPU trace for what
    it counts, and the fitted MoE factor only where a MoE layer uses it."""
    from cost_model.nouns.hardware import load_gpu

    def source(name, runtime=None):
        p = predict(load_model(name), load_gpu("h200"), WL, Layout(1, max_tokens_per_gpu=4096), runtime=runtime)
        return p.memory.sources["activations"]

    dense, moe = source("llama3-8b", MEGATRON_RUNNER), source("qwen3.6-35b-a3b", MEGATRON_RUNNER)
    assert "saved_tensors_cpu" in dense and "unfused_moe_activation_factor" not in dense
    assert "shared experts" in moe and "Gated DeltaNet" in moe and "unfused_moe_activation_factor" in moe
    assert "Transformer Engine" in source("qwen3.6-35b-a3b")
    p = predict(load_model("llama3-8b"), load_gpu("h200"), WL, Layout(1, max_tokens_per_gpu=4096))
    assert "6 bytes a logit" in p.memory.sources["loss_path"]   # megatron's bf16 logits and their fp32 copy
