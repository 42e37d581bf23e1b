"""The agent proposer: a posterior over the cost model's hypotheses, expected improvement, trials that tell
hypotheses apart, failures as information, and a stop rule."""
from __future__ import annotations

import math
import random

import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.hypotheses import default_hypotheses, predict_under
from cost_model.nouns.layout_codec import to_optuna_params
from cost_model.nouns.model_spec import load_model
from cost_model.predict import predict
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from search_space.enumerate import SpaceOptions, enumerate_layouts
from tuner.agent import AgentPrior, AgentProposer, Table, belief, lognormal_ei
from tuner.proposer import Candidate, History

OPTIONS = SpaceOptions(full_recompute_layers=(1,), offload_fractions=(0.0,), exp_avg_dtypes=("bf16",), max_vpp=1)


@pytest.fixture(scope="module")
def space():
    model, gpu, wl = load_model("qwen3.6-35b-a3b"), load_gpu("h200"), Workload()
    cands = []
    for layout in enumerate_layouts(model, 8, wl, Stack(), OPTIONS):
        p = predict(model, gpu, wl, layout)
        if p.may_fit:   # what tune hands the agent: plain fits and borderline layouts
            cands.append(Candidate(layout, p))
    cache = {}

    def tps(h, layout):
        key = (h.name, layout.key())
        if key not in cache:
            cache[key] = predict_under(h, model, gpu, wl, layout).tokens_per_s_per_gpu
        return cache[key]
    return cands, tps


def agent_for(space, **kw) -> AgentProposer:
    cands, tps = space
    return AgentProposer(cands, to_optuna_params, default_hypotheses(), tps, **kw)


def chosen(agent: AgentProposer, proposal) -> Candidate:
    return next(c for c in agent.by_key.values() if to_optuna_params(c.layout) == proposal.params)


def test_lognormal_ei_matches_monte_carlo():
    rng = random.Random(0)
    mu, var, best = math.log(100.0), 0.2 ** 2, 110.0
    mc = sum(max(math.exp(rng.gauss(mu, 0.2)) - best, 0.0) for _ in range(200_000)) / 200_000
    assert lognormal_ei(mu, var, best) == pytest.approx(mc, rel=0.03)
    assert lognormal_ei(mu, var, 0.0) == pytest.approx(math.exp(mu + var / 2))


@pytest.mark.slow
def test_the_posterior_finds_the_true_form_and_level(space):
    """Measurements made by one hypothesis at 0.6 of its level: after a handful the weight is on that
    form and the level near 0.6."""
    agent = agent_for(space)
    truth_h = next(h for h in default_hypotheses() if h.form == "per_token" and h.flex_overhead_factor == 0.8)
    history = History()
    for _ in range(5):
        p = agent.propose(history)
        c = chosen(agent, p)
        assert c.layout.key() not in history.tried          # never the same layout twice
        history.tried.add(c.layout.key())
        history.measured_layouts.append((c.layout, 0.6 * space[1](truth_h, c.layout)))
        learnt = agent.after_trial(history)
        assert "level now" in learnt.get("learnt", "level now") and learnt["hypothesis_weights_after"]
    b = agent.belief(history)
    by_form = {}
    for h, w in zip(agent.table.hypotheses, b.weights):
        by_form[h.form] = by_form.get(h.form, 0.0) + w
    assert max(by_form, key=by_form.get) in ("per_token", "per_step")   # the two agree on every DP8 layout
    k = next(i for i, h in enumerate(agent.table.hypotheses) if h is truth_h)
    assert math.exp(b.level_mean[k]) == pytest.approx(0.6, rel=0.05)


def test_a_resumed_agent_proposes_the_same(space):
    """Its belief is a function of the study's trials: a new agent given the same history agrees."""
    a, b = agent_for(space), agent_for(space)
    history = History()
    first = a.propose(history)
    c = chosen(a, first)
    history.tried.add(c.layout.key())
    history.measured_layouts.append((c.layout, 3000.0))
    assert a.propose(history).params == b.propose(history).params


