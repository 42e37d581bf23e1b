"""The measured study loop ranks what its runner runs (issue 13): the space narrowed to the runner's
stack, the runner's own prediction for its model run, no layout proposed again after a permanent
failure, a runnable convergence reference, and a study optuna-dashboard shows well."""
from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState

import tuner.study_commands as study_commands
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout_codec import to_optuna_params
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from experiments.megatron.model_run import predict_run, trial_model
from experiments.megatron.runner import MegatronRunner, detect_stack
from experiments.predicted_runner import PredictedRunner
from experiments.runner import TrialResult
from search_space.enumerate import SpaceOptions, enumerate_layouts
from search_space.runner_space import RunnerSpaceError, narrow
from tuner.cli import main
from tuner.agent import AgentProposer
from tuner.proposer import SamplerProposer
from tuner.study import StudyConfig, StudyError, history_of, load_or_create, run_study, runner_space
from tuner.verify import default_reference

MODEL = "qwen3-30b-a3b"
BARE = Stack(deepep=False, transformer_engine=False, precision_aware_optimizer=False, context_parallel=False,
             mla=False, gdn_kernels=False, source="a test stack without DeepEP and TE")
CLI = ["--model", MODEL, "--gpu", "h200", "--gpus", "2", "--backend", "megatron", "--layers", "4", "--seq-len",
       "4096", "--global-batch", "16", "--steps", "10", "--top", "0", "--no-progress"]


class BareMegatron(MegatronRunner):
    """The megatron runner's planning and prediction on a stack without DeepEP and TE; `run` answers at
    once: invalid_config for the layouts in `fail`, or for every layout when `fail` is None, else a
    measured-looking result."""

    def __init__(self, layers=4, fail=None):
        super().__init__(layers=layers)
        self.fail, self.ran = fail, []

    @property
    def stack(self):
        return BARE

    def run(self, spec):
        layout = spec.case.layout
        self.ran.append(layout.key())
        if self.fail is None or layout.key() in self.fail:
            return TrialResult(status="failed", kind="measured", source="stub", failure_class="invalid_config",
                               detail="cannot build it here", runner=self.name)
        speed = 1000.0 + 10 * len(self.ran)
        return TrialResult(status="ok", kind="measured", source="stub", tokens_per_s_per_gpu=speed, step_time_s=1.0,
                           peak_memory_gib=40.0, mfu=0.2, usd_per_million_tokens=1.5,
                           losses=tuple(10.0 - 0.1 * i for i in range(10)), runner=self.name)


@pytest.fixture(scope="module")
def config():
    return StudyConfig(load_model(MODEL), load_gpu("h200"), 2, Workload(seq_len=4096, global_batch=16), Stack(),
                       SpaceOptions(), steps=10, window=(2, 9))


@pytest.fixture(scope="module")
def scored(config):
    """The candidates `tune` ranks for the 4-layer megatron runner on the bare stack."""
    runner = BareMegatron(layers=4)
    return study_commands.score_space(config, runner, runner_space(config, runner))


def study_for(storage, config, name="s", figures=None):
    return load_or_create(storage, name, config, figures)


@pytest.fixture
def memory():
    return optuna.storages.InMemoryStorage()


def test_the_space_has_only_what_the_stack_can_run(config):
    space = narrow(config.options, config.model, 2, BARE, "megatron")
    assert space.options.dispatchers == ("alltoall",) and space.options.exp_avg_dtypes == ("fp32",)
    assert space.options.max_cp == 1 and space.options.offload_fractions == config.options.offload_fractions
    assert len(space.reasons) == 3 and all(BARE.source in r for r in space.reasons)
    layouts = list(enumerate_layouts(config.model, 2, config.workload, config.stack, space.options))
    assert layouts and not [l for l in layouts if l.dispatcher == "flex" or l.exp_avg_dtype == "bf16" or l.cp > 1]
    full = list(enumerate_layouts(config.model, 2, config.workload, config.stack, config.options))
    flex = next(l for l in full if l.dispatcher == "flex")
    assert "DeepEP" in space.refusal(flex)
    assert "precision-aware" in space.refusal(next(l for l in full if l.exp_avg_dtype == "bf16"))
    assert space.refusal(layouts[0]) is None
    # Everything runnable: nothing narrowed; a model the runner cannot build: one clear error.
    assert narrow(config.options, config.model, 2, Stack()).options == config.options
    with pytest.raises(RunnerSpaceError, match="MLA"):
        narrow(config.options, load_model("deepseek-v3"), 8, BARE, "megatron")


