import pytest

from candidates import fitting_candidates
from cost_model.nouns.layout_codec import from_optuna_params, to_optuna_params
from tuner.agent import AgentProposer
from tuner.proposer import History, SamplerProposer, family

pytestmark = pytest.mark.slow  # the candidates are the whole space, predicted


@pytest.fixture(scope="module")
def scored(qwen36, h200, workload, stack):
    return fitting_candidates(qwen36, h200, workload, stack=stack, every=3)   # a third of the space: 6 s, not 18


def test_agent_never_repeats_and_says_what_it_expects(scored, workload):
    agent = AgentProposer(scored, to_optuna_params)
    history = History()
    for _ in range(6):
        proposal = agent.propose(history)
        layout = from_optuna_params(proposal.params, 8, workload.seq_len)
        assert layout.key() not in history.tried
        history.tried.add(layout.key())
        assert "expects" in proposal.rationale and "GiB" in proposal.rationale
        assert proposal.attrs["expected"]["low"] < proposal.attrs["expected"]["high"]
    first = agent.table.candidates[0]
    assert from_optuna_params(to_optuna_params(first.layout), 8, workload.seq_len) == first.layout


def test_measurements_reorder_the_families(scored, workload):
    """The leader's family measured at a third of its prediction: its family effect goes down beyond the
    common level, and the agent moves to another family."""
    agent = AgentProposer(scored, to_optuna_params)
    best = agent.table.candidates[0]
    history = History(tried={best.layout.key()})
    history.measured_layouts.append((best.layout, best.prediction.tokens_per_s_per_gpu / 3))
    proposal = agent.propose(history)
    layout = from_optuna_params(proposal.params, 8, workload.seq_len)
    assert family(layout) != family(best.layout)
    assert "unmeasured family" in proposal.rationale


def test_agent_returns_none_when_everything_was_tried(scored):
    cands = scored[:5]
    agent = AgentProposer(cands, to_optuna_params)
    history = History(tried={c.layout.key() for c in cands})
    assert agent.propose(history) is None and agent.stop_reason


def test_samplers_by_name():
    assert SamplerProposer("random").sampler().__class__.__name__ == "RandomSampler"
    assert SamplerProposer("tpe").name == "tpe"
    with pytest.raises(ValueError, match="unknown sampler"):
        SamplerProposer("annealing")


def test_samplers_draw_untried_valid_layouts_given_the_candidates(scored, workload):
    """random draws only untried candidates (never an invalid layout, never a replay, None when all are tried);
    tpe does so for its startup trials, then lets Optuna's sampler choose (params None)."""
    cands = scored[:40]
    keys = {c.layout.key() for c in cands}
    for kind, startup in (("random", 10), ("tpe", 3)):
        proposer = SamplerProposer(kind, candidates=cands, to_params=to_optuna_params, startup=startup)
        history = History()
        for i in range(12 if kind == "random" else startup):
            proposal = proposer.propose(history)
            key = from_optuna_params(proposal.params, 8, workload.seq_len).key()
            assert key in keys and key not in history.tried and "random untried layout" in proposal.rationale
            history.tried.add(key)
        if kind == "tpe":
            assert proposer.propose(history).params is None
    random_proposer = SamplerProposer("random", candidates=cands, to_params=to_optuna_params)
    assert random_proposer.propose(History(tried=keys)) is None
