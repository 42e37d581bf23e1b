"""A study's best rows as recipe YAMLs: `predicted`, `measured` (a real trial's figures) or `verified`
(measured, and its convergence arm passed). Nothing becomes verified without a passing verdict."""
from __future__ import annotations

import os
from pathlib import Path

from cost_model.metrics import mfu_counting, usd_per_million_tokens
from cost_model.predict import predict
from experiments.runner import allocator_retries_per_step
from tuner.dominated import adds_work
from tuner.interval import Interval
from tuner.options import writing_user_file
from tuner.trial_record import RunResult, TrialRecord, read_trial


def distinct_top(rows, n: int) -> list:
    """The first `n` rows, leaving out a row whose layout only adds work to one already taken (recompute, offload or
    fp32 Adam moments added: tuner.dominated): a recipe of it cannot run faster, so it is not another choice."""
    out = []
    for row in rows:
        if len(out) == n:
            break
        if row.layout is not None and any(t.layout is not None and adds_work(row.layout, t.layout) for t in out):
            continue
        out.append(row)
    return out


def export_rows(rows, config, out: Path, study=None) -> list[Path]:
    """Write one recipe per ranked row under `out`; the paths written, in the rows' order."""
    from recipes.recipe import build_recipe, free_path, recipe_name, recipe_path, write_recipe

    # only the exported rows' trials are read (a malformed other trial is not warned about here)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)} if study is not None else {}
    paths = []
    for row in rows:
        prediction = predict(config.model, config.gpu, config.workload, row.layout, profile=config.profile)
        posterior = posterior_of(config, row.layout)
        # a predicted recipe leads with the posterior median (what the study ranks a predicted layout by), not the
        # one hypothesis the breakdown prices; a measured row's figures replace it below
        recipe = build_recipe(config.model, config.gpu, config.workload, row.layout, prediction,
                              headline=posterior.median)
        recipe["result"]["predicted_interval"] = interval_block(posterior)
        if row.kind == "measured" and row.number in trials:
            record = read_trial(trials[row.number])
            proxy = proxy_differences(record.result, config)
            if proxy:
                _record_proxy(recipe, row, record, config, study, proxy)
            else:
                _record_measurement(recipe, row, record, config, study)
        # another run's recipe of the same layout name, or a stronger one, stays: this one goes beside it
        path = free_path(recipe, recipe_path(out, config.model, config.gpu, recipe_name(row.layout)))
        with writing_user_file(out):
            write_recipe(recipe, path, guard=False)   # free_path already chose a file it may replace
            write_launch(path, config, row.layout)
        paths.append(path)
    return paths


def launch_path(recipe: Path) -> Path:
    """Where the runnable launch of a recipe goes: beside it, NAME.launch.sh."""
    return recipe.with_name(recipe.stem + ".launch.sh")


def write_launch(recipe: Path, config, layout) -> Path:
    """Write the recipe's run as a runnable bash launch beside it (the recipe keeps the leaderboard's format)."""
    import stat

    from experiments.slime.runner import SHIPPED_FILES
    from recipes.files import write_atomic
    from recipes.recipe import STEPS_PER_RUN
    from recipes.slime_command import slime_launch

    path = launch_path(recipe)
    rollout_dir = os.path.dirname(os.path.abspath(SHIPPED_FILES["pretokenized_sft_rollout.py"]))
    write_atomic(path, slime_launch(config.model, config.gpu, config.workload, layout, num_rollout=STEPS_PER_RUN,
                                    title=recipe.name, rollout_dir=rollout_dir))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def posterior_of(config, layout) -> Interval:
    """The layout's predicted tokens/s/GPU across the cost model's hypotheses (prior weights)."""
    from tuner.predict_request import interval_for

    return Interval.of_hypotheses(interval_for(config.case(layout), config.profile))


def interval_block(iv: Interval) -> dict:
    """`posterior_of`'s interval as the recipe states it."""
    return iv.recipe_block(f"predicted: 90% interval over {iv.hypotheses} hypotheses on slime's unexplained step "
                           f"time and the flex factor (cost_model/hypotheses.py), widened by the model's residual "
                           f"error (log sd {iv.error_sd:.3f}); the hypotheses alone span {iv.spread_low:,.0f}-"
                           f"{iv.spread_high:,.0f}")


def proxy_differences(result: RunResult, config) -> list[str]:
    """How a measured trial differs from the job the recipe describes (the study's whole model on slime, on the
    study's GPUs): fewer layers, replaced layers, another stack. Empty: the trial ran the recipe's job."""
    detail = result.trial_result().details
    out = []
    run = detail.get("model_run") or {}
    layers = run.get("layers")
    if run.get("name") and run["name"] != config.model.name:
        out.append(f"model run {run['name']}" + (f" ({layers} of {config.model.num_hidden_layers} layers)"
                                                  if layers else ""))
    if (detail.get("runner") or "slime") != "slime":
        out.append(f"stack: the {detail['runner']} runner ({result.source or 'not slime'}), not slime")
    return out