def test_runners_declare_their_stacks():
    assert PredictedRunner().stack == Stack()
    detected = detect_stack()
    assert detected.mla is False and detected.optimizer_offload is True
    assert detected.precision_aware_optimizer == detected.transformer_engine
    assert detect_stack("torch-native").context_parallel is False
    assert MegatronRunner().stack == detected
    assert detected.frameworks == ("megatron",) and detected.dynamic_batching is False
    assert Stack.named("megatron-runner").frameworks == detected.frameworks


def test_runners_are_told_apart_by_what_they_declare():
    """Studies ask what a runner declares (a truncated model run, its own prediction), never its name."""
    megatron, predicted = MegatronRunner(), PredictedRunner()
    assert megatron.truncates_layers and megatron.prices_own_run and not megatron.scores_shipped_cost_model()
    assert not predicted.truncates_layers and not predicted.prices_own_run and predicted.scores_shipped_cost_model()
    assert SamplerProposer("random").uniform and not SamplerProposer("tpe").uniform


def test_ranking_predicts_the_model_the_runner_runs(config, scored):
    run = trial_model(config.model, 4)
    for layout, prediction in scored[:: max(1, len(scored) // 20)]:
        case = config.case(layout)
        own = predict_run(case.replace(model=run, workload=replace(case.workload, framework="megatron")))
        assert prediction.tokens_per_s_per_gpu == own.tokens_per_s_per_gpu
        assert prediction.peak_memory_gib == own.peak_memory_gib
    full = study_commands.score_space(config)
    assert {l.key() for l, _ in full} != {l.key() for l, _ in scored}
    layout, prediction = scored[0]
    assert prediction.peak_memory_gib < PredictedRunner().predict(config.case(layout)).peak_memory_gib


def test_a_permanently_failed_layout_is_never_proposed_again(memory, config, scored):
    runner = BareMegatron(fail=None)  # every layout fails invalid_config, as flex did without DeepEP
    study = study_for(memory, config)
    agent = AgentProposer(study_commands.proposer_candidates(scored), to_optuna_params)
    summary = run_study(study, config, runner, agent, trials=5, progress=False)
    assert summary.failed == 5 and len(set(runner.ran)) == 5, runner.ran
    history = history_of(study, backend=runner.name)
    assert set(runner.ran) <= history.tried
    assert sorted(k for k, _, _ in history.failed) == sorted(runner.ran)
    assert {c for _, c, _ in history.failed} == {"invalid_config"} and all(p > 0 for _, _, p in history.failed)
    # The default reference is runnable: narrowed candidates, never a layout that failed for good.
    reference = study_commands.default_reference_of(scored, 2, history.failed)
    assert reference.key() not in runner.ran and reference.dispatcher == "alltoall"
    assert reference.exp_avg_dtype == "fp32" and reference.cp == 1
    assert default_reference(study_commands.proposer_candidates(scored), 2).dispatcher == "alltoall"


def test_a_hang_may_be_retried_a_crash_may_not(memory, config):
    study = study_for(memory, config)
    for n, failure in enumerate(("hang", "crash", "cuda_oom", "nccl_timeout")):
        result = TrialResult(status="failed", kind="measured", source="t", failure_class=failure).to_dict()
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
            "layout_key": f"k{n}", "backend": "megatron", "result": result, "prediction": {"peak_memory_gib": 9.5}}))
    history = history_of(study, backend="megatron")
    assert history.tried == {"k1", "k2"}
    assert history.failed == [("k0", "hang", 9.5), ("k1", "crash", 9.5), ("k2", "cuda_oom", 9.5),
                              ("k3", "nccl_timeout", 9.5)]


def test_sampler_proposals_the_runner_cannot_run_are_pruned_with_the_reason(memory, config):
    runner = BareMegatron(fail=())
    study = study_for(memory, config)
    run_study(study, config, runner, SamplerProposer(), trials=15, progress=False)
    reasons = [t.user_attrs["prune_reason"] for t in study.trials if t.state == TrialState.PRUNED]
    refused = [r for r in reasons if r.startswith("the megatron runner cannot run it")]
    assert refused, reasons
    assert not [k for k in runner.ran if "flex" in k or "bf16" in k]


