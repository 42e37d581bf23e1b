"""The allocator_remap term: a MoE layout on the runner's stack whose allocator cache has no room is priced with its
micro-batches' fp32 logits mapped again; a layout with room, a dense model and the slime stack are not."""
import pytest

from cost_model.allocator_strain import cache_does_not_fit, remap_seconds
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.predict import predict
from experiments.megatron.model_run import trial_model

H200 = load_gpu("h200")
MEGATRON = Workload(framework="megatron", global_batch=1024, seq_len=256)   # micro-batches in steps of 256 tokens


def runner(model, tokens: int):
    return predict(model, H200, MEGATRON, Layout(1, max_tokens_per_gpu=tokens), precision_aware_optimizer=False)


def _at_the_limit(model):
    """(a token count's prediction with room for the allocator's cache, the next one's, 256 tokens more, without room
    but under the usable capacity)."""
    tokens = 4096
    while (m := runner(model, tokens).memory).total < m.usable:
        tokens += 4096
    for t in range(tokens, tokens - 8192, -256):   # down from over the limit: the first under it has no room
        p = runner(model, t)
        if p.memory.total < p.memory.usable and cache_does_not_fit(p.context, p.memory):
            below = runner(model, t - 256)
            while cache_does_not_fit(below.context, below.memory):
                t -= 256
                p, below = below, runner(model, t - 256)
            return below, p
    raise AssertionError(f"{model.name}: no token count under the limit without room for the cache")


def test_a_moe_layout_without_room_for_the_cache_prices_the_remap():
    room, tight = _at_the_limit(trial_model(load_model("qwen3-30b-a3b"), 8))
    assert room is not None and room.breakdown["allocator_remap"] == 0.0
    assert room.memory.device_peak < room.memory.usable
    # no room: the device peak is the usable capacity, and the step holds each micro-batch's logits mapped again
    assert tight.memory.device_peak == pytest.approx(tight.memory.usable)
    remap = tight.breakdown["allocator_remap"]
    assert remap == pytest.approx(remap_seconds(tight.context)) and remap > 0
    assert tight.step_time_s == pytest.approx(sum(tight.breakdown.values()))
    assert tight.tokens_per_s_per_gpu == pytest.approx(MEGATRON.tokens_per_step / tight.step_time_s)
    assert tight.term_sources["allocator_remap"].startswith("modelled: a MoE layout with no room")
    if tight.fit_verdict == "borderline":
        assert "its predicted step includes mapping" in tight.reasons[-1]


def test_a_dense_model_and_the_slime_stack_get_no_remap():
    dense = trial_model(load_model("llama3-8b"), 8)
    for tokens in range(16384, 262144, 4096):
        p = runner(dense, tokens)
        if p.memory.device_peak >= p.memory.usable - 1e-6:
            break
    assert p.memory.device_peak >= p.memory.usable - 1e-6       # no room for its cache either
    assert p.breakdown["allocator_remap"] == 0.0 and not cache_does_not_fit(p.context, p.memory)
    _, tight = _at_the_limit(trial_model(load_model("qwen3-30b-a3b"), 8))
    slime = predict(tight.context.model, H200, Workload(), tight.context.layout)
    assert slime.breakdown["allocator_remap"] == 0.0
    assert slime.term_sources.get("allocator_remap") is None


def test_the_agent_says_when_it_proposes_a_layout_priced_with_the_remap():
    from cost_model.hypotheses import default_hypotheses
    from cost_model.nouns.layout_codec import to_optuna_params
    from tuner.agent import AgentProposer
    from tuner.proposer import Candidate, History

    _, tight = _at_the_limit(trial_model(load_model("qwen3-30b-a3b"), 8))
    agent = AgentProposer([Candidate(tight.context.layout, tight)], to_optuna_params, default_hypotheses(),
                          lambda h, layout: tight.tokens_per_s_per_gpu)
    remap = tight.breakdown["allocator_remap"]
    share = remap / (tight.step_time_s - remap)
    assert f"no room for the allocator's cache: {share:.0%} slower (allocator_remap)" in agent.propose(History()).rationale
