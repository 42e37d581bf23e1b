"""The convergence arm: prove a study's fastest measured layouts train like a reference layout.

The candidate arm of each layout is its measured trial itself (as on the leaderboard); the reference
arm is one extra run of a reference layout through the same runner, on the same rows, seed, steps and
hyperparameters. Optuna freezes a finished trial, so the verdicts are kept on the study, keyed by
trial number (`convergence_verdicts`); a recipe becomes `verified` only through a passing verdict.
"""
from __future__ import annotations

import optuna
from optuna.trial import TrialState

from experiments.checks.convergence import Curve, CurveError, check, recipe_convergence_block
from experiments.runner import TrialRunner, TrialSpec
from cost_model.nouns.layout import Layout
from tuner.report import ranked_rows

VERDICTS = "convergence_verdicts"
REFERENCES = "convergence_references"  # what each verdict's reference arm was, by trial number


def default_reference(candidates: list, world_size: int, exclude=frozenset()) -> Layout:
    """The simplest valid layout that fits: the fewest model-parallel ranks (TP x PP x CP x EP x ETP),
    TP 1 and PP 1 first; among those, the best prediction. `candidates` must be layouts the runner can
    run (the tune command passes its candidates, narrowed to the runner's stack); layouts whose key is
    in `exclude` (those that failed permanently in the study) are left out."""
    def simplicity(c):
        l = c.layout
        return (not c.prediction.fits, l.tp * l.pp * l.cp * l.ep * l.etp, l.tp, l.pp,
                -c.prediction.tokens_per_s_per_gpu)   # a plain fit before a borderline one

    fitting = [c for c in candidates if c.layout.world_size == world_size and c.layout.key() not in exclude]
    if not fitting:
        raise ValueError(f"no fitting layout to serve as the convergence reference on {world_size} GPUs")
    return min(fitting, key=simplicity).layout


def curve_of(result: dict, name: str) -> Curve:
    losses = result.get("losses") or ()
    if not losses:
        raise CurveError(f"{name}: the run recorded no losses")
    return Curve(tuple(range(1, len(losses) + 1)), tuple(float(x) for x in losses), None, name)


def verify_top(study: optuna.Study, config, runner: TrialRunner, top: int, reference: Layout) -> list[dict]:
    """Run the reference arm once, then judge the `top` fastest measured trials against it."""
    measured = [r for r in ranked_rows(study) if r.kind == "measured"][:top]
    if not measured:
        return []
    ref = runner.run(TrialSpec(config.case(reference), steps=config.steps, window=config.window))
    trials = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    verdicts = []
    stored = dict(study.user_attrs.get(VERDICTS, {}))
    references = dict(study.user_attrs.get(REFERENCES, {}))
    what = f"{reference.long_label}: {config.steps} steps, {ref.kind} by {ref.source}"
    for row in measured:
        trial = trials[row.number]
        if ref.status != "ok":
            block = {"steps": config.steps, "result": "not run", "correlation": None, "final_loss_difference": None,
                     "pointwise_failures": None,
                     "note": f"reference arm {reference.long_label} failed: {ref.failure_class}"}
        else:
            try:
                verdict = check(curve_of(trial.user_attrs["result"], f"trial {row.number}"),
                                curve_of({"losses": ref.losses}, "reference arm"))
                block = recipe_convergence_block(verdict, config.steps,
                                                 f"candidate arm: the measured trial {row.number}; reference arm: "
                                                 f"{reference.long_label} through the same runner, rows and seed")
            except CurveError as e:
                block = {"steps": config.steps, "result": "unusable", "correlation": None,
                         "final_loss_difference": None, "pointwise_failures": None, "note": str(e)}
        stored[str(row.number)] = block
        references[str(row.number)] = what
        verdicts.append({"trial": row.number, "layout": row.layout.long_label, **block})
    study.set_user_attr(VERDICTS, stored)
    study.set_user_attr(REFERENCES, references)
    return verdicts


def convergence_of(study: optuna.Study, number: int) -> dict | None:
    return (study.user_attrs.get(VERDICTS) or {}).get(str(number))


def reference_of(study: optuna.Study, number: int) -> str:
    """The reference arm a trial's verdict was judged against (studies from before this was kept: unknown)."""
    return (study.user_attrs.get(REFERENCES) or {}).get(str(number)) or "not recorded"