def test_study_is_named_for_the_dashboard_and_its_best_trial_is_measured(memory, config, scored):
    runner = BareMegatron(fail=())
    study = study_for(memory, config, figures=runner.figures)
    assert study.metric_names == ["tokens_per_s_per_gpu"]
    run_study(study, config, runner, SamplerProposer(), trials=8, progress=False)
    run_study(study, config, runner, AgentProposer(study_commands.proposer_candidates(scored), to_optuna_params),
              trials=3, progress=False)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= 3
    for t in complete:
        a = t.user_attrs
        assert a["figures"] == "measured" and a["result"]["kind"] == "measured" and a["prediction"]["breakdown"]
        assert (a["peak_memory_gib"], a["mfu"], a["usd_per_million_tokens"]) == (40.0, 0.2, 1.5)
        # what was predicted: the agent's posterior median, stored as the interval's median
        assert a["predicted_tokens_per_s_per_gpu"] == a["prediction"]["interval"]["median"] > 0
        assert a["predicted_low"] < a["predicted_tokens_per_s_per_gpu"] < a["predicted_high"]
    for t in study.trials:
        if t.state == TrialState.PRUNED and "prediction" in t.user_attrs:
            assert t.value is None and t.user_attrs["figures"] == "predicted"
    assert study.best_trial.user_attrs["figures"] == "measured"
    assert study.best_value == max(t.value for t in complete)
    # Predicted trials never join a measured study (its best trial would mix the two): one error.
    with pytest.raises(StudyError, match="holds measured figures"):
        run_study(study, config, PredictedRunner(), SamplerProposer(), trials=1, progress=False)
    with pytest.raises(StudyError, match="holds measured figures"):
        study_for(memory, config, figures="predicted")


def test_flat_attrs_carry_the_prediction_interval(memory, config, scored):
    class IntervalRunner(BareMegatron):
        def run(self, spec):
            return TrialResult(status="ok", kind="measured", source="t", tokens_per_s_per_gpu=2.0, step_time_s=1.0)

    runner = IntervalRunner()
    study = study_for(memory, config)
    run_study(study, config, runner, AgentProposer(study_commands.proposer_candidates(scored), to_optuna_params),
              trials=1, progress=False)
    attrs = study.trials[0].user_attrs
    interval = attrs["prediction"]["interval"]     # tuner.intervals: the agent's posterior before the trial
    assert (attrs["predicted_low"], attrs["predicted_high"], attrs["figures"]) == (interval["low"], interval["high"],
                                                                                    "measured")
    assert attrs["predicted_low"] < attrs["predicted_tokens_per_s_per_gpu"] < attrs["predicted_high"]
    assert "peak_memory_gib" not in attrs  # a figure the run did not report is left out, not invented