def _record_proxy(recipe: dict, row, record: TrialRecord, config, study, differences: list[str]) -> None:
    """A measured trial that ran a proxy (fewer layers, another stack) is evidence for the recipe, not its result:
    the recipe stays the target's prediction (status predicted), and the proxy run is listed with what ran."""
    from tuner.verify import convergence_of

    result, proxy_prediction = record.result, record.prediction.tokens_per_s_per_gpu
    entry = {"trial": row.number, "ran": "; ".join(differences),
             "tokens_per_s_per_gpu": round(row.tokens_per_s_per_gpu, 2),
             "predicted_for_the_proxy": round(proxy_prediction, 2) if proxy_prediction else None,
             **{k: v for k, v in measured_run_fields(result, config).items() if k in ("measured", "window")},
             "gpu_hours": result.gpu_hours}
    convergence = convergence_of(study, row.number)
    if convergence:
        entry["convergence"] = convergence.get("result")
    recipe["status"] = "predicted"
    recipe["result"]["proxy_runs"] = [entry]
    recipe["result"]["proxy_note"] = ("this recipe's figures are predicted for the whole model on slime; proxy_runs "
                                      "measured another job (it chose this layout): run the recipe to measure it")
    recipe["result"]["calibration"] = _calibration(recipe["result"], entry, result.trial_result().details)
    if not recipe["result"]["predicted"].get("fits", True):
        recipe["result"]["proxy_note"] += "; the whole model is predicted NOT to fit this layout on these GPUs"


def _calibration(result: dict, proxy: dict, detail: dict) -> dict:
    """What the proxy run says of the target's figure. On slime's own stack (fewer layers or GPUs), the proxy's
    measured/predicted ratio is the level slime's constants miss on this model and layout: the target's figure and
    interval are scaled by it. On another stack (the megatron runner) its error is that stack's own components'
    and says nothing of slime's constants: the target keeps slime's prediction and interval."""
    measured, predicted = proxy.get("tokens_per_s_per_gpu"), proxy.get("predicted_for_the_proxy")
    stack = detail.get("runner") or "slime"
    if not measured or not predicted:
        why = "the proxy run has no prediction to compare"
    elif stack != "slime":
        why = (f"the proxy ran the {stack} runner's stack (predicted {predicted:,.0f}, measured {measured:,.0f} "
               f"tokens/s/GPU for the proxy): that error is the runner's own components', not slime's constants")
    else:
        why = None
    if why:
        return {"applied": False, "note": f"not calibrated: {why}; the figure and interval are slime's prediction"}
    factor = measured / predicted
    scaled = Interval.from_recipe(result.get("predicted_interval")).scaled(factor)
    return {"applied": True, "factor": round(factor, 4),
            "tokens_per_s_per_gpu": round(result["tokens_per_s_per_gpu"] * factor, 2), "interval": scaled or None,
            "note": "predicted for the whole model on slime, scaled by the proxy's measured/predicted ratio (same "
                    "stack); what the proxy does not share (the other layers, GPUs) stays modelled"}


def _record_measurement(recipe: dict, row, record: TrialRecord, config, study) -> None:
    """A measured trial's figures, and its convergence verdict when it has one, into its recipe."""
    from recipes.correctness import record_convergence
    from tuner.verify import convergence_of, reference_of

    result = record.result
    usd = usd_per_million_tokens(config.gpu.usd_per_gpu_hour, row.tokens_per_s_per_gpu)
    recipe["result"].update(
        tokens_per_s_per_gpu=round(row.tokens_per_s_per_gpu, 2),
        usd_per_million_tokens=round(usd, 2) if usd is not None else None,
        step_time_cv_percent=result.step_time_cv_percent, mfu=result.mfu,
        gpu_hours=result.gpu_hours, **measured_run_fields(result, config))
    recipe["status"] = "measured"
    convergence = convergence_of(study, row.number)
    if convergence:
        record_convergence(recipe, convergence, reference_of(study, row.number))


def measured_run_fields(result: RunResult, config) -> dict:
    """What a recipe's result says about the measured run: who measured it, what model actually ran
    (a truncated model, replaced layers), its steps, window and tokens, and how its MFU was counted."""
    detail = result.trial_result().details
    notes = list(detail.get("notes") or [])
    optimizer = detail.get("optimizer") or ""
    if "NOT applied" in optimizer:  # e.g. bf16 moments asked for, the standard optimizer ran
        notes.append(optimizer.split("; ")[-1])
    retries = allocator_retries_per_step(detail)
    if retries:   # its figure is the allocator's as much as the layout's: a user deploying it should know
        notes.append(f"the allocator retried {retries:g} times a step (short of memory: each retry frees the cache "
                     f"and maps it again; a smaller max_tokens_per_gpu may run faster)")
    run = (detail.get("model_run") or {}).get("name")
    measured = result.source or "measured"
    if notes:
        measured += f"; model run {run or '?'}: " + "; ".join(notes)
    window = detail.get("window") or list(config.window)
    rows = detail.get("global_batch_rows") or config.workload.global_batch
    seq = detail.get("seq_len") or config.workload.seq_len
    return {"measured": measured,
            "mfu_note": (f"measured: 6 x active params of the model run{f' ({run})' if run else ''} x tokens/s per "
                         f"GPU / {mfu_counting(config.gpu, config.workload, None)}"),
            "steps_per_run": detail.get("steps_run") or config.steps, "window": list(window),
            "window_tokens": (window[1] - window[0] + 1) * rows * seq, "runs": 1,
            "gpu_hours_note": "measured: the trial's wall time (start-up included) x its GPUs"}