def test_proposals_carry_the_interval_and_weights(space):
    p = agent_for(space).propose(History())
    e = p.attrs["expected"]
    assert e["low"] < e["mean"] < e["high"] and 0 <= e["p_fit"] <= 1
    assert abs(sum(p.attrs["hypothesis_weights"].values()) - 1) < 0.01
    assert "expects" in p.rationale and "weights" in p.rationale


def test_an_oom_rules_out_its_family_at_that_memory_and_above(space):
    agent = agent_for(space)
    first = chosen(agent, agent.propose(History()))
    history = History(tried={first.layout.key()})
    history.failed.append((first.layout.key(), "cuda_oom", first.prediction.peak_memory_gib))
    _, outs, _ = agent.outlooks(history)
    fam = lambda c: (c.layout.tp, c.layout.pp, c.layout.vpp, c.layout.cp, c.layout.ep, c.layout.etp,  # noqa: E731
                     c.layout.dispatcher)
    for o in outs:
        c = agent.table.candidates[o.index]
        if fam(c) == fam(first) and c.prediction.peak_memory_gib >= first.prediction.peak_memory_gib:
            assert o.p_fit == 0.0 and o.value == 0.0


def test_memory_near_the_limit_lowers_p_fit(space):
    agent = agent_for(space)
    near = min(agent.by_key.values(), key=lambda c: c.prediction.gpu_memory_gib - c.prediction.peak_memory_gib)
    far = max(agent.by_key.values(), key=lambda c: c.prediction.gpu_memory_gib - c.prediction.peak_memory_gib)
    assert agent._p_fit(near, {}) < 0.9 and agent._p_fit(far, {}) > 0.999


def test_it_stops_when_nothing_untried_can_beat_the_best(space):
    agent = agent_for(space, stop_margin=0.03)
    history = History()
    first = chosen(agent, agent.propose(history))
    history.tried.add(first.layout.key())
    # a measurement far above everything the hypotheses allow: no upper bound beats it
    history.measured_layouts.append((first.layout, 1e7))
    assert agent.propose(history) is None and "95% upper bound" in agent.stop_reason


def test_belief_without_measurements_is_the_prior(space):
    agent = agent_for(space)
    b = belief(agent.table, [], 0.15, 0.5)
    assert all(w == pytest.approx(1 / len(b.weights)) for w in b.weights) and b.measured == 0


def test_the_table_shortlists_one_layout_per_group(space):
    cands, tps = space
    t = Table.build(cands, default_hypotheses(), tps)
    assert 0 < len(t.candidates) < len(cands) and len(t.values) == len(default_hypotheses())
    assert all(len(v) == len(t.candidates) for v in t.values)


def test_the_band_printed_before_a_trial_is_the_one_the_study_stores(space):
    from tuner.intervals import posterior_interval
    agent = agent_for(space)
    p = agent.propose(History())
    stored = posterior_interval(p.attrs["expected"], 0)
    assert f"expects {stored.median:,.0f} [{stored.low:,.0f}-{stored.high:,.0f}]" in p.rationale
    assert stored.low < stored.median < stored.high and stored.level == 0.9
    assert posterior_interval(None, 0) is None and posterior_interval({"low": "x"}, 0) is None


def test_the_runner_stacks_prior_is_its_measured_error_so_the_band_is_narrow(space):
    from cost_model.constants import default_constants
    from tuner.intervals import prior_parts
    cands, tps = space
    level_sd, family_sd, sigma = prior_parts(default_constants().runner_prediction_error_sd)
    agent = agent_for(space, prior=AgentPrior(sigma=sigma, level_sd=level_sd, family_sd=family_sd))
    e = agent.propose(History()).attrs["expected"]
    assert e["high"] / e["low"] <= 1.5 * 1.7   # the runner band (x1.14) over the hypotheses' own spread
    h = History()
    for c in cands[:2]:
        h.tried.add(c.layout.key())
        h.measured_layouts.append((c.layout, tps(default_hypotheses()[0], c.layout)))
    before, after = agent.propose(History()).attrs["expected"], agent.propose(h).attrs["expected"]
    assert after["high"] / after["low"] < before["high"] / before["low"]   # measurements narrow it