@pytest.mark.slow
def test_tune_prints_the_narrowing_and_never_repeats_a_failed_layout(tmp_path, monkeypatch, capsys):
    runners, real = [], study_commands.make_runner

    def make(args, profile=None):
        if args.backend == "predict":
            return real(args, profile)
        runners.append(BareMegatron(layers=args.layers, fail=None))
        return runners[-1]

    monkeypatch.setattr(study_commands, "make_runner", make)
    storage = str(tmp_path / "s.db")
    # every trial fails (BareMegatron(fail=None)): exit 1, and the last line says that nothing completed
    assert main(CLI + ["--trials", "5", "--verify-top", "1", "--storage", storage]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"tune: no trial of study '{MODEL}-h200-x2-megatron-L4' has "
                                                   f"completed (5 trials, 5 failed or pruned; the last, trial 4: "
                                                   f"invalid_config: cannot build it here)")
    assert "search space narrowed: no flex dispatcher: it needs DeepEP" in err
    assert "search space narrowed: no bf16 Adam moments" in err
    assert "note: ranked by predictions for Qwen3-30B-A3B [L4] (4 of 48 layers)" in err
    ran = runners[0].ran
    assert len(ran) == 5 and len(set(ran)) == 5, ran
    assert not [k for k in ran if "flex" in k]
    reference = next(l for l in err.splitlines() if l.startswith("convergence arm: reference"))
    assert "alltoall" in reference and "flex" not in reference
    # a measuring backend's default study is its own: measured and predicted figures never share one
    study = optuna.load_study(study_name=f"{MODEL}-h200-x2-megatron-L4", storage=f"sqlite:///{storage}")
    assert study.user_attrs["figures"] == "measured" and study.metric_names == ["tokens_per_s_per_gpu"]
    # The predict backend on that (measured) study is refused in one line, before anything is written.
    assert main(["--model", MODEL, "--gpu", "h200", "--gpus", "2", "--seq-len", "4096", "--global-batch", "16",
                 "--storage", storage, "--no-progress", "--top", "0", "--study", f"{MODEL}-h200-x2-megatron-L4"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "holds measured figures" in lines[0] and "--study" in lines[0]
    assert len(optuna.load_study(study_name=f"{MODEL}-h200-x2-megatron-L4", storage=f"sqlite:///{storage}").trials) == 5


class HourRunner(BareMegatron):
    """Every layout runs, each trial costing 0.5 GPU-hours."""

    def run(self, spec):
        self.ran.append(spec.case.layout.key())
        return TrialResult(status="ok", kind="measured", source="stub", tokens_per_s_per_gpu=900.0 + len(self.ran),
                           step_time_s=1.0, gpu_hours=0.5, runner=self.name)


def test_the_agent_writes_what_it_expects_and_learnt_and_the_loop_keeps_the_gpu_hour_budget(memory, config,
                                                                                         scored, capsys):
    runner = HourRunner()
    study = study_for(memory, config, figures="measured")
    agent = study_commands.make_proposer("agent", scored, config, runner)
    summary = run_study(study, config, runner, agent, trials=5, progress=False, gpu_hours=1.0)
    assert len(runner.ran) == 2 and summary.exhausted and "--gpu-hours" in summary.reason
    first, second = study.trials
    for t in (first, second):
        assert t.user_attrs["expected"]["low"] < t.user_attrs["expected"]["high"]
        assert abs(sum(t.user_attrs["hypothesis_weights"].values()) - 1) < 0.01
        assert "level now" in t.user_attrs["learnt"]
    assert study.user_attrs["hypothesis_weights"]
    err = capsys.readouterr().err
    # one line of reasoning per trial, and one with its outcome and what it taught
    assert err.count("trial 0: ") == 1 and err.count("trial 1: ") == 1 and err.count("; learnt: level now") == 2


def test_a_peers_malformed_gpu_hours_reads_as_missing_under_a_budget(memory, config, scored, capsys):
    """The --gpu-hours budget sums the study's measured GPU-hours through the one reader of stored trials: a peer's
    figure that is not a number is one warning line and counts as none (it raised ValueError in the loop)."""
    runner = HourRunner()
    study = study_for(memory, config, figures="measured")
    agent = study_commands.make_proposer("agent", scored, config, runner)
    run_study(study, config, runner, agent, trials=1, progress=False, gpu_hours=10.0)
    peer = study.trials[0]
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params=peer.params, distributions=peer.distributions,
        user_attrs={**peer.user_attrs, "result": {**peer.user_attrs["result"], "gpu_hours": "lots"}}))
    capsys.readouterr()
    summary = run_study(study, config, runner, agent, trials=3, progress=False, gpu_hours=1.0)
    assert len(runner.ran) == 2 and summary.exhausted and "--gpu-hours" in summary.reason
    warned = [line for line in capsys.readouterr().err.splitlines() if "gpu_hours" in line]
    assert warned and all("trial 1" in line and "read as missing" in line for line in warned)


def test_the_agent_proposes_from_the_studys_measurements(memory, config, scored):
    """What the study measured reaches the agent's next proposal: its belief counts the trials (found on a
    2 x H200 run where every trial said "nothing measured yet"), and a resumed study starts from them."""
    runner = HourRunner()
    study = study_for(memory, config, figures="measured")
    agent = study_commands.make_proposer("agent", scored, config, runner)
    run_study(study, config, runner, agent, trials=3, progress=False)
    history = history_of(study, backend=runner.name)
    assert sorted(v for _, v in history.measured_layouts) == [901.0, 902.0, 903.0]
    assert {layout.key() for layout, _ in history.measured_layouts} == set(runner.ran)
    first, *later = [t.user_attrs["rationale"] for t in study.trials]
    assert first.startswith("nothing measured yet")
    assert later and not [r for r in later if r.startswith("nothing measured yet")], later
    assert all(" rc " in r for r in [first, *later])   # the recompute a trial tests is named
    resumed = study_commands.make_proposer("agent", scored, config, runner)
    assert resumed.belief(history).measured == 3


class StrainedRunner(BareMegatron):
    """Every layout runs; the second trial's allocator retries every step (the runner's memory counters)."""

    def run(self, spec):
        self.ran.append(spec.case.layout.key())
        retries = [16.0, 17.0, 16.0] if len(self.ran) == 2 else [0.0, 0.0, 0.0]
        return TrialResult(status="ok", kind="measured", source="stub", tokens_per_s_per_gpu=900.0 + len(self.ran),
                           step_time_s=1.0, runner=self.name,
                           details={"allocator_churn_per_rank": {"0": {"alloc_retries": retries}}})


