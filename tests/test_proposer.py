import pytest

from candidates import fitting_candidates
from tuner.proposer import AgentProposer, History, family
from cost_model.layout_codec import from_optuna_params, to_optuna_params

pytestmark = pytest.mark.slow  # the candidates are the whole space, predicted


@pytest.fixture(scope="module")
def scored(qwen36, h200, workload, stack):
    return fitting_candidates(qwen36, h200, workload, stack=stack)


def test_agent_exploits_then_hedges_and_never_repeats(scored, workload):
    agent = AgentProposer(scored, to_optuna_params)
    history = History()
    families = []
    for _ in range(6):
        proposal = agent.propose(history)
        layout = from_optuna_params(proposal.params, 8, workload.seq_len)
        assert layout.key() not in history.tried
        history.tried.add(layout.key())
        families.append(family(layout))
        assert "predicted" in proposal.rationale and "GiB" in proposal.rationale
    assert len(set(families)) >= 3, "hedging must spread trials over layout families"
    first = agent.candidates[0]
    assert from_optuna_params(to_optuna_params(first.layout), 8, workload.seq_len) == first.layout


def test_measurements_reorder_the_families(scored, workload):
    agent = AgentProposer(scored, to_optuna_params, hedge_every=10 ** 9)
    best = agent.candidates[0]
    history = History()
    history.tried.add(best.layout.key())
    # The leader's family measured at a third of its prediction: the agent must move to another family.
    history.measured.append((family(best.layout), best.prediction.tokens_per_s_per_gpu / 3,
                             best.prediction.tokens_per_s_per_gpu))
    proposal = agent.propose(history)
    layout = from_optuna_params(proposal.params, 8, workload.seq_len)
    assert family(layout) != family(best.layout)
    assert "scaled by" in proposal.rationale


def test_agent_returns_none_when_everything_was_tried(scored):
    cands = scored[:5]
    agent = AgentProposer(cands, to_optuna_params)
    history = History(tried={c.layout.key() for c in cands})
    assert agent.propose(history) is None
