"""tuner.report.per_step_note: a best layout whose step is mostly per-step costs says the batch is small."""
from tuner.report import per_step_note


def test_a_step_mostly_per_step_costs_names_them_and_the_tokens_each_gpu_gets():
    note = per_step_note({"layers": 0.4, "step_overhead": 0.35, "optimizer": 0.15, "dp_comm": 0.1}, 128, 8192, 512)
    assert note.startswith("the best layout's predicted step is 60% per-step costs (step_overhead 35%, "
                           "optimizer 15%, dp_comm 10%)")
    assert "2,048 tokens a step" in note and "--global-batch 128" in note


def test_a_step_mostly_per_token_work_or_without_a_breakdown_gets_no_note():
    assert per_step_note({"layers": 0.8, "optimizer": 0.1, "step_overhead": 0.1}, 128, 8192, 8) is None
    assert per_step_note(None, 128, 8192, 8) is None
    assert per_step_note({}, 128, 8192, 8) is None


def test_an_offloaded_best_layout_priced_from_the_shipped_profile_says_the_host_is_not_measured():
    """tuner.report.offload_note: the CPU optimizer's host is the shipped profile's, not the user's."""
    from types import SimpleNamespace

    from cost_model.nouns.layout import Layout
    from tuner.report import offload_note
    offloaded = Layout(8, ep=8, optimizer_offload_fraction=1.0)
    row = SimpleNamespace(kind="predicted", layout=offloaded, breakdown={"layers": 0.5, "offload": 0.5})
    note = offload_note(row, own_profile=False)
    assert note.startswith("the best layout offloads the optimizer: 50% of its predicted step is the CPU's")
    assert "tune profile" in note and "--profile" in note
    # no note: the user's own profile priced it, the figure was measured, nothing offloaded, or a small share
    assert offload_note(row, own_profile=True) is None
    assert offload_note(SimpleNamespace(**{**vars(row), "kind": "measured"}), own_profile=False) is None
    assert offload_note(SimpleNamespace(**{**vars(row), "layout": Layout(8, ep=8)}), own_profile=False) is None
    assert offload_note(SimpleNamespace(**{**vars(row), "breakdown": {"layers": 0.95, "offload": 0.05}}),
                        own_profile=False) is None
    assert offload_note(None, own_profile=False) is None
