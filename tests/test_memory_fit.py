"""Fits under the memory model's measured error (issue 25, point 4): a layout is a plain fit only with a high
probability; near the limit it is borderline, and the agent weighs it by its chance to fit."""
from __future__ import annotations

import dataclasses
import math

import pytest

from cost_model.constants import default_constants
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.layout_codec import to_optuna_params
from cost_model.memory_fit import fit_label, fit_probability, fit_verdict
from cost_model.predict import Prediction, predict
from cost_model.nouns.workload import Workload
from tuner.agent import AgentProposer
from tuner.proposer import Candidate, History

SD = 0.012


def test_fit_probability_is_the_normal_chance_that_the_error_stays_under_the_margin():
    assert fit_probability(100.0, 100.0, SD) == pytest.approx(0.5)
    # margin capacity / needed - 1 of one sd: Phi(1)
    assert fit_probability(100.0, 100.0 * (1 + SD), SD) == pytest.approx(0.841345, abs=1e-6)
    assert fit_probability(100.0, 100.0 * (1 - 1.645 * SD), SD) == pytest.approx(0.05, abs=1e-3)
    assert fit_probability(100.0, 100.0 * (1 + 1.645 * SD), SD) == pytest.approx(0.95, abs=1e-3)
    assert fit_probability(139.1, 139.8, SD) == pytest.approx(0.6628, abs=1e-3)   # the motivating case
    assert fit_probability(139.8, 139.1, 0.0) == 0.0 and fit_probability(139.1, 139.8, 0.0) == 1.0
    assert fit_probability(0.0, 10.0, SD) == 1.0
    ps = [fit_probability(n, 139.8, SD) for n in (120, 135, 139, 140, 145)]
    assert ps == sorted(ps, reverse=True)


def test_fit_verdict_thresholds_and_labels():
    assert [fit_verdict(p) for p in (1.0, 0.95, 0.9499, 0.5, 0.05, 0.0499, 0.0)] == [
        "fits", "fits", "borderline", "borderline", "borderline", "does not fit", "does not fit"]
    assert fit_label("borderline", 0.6) == "borderline (60%)"
    assert fit_label("borderline", 0.9499) == "borderline (94%)"      # never shown as a plain fit's 95%
    assert fit_label("fits", 0.99) == "fits" and fit_label("does not fit", 0.01) == "does not fit"


def test_the_constant_is_what_benchmarks_memory_error_derives_from_the_stored_runs():
    import io

    from benchmarks import memory_error
    out = io.StringIO()
    result = memory_error.report(memory_error.default_paths(), out=out)
    assert result["memory_error_sd"] == pytest.approx(default_constants().memory_error_sd, abs=1e-4)
    assert result["overall"]["max_abs"] <= 2 * result["memory_error_sd"]   # every counted run within 2 sd
    assert "memory_error_sd = max(median |error|" in out.getvalue()


def test_the_sd_rule():
    from benchmarks.memory_error import derive_sd
    assert derive_sd(dict(median_abs=0.01, max_abs=0.02))[0] == pytest.approx(0.01 / 0.6745)
    assert derive_sd(dict(median_abs=0.01, max_abs=0.05))[0] == pytest.approx(0.025)
    assert derive_sd(dict(median_abs=0.001, max_abs=0.004))[0] == 0.01


