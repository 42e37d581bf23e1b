"""Suites: a JSON file of trials run one after another, one JSON line per trial.

{"defaults": {...}, "trials": [{...}, ...]}; each trial names its GPUs and layout and may override
any default (see SUITE_TRIAL_KEYS); "budget_s" in the defaults bounds the whole suite.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import layout_from_stored
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from experiments.megatron.runner import MegatronRunner
from experiments.runner import TrialSpec

SUITE_TRIAL_KEYS = {"name", "gpus", "layout", "model", "layers", "replace_gdn", "seq_len", "global_batch", "steps",
                    "window", "timeout_s", "hang_timeout_s", "backend", "routing", "expect", "seed", "lr", "rows_file",
                    "cpu_init", "sdpa_backend"}
MIN_TRIAL_S = 40  # a trial that would start with less of the suite budget left is skipped


@dataclass(frozen=True)
class SuiteTrial:
    name: str
    model: str
    gpus: int
    layout: Layout
    layers: int | None
    replace_gdn: bool
    workload: Workload
    steps: int
    window: tuple[int, int] | None
    timeout_s: float
    hang_timeout_s: float
    backend: str
    expect: str = ""
    seed: int | None = None          # model initialisation and synthetic data
    lr: float | None = None
    rows_file: str | None = None     # token rows (JSONL) instead of synthetic data
    cpu_init: bool = False
    sdpa_backend: str = "auto"


def parse_suite(source) -> tuple[list[SuiteTrial], dict]:
    """A suite file (path or parsed dict): {"gpu": "h200", "defaults": {...}, "trials": [{...}, ...]} (`gpu`: the
    GPU type it was designed and predicted for, default h200; the runner measures on whatever GPU it finds).

    Each trial: name, gpus, layout (Layout fields; world_size = gpus), and optionally any default
    overridden (model, layers ("auto" or int), replace_gdn (default false: GDN layers are megatron's
    GatedDeltaNet), seq_len, global_batch, steps, window
    [a, b], timeout_s, hang_timeout_s, backend, routing, expect)."""
    data = _read_suite(source)
    if not isinstance(data, dict) or not isinstance(data.get("trials"), list) or not data["trials"]:
        raise ValueError("a suite is an object with a non-empty 'trials' list")
    defaults = data.get("defaults") or {}
    unknown = sorted(set(defaults) - SUITE_TRIAL_KEYS - {"budget_s"})
    if unknown:
        raise ValueError(f"unknown suite defaults {unknown}; known: {sorted(SUITE_TRIAL_KEYS)}")
    trials, names = [], set()
    for i, raw in enumerate(data["trials"]):
        if not isinstance(raw, dict):
            raise ValueError(f"trial {i}: must be an object")
        unknown = sorted(set(raw) - SUITE_TRIAL_KEYS)
        if unknown:
            raise ValueError(f"trial {i}: unknown keys {unknown}; known: {sorted(SUITE_TRIAL_KEYS)}")
        t = {**{k: v for k, v in defaults.items() if k != "budget_s"}, **raw}
        name = str(t.get("name") or f"trial{i}")
        if name in names:
            raise ValueError(f"trial {i}: duplicate name {name!r}")
        names.add(name)
        trials.append(_parse_trial(name, t))
    gpu = data.get("gpu", "h200")
    if not isinstance(gpu, str) or not gpu:
        raise ValueError(f"a suite's 'gpu' is the GPU type it was designed and predicted for (a catalog name), got {gpu!r}")
    return trials, {"budget_s": defaults.get("budget_s"), "gpu": gpu}


def _read_suite(source):
    if not isinstance(source, (str, os.PathLike)):
        return source
    path = Path(source)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def _parse_trial(name: str, t: dict) -> SuiteTrial:
    """One trial from its keys merged over the suite's defaults."""
    for key in ("model", "gpus", "layout"):
        if key not in t:
            raise ValueError(f"trial {name}: missing {key!r}")
    gpus = t["gpus"]
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"trial {name}: gpus must be a positive integer, got {gpus!r}")
    try:
        layout = layout_from_stored({**t["layout"], "world_size": gpus})
    except InvalidLayout as e:
        raise ValueError(f"trial {name}: {e}") from None
    layers = t.get("layers", "auto")
    if layers == "auto":
        layers = None
    elif not isinstance(layers, int) or layers < 1:
        raise ValueError(f"trial {name}: layers must be 'auto' or a positive integer, got {layers!r}")
    workload = Workload(seq_len=int(t.get("seq_len", 4096)), global_batch=int(t.get("global_batch", 16)),
                        routing=t.get("routing", "natural"), framework="megatron")
    steps = int(t.get("steps", 8))
    window = tuple(t["window"]) if t.get("window") is not None else None
    from experiments.megatron.backend_support import BACKENDS, SDPA_BACKENDS
    backend = t.get("backend", "auto")
    if backend not in BACKENDS:
        raise ValueError(f"trial {name}: unknown backend {backend!r}")
    sdpa = str(t.get("sdpa_backend", "auto"))
    if sdpa not in SDPA_BACKENDS:
        raise ValueError(f"trial {name}: sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got {sdpa!r}")
    return SuiteTrial(name=name, model=str(t["model"]), gpus=gpus, layout=layout, layers=layers,
                      replace_gdn=bool(t.get("replace_gdn", False)), workload=workload, steps=steps,
                      window=window, timeout_s=float(t.get("timeout_s", 150)),
                      hang_timeout_s=float(t.get("hang_timeout_s", 90)),
                      backend=backend, expect=str(t.get("expect", "")),
                      seed=int(t["seed"]) if t.get("seed") is not None else None,
                      lr=float(t["lr"]) if t.get("lr") is not None else None,
                      rows_file=t.get("rows_file"), cpu_init=bool(t.get("cpu_init", False)), sdpa_backend=sdpa)