def test_a_trial_that_ran_short_of_memory_is_kept_out_of_the_agents_level(memory, config, scored):
    """A measured trial whose allocator retried every step is recorded (and counts as the best when it is), but
    the agent learns no level from it, says so, and a resumed study reads it the same way."""
    runner = StrainedRunner()
    study = study_for(memory, config, figures="measured")
    agent = study_commands.make_proposer("agent", scored, config, runner)
    run_study(study, config, runner, agent, trials=3, progress=False)
    history = history_of(study, backend=runner.name)
    assert history.strained == {runner.ran[1]} and len(history.measured_layouts) == 3
    assert "allocator retried" in study.trials[1].user_attrs["learnt"]
    assert "level now" in study.trials[2].user_attrs["learnt"]
    assert study_commands.make_proposer("agent", scored, config, runner).belief(history).measured == 2


def test_the_table_says_which_measurement_ran_short_of_memory(memory, config, scored):
    from tuner.report import format_table, ranked_rows
    runner = StrainedRunner()
    study = study_for(memory, config, figures="measured")
    run_study(study, config, runner, study_commands.make_proposer("agent", scored, config, runner), trials=3,
              progress=False)
    rows = ranked_rows(study)
    assert [r.short_of_memory for r in rows].count(True) == 1
    assert format_table(rows).count("allocator retried every step") == 1


def test_a_recipe_measured_short_of_memory_says_so(memory, config, scored, tmp_path):
    """The exported recipe of a measurement whose allocator retried every step carries the retries in its
    `measured` line; the others do not."""
    import yaml

    from tuner.export import export_rows
    from tuner.report import ranked_rows
    runner = StrainedRunner()
    study = study_for(memory, config, figures="measured")
    run_study(study, config, runner, study_commands.make_proposer("agent", scored, config, runner), trials=3,
              progress=False)
    paths = export_rows(ranked_rows(study), config, tmp_path, study)
    measured = [yaml.safe_load(p.read_text())["result"]["measured"] for p in paths]
    assert len(measured) == 3
    assert sum("the allocator retried 16 times a step" in m for m in measured) == 1


def test_a_borderline_prediction_ranks_by_its_figure_times_its_chance_to_fit():
    """A predicted borderline layout 10% faster than a plain fit but with a 50% chance to fit ranks below it (what
    the agent weighs: an out-of-memory run delivers nothing), and the table says why; a measured row ranks by its
    figure alone."""
    from cost_model.nouns.layout import Layout
    from tuner.report import Row, format_table

    def row(n, tokens, p_fit, kind="predicted"):
        return Row(number=n, layout=Layout(8), tokens_per_s_per_gpu=tokens, peak_memory_gib=70.0, mfu=0.1,
                   usd_per_million_tokens=1.0, kind=kind, source="s", predicted_tokens_per_s_per_gpu=tokens,
                   rationale="", p_fit=p_fit)
    rows = sorted([row(0, 1000.0, None), row(1, 1100.0, 0.5), row(2, 1100.0, 0.95)],
                  key=lambda r: -r.expected_tokens_per_s_per_gpu)
    assert [r.number for r in rows] == [2, 0, 1]
    assert row(3, 1100.0, 0.5, kind="measured").expected_tokens_per_s_per_gpu == 1100.0
    assert "its chance to fit" in format_table(rows)


def test_an_fp8_tables_mfu_says_which_peak():
    """MFU is the leaderboard's, of the dense bf16 peak whatever the precision: an fp8 study's table says so (its
    GEMMs run against twice that peak on Hopper); a bf16 table needs no such line."""
    from cost_model.nouns.layout import Layout
    from tuner.report import Row, format_table

    rows = [Row(number=0, layout=Layout(8), tokens_per_s_per_gpu=1000.0, peak_memory_gib=70.0, mfu=0.07,
                usd_per_million_tokens=1.0, kind="predicted", source="s", predicted_tokens_per_s_per_gpu=1000.0,
                rationale="")]
    assert "MFU: of the GPU's dense bf16 peak, as the leaderboard's, for fp8" in format_table(rows, precision="fp8")
    assert "MFU: of" not in format_table(rows)


def test_show_reads_the_precision_of_a_malformed_config_as_bf16():
    """`tune show` reads the recorded workload's precision for its MFU line; a config a peer's edit left malformed
    (not a mapping) reads as bf16, never a traceback."""
    from types import SimpleNamespace

    from tuner.report import recorded_precision

    assert recorded_precision(SimpleNamespace(user_attrs={"config": {"workload": {"precision": "fp8"}}})) == "fp8"
    for bad in ("text", {"workload": "text"}, {"workload": {"precision": 8}}, None):
        assert recorded_precision(SimpleNamespace(user_attrs={"config": bad})) == "bf16"