@pytest.fixture(scope="module")
def near_and_far():
    """One layout on an H100 (no measured device_memory: usable is the catalog's memory_gib) whose usable
    memory is set 0.5% and 10% above what it needs."""
    from cost_model.nouns.model_spec import load_model
    model, h100, wl = load_model("qwen3.6-35b-a3b"), load_gpu("h100"), Workload()
    layout = Layout(8, ep=8, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    needed = predict(model, h100, wl, layout).memory.total

    def at(under: float) -> Prediction:
        gpu = dataclasses.replace(h100, memory_gib=needed / (1 - under))
        p = predict(model, gpu, wl, layout)
        assert p.memory.total == pytest.approx(needed) and p.host_memory_gib_per_node <= p.host_memory_capacity_gib
        return p
    return at(0.005), at(0.10)


def test_half_a_percent_under_the_limit_is_borderline_ten_percent_is_a_plain_fit(near_and_far):
    near, far = near_and_far
    sd = default_constants().memory_error_sd
    assert near.fit_verdict == "borderline" and not near.fits and near.may_fit and near.under_limit
    assert near.fit_probability == pytest.approx(fit_probability(near.memory.total, near.gpu_memory_gib, sd))
    assert 0.5 < near.fit_probability < 0.95
    assert len(near.reasons) == 1
    reason = near.reasons[0]
    assert reason.startswith(f"borderline: predicted {near.memory.total:.1f} of {near.gpu_memory_gib:.1f} GiB usable, "
                             "0.5% under; the memory model's measured error (sd ")
    # Qwen3.6 is a MoE model: near the limit its allocator may have no room for its cache, measured slower; the note
    # prices retrying once a micro-batch: its fp32 logits released and mapped again each time
    from cost_model.loss_path import fp32_logits_bytes
    from cost_model.memory_fit import MOE_NEAR_LIMIT_NOTE, borderline_reason, strain_note
    ctx = near.context
    strain_s = (near.num_microbatches * fp32_logits_bytes(ctx.model, ctx.layout, near.tokens_per_microbatch) / 2 ** 30
                * default_constants().allocator_remap_s_per_gib)
    assert 0 < strain_s < near.step_time_s
    note = strain_note(strain_s, near.step_time_s)
    assert reason.endswith(f"gives a {math.floor(near.fit_probability * 100)}% chance to fit{note}")
    assert f"about {strain_s:.2f} s a step, {strain_s / near.step_time_s:.1%} slower" in note
    dense = borderline_reason(near.memory.total, near.gpu_memory_gib, sd, near.fit_probability)
    assert reason == dense + note and "slower" not in dense
    # without the step's figures (a caller that has none) the note says the measured range only
    assert borderline_reason(near.memory.total, near.gpu_memory_gib, sd, near.fit_probability,
                             moe=True) == dense + MOE_NEAR_LIMIT_NOTE
    assert near.fit_label == f"borderline ({math.floor(near.fit_probability * 100)}%)"
    assert far.fit_verdict == "fits" and far.fits and far.reasons == () and far.fit_probability > 0.999


def test_over_the_limit_keeps_its_reason(qwen36):
    h100 = load_gpu("h100")
    p = predict(qwen36, h100, Workload(), Layout(8, ep=8, max_tokens_per_gpu=65536))
    assert p.memory.total > p.gpu_memory_gib * 1.1
    assert p.fit_verdict == "does not fit" and not p.fits and not p.may_fit and p.fit_probability < 0.05
    assert p.reasons[0].startswith(f"GPU memory {p.memory.total:.1f} GiB exceeds {p.gpu_memory_gib:.1f} GiB usable")


def test_prediction_to_dict_carries_the_verdict(near_and_far):
    near, far = near_and_far
    for p in (near, far):
        d = p.to_dict()
        assert d["fit_probability"] == p.fit_probability and d["fit_verdict"] == p.fit_verdict
        assert d["fits"] is (p.fit_verdict == "fits")


def test_a_prediction_built_without_the_verdict_follows_fits(near_and_far):
    far = near_and_far[1]
    fields = {f.name: getattr(far, f.name) for f in dataclasses.fields(Prediction)
              if f.name not in ("fit_probability", "fit_verdict")}
    assert Prediction(**fields).fit_verdict == "fits" and Prediction(**fields).fit_probability == 1.0
    no = Prediction(**{**fields, "fits": False})
    assert no.fit_verdict == "does not fit" and no.fit_probability == 0.0


# ------------------------------------------------------------------------------------------ the agent
def _as(p: Prediction, prob: float) -> Prediction:
    verdict = fit_verdict(prob)
    return dataclasses.replace(p, fits=verdict == "fits", fit_probability=prob, fit_verdict=verdict)


def _agent(cands: list[Candidate]) -> AgentProposer:
    return AgentProposer(cands, to_optuna_params, stop_margin=None)


def test_the_agent_ranks_a_plain_fit_above_a_borderline_layout_of_equal_throughput(near_and_far):
    """Two families, the same predicted tokens/s: the borderline one's value is its gain times its chance to
    fit, so the plain fit comes first, measured or not."""
    p = near_and_far[1]
    plain = Candidate(Layout(8, ep=8), _as(p, 0.999))
    risky = Candidate(Layout(8, tp=2, ep=4), _as(p, 0.6))
    for order in ([plain, risky], [risky, plain]):
        agent = _agent(order)
        _, outs, _ = agent.outlooks(History())
        value = {agent.table.candidates[o.index].layout.key(): o for o in outs}
        assert value[risky.layout.key()].p_fit == 0.6 and value[plain.layout.key()].p_fit == 0.999
        assert value[risky.layout.key()].value < value[plain.layout.key()].value
        assert agent.propose(History()).params == to_optuna_params(plain.layout)


def test_a_borderline_layout_does_not_shadow_a_plain_fit_of_its_coarse_group(near_and_far):
    """The table keeps one layout per coarse group: of equal predicted throughput, the plain fit."""
    p = near_and_far[1]
    risky = Candidate(Layout(8, ep=8, rows_per_microbatch=1), _as(p, 0.6))
    plain = Candidate(Layout(8, ep=8, rows_per_microbatch=2), _as(p, 0.999))
    for order in ([plain, risky], [risky, plain]):
        agent = _agent(order)
        assert [c.layout for c in agent.table.candidates] == [plain.layout]


def test_the_agent_tries_a_borderline_layout_worth_the_risk(near_and_far):
    """A borderline layout predicted much faster than every plain fit is still proposed, flagged."""
    p = near_and_far[1]
    plain = Candidate(Layout(8, ep=8), _as(p, 0.999))
    fast = Candidate(Layout(8, tp=2, ep=4), _as(dataclasses.replace(p, tokens_per_s_per_gpu=2 * p.tokens_per_s_per_gpu),
                                                 0.7))
    proposal = _agent([plain, fast]).propose(History())
    assert proposal.params == to_optuna_params(fast.layout)
    assert proposal.attrs["expected"]["fit_verdict"] == "borderline" and "borderline: predicted peak" in proposal.rationale