@dataclass(frozen=True)
class SuiteSetup:
    """How this machine runs a suite's trials: its GPU, MegatronRunner's launcher, the rows JSONL of the
    trials without their own rows_file, and where the trials' logs go (None: a fresh temporary folder)."""
    gpu: GpuSpec
    launcher: str = "auto"
    rows_file: str | None = None
    log_root: str | None = None
    timeout_s: float | None = None      # every trial's limit instead of the suite's (None: the suite's)


def run_suite(path, out_path: str | None, setup: SuiteSetup, *, budget_s: float | None = None,
              only: list[str] | None = None, emit=print) -> list[dict]:
    """Run a suite's trials one after another (fresh worker processes each); one JSON line per
    trial to `emit` and appended to `out_path` as each finishes. A failed trial does not stop the suite."""
    trials, meta = parse_suite(path)
    budget_s = budget_s if budget_s is not None else meta.get("budget_s")
    if only:
        trials = [t for t in trials if t.name in only]
    log_root = setup.log_root or tempfile.mkdtemp(prefix="attune-megatron-suite-")
    start = time.time()
    lines = []
    for t in trials:
        elapsed = time.time() - start
        if setup.timeout_s:
            t = replace(t, timeout_s=setup.timeout_s)
        timeout = t.timeout_s
        if budget_s is not None:
            left = budget_s - elapsed
            if left < MIN_TRIAL_S:
                line = {"trial": t.name, "status": "skipped", "reason": f"suite budget {budget_s:.0f} s exhausted "
                                                                        f"({elapsed:.0f} s elapsed)"}
                _emit(line, out_path, emit)
                lines.append(line)
                continue
            timeout = min(timeout, left)
        line = _run_trial(t, setup, timeout, log_dir=os.path.join(log_root, t.name))
        _emit(line, out_path, emit)
        lines.append(line)
    return lines


def _run_trial(t: SuiteTrial, setup: SuiteSetup, timeout: float, *, log_dir: str) -> dict:
    """One trial's result line: the result's stored form after the suite's own keys."""
    extra = {k: v for k, v in (("seed", t.seed), ("lr", t.lr)) if v is not None}
    # A suite measures the workload it names: a short budget ends the trial (too few steps), it never runs fewer rows.
    runner = MegatronRunner(layers=t.layers, replace_gdn=t.replace_gdn, backend=t.backend, launcher=setup.launcher,
                            timeout_s=timeout, hang_timeout_s=min(t.hang_timeout_s, timeout), scale_batch_to_budget=False,
                            rows_file=t.rows_file or setup.rows_file, cpu_init=t.cpu_init,
                            sdpa_backend=t.sdpa_backend, log_dir=log_dir, **extra)
    spec = TrialSpec(Case(load_model(t.model), setup.gpu, t.workload, t.layout), steps=t.steps,
                     window=t.window or (min(2, t.steps - 1), t.steps - 1))
    t1 = time.time()
    result = runner.run(spec)
    line = {"trial": t.name, "gpus": t.gpus, "expect": t.expect, "elapsed_s": round(time.time() - t1, 1),
            **result.to_dict()}
    if timeout < t.timeout_s:   # what was left of the suite's budget, not the trial's own limit
        line["suite_budget_s"] = round(timeout, 1)
    return line


def _emit(line: dict, out_path: str | None, emit) -> None:
    text = json.dumps(line, separators=(",", ":"), default=str)
    if out_path:
        with open(out_path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    emit(text)
    sys.stdout.flush()
