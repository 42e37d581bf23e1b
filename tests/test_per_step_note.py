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