def test_the_predicted_backend_headlines_the_hypotheses_median_not_the_shipped_one():
    from cost_model.nouns.case import Case
    from cost_model.hypotheses import predict_interval
    from cost_model.nouns.layout_codec import layout_from_values
    from experiments.predicted_runner import PredictedRunner
    from experiments.runner import TrialSpec
    model, gpu, wl = load_model("qwen3.6-35b-a3b"), load_gpu("h200"), Workload()
    layout = layout_from_values({"ep": 8, "max_tokens_per_gpu": 16384, "recompute_granularity": "full",
                                 "recompute_method": "uniform", "recompute_num_layers": 1}, 8, 8192)
    result = PredictedRunner().run(TrialSpec(Case(model, gpu, wl, layout), 20, (5, 19)))
    assert result.status == "ok", result.detail
    iv = predict_interval(default_hypotheses(), model, gpu, wl, layout)
    shipped = predict(model, gpu, wl, layout).tokens_per_s_per_gpu
    assert result.tokens_per_s_per_gpu == pytest.approx(iv.median, rel=1e-9)
    assert result.tokens_per_s_per_gpu < shipped and "median of its 15 hypotheses" in result.source


def test_a_candidate_with_its_own_extra_sd_gets_a_wider_band_and_weighs_less_as_evidence(space):
    """Table.extra_var: a candidate's prediction error beyond the prior's (a runner prediction near its host/GPU
    crossing): its band is wider, and its measurement moves the level less than a plain one's."""
    cands, tps = space
    shaky = {cands[0].layout.key()}
    plain = agent_for(space)
    extra = agent_for(space, extra_sd=lambda c: 0.2 if c.layout.key() in shaky else 0.0)
    i = extra.table.index[cands[0].layout.key()]
    assert extra.table.extra_var[i] == pytest.approx(0.04) and sum(extra.table.extra_var) == pytest.approx(0.04)
    b0, b1 = plain.belief(History()), extra.belief(History())
    from tuner.agent import outlook
    o0, o1 = outlook(plain.table, b0, i, 0.0, 1.0, 0.0), outlook(extra.table, b1, i, 0.0, 1.0, 0.0)
    assert o1.high / o1.low > o0.high / o0.low
    h = History()
    h.tried.add(cands[0].layout.key())
    h.measured_layouts.append((cands[0].layout, 2.0 * tps(default_hypotheses()[0], cands[0].layout)))
    moved_plain = max(abs(m) for m in plain.belief(h).level_mean)
    moved_extra = max(abs(m) for m in extra.belief(h).level_mean)
    assert 0 < moved_extra < moved_plain


def test_a_measurement_that_ran_short_of_memory_does_not_move_the_level(space):
    """A layout measured with the allocator retrying every step (History.strained) keeps its figure as the best
    measured, but the belief does not learn the model's level from it."""
    agent = agent_for(space)
    history = History()
    c = chosen(agent, agent.propose(history))
    history.tried.add(c.layout.key())
    history.measured_layouts.append((c.layout, 0.5 * c.prediction.tokens_per_s_per_gpu))
    history.strained.add(c.layout.key())
    learnt = agent.after_trial(history)
    assert "allocator retried" in learnt["learnt"]
    assert agent.belief(history).measured == 0
    assert agent.outlooks(history)[0].measured == 0
    history.strained.clear()   # the same figure, not strained: it moves the level
    assert agent.belief(history).measured == 1
