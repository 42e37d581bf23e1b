"""Scoring a study's search space: every layout the runner can run that may fit, with its prediction.

A very large space is pruned: the parallel shapes and layouts that no judge (the shipped model, each hypothesis)
could rank among its best are not scored (tuner.space_pruning), and the result says how many.

Memory first: most of a space does not fit, and the memory verdict is cheaper than the step time, so a layout's
step is priced only when it may fit; a layout ruled out by memory rules out, unscored, its siblings whose
micro-batches hold no less memory (`memory_scales`: the largest micro-batch no smaller, no fewer in flight;
tests/test_score_space_memory_first.py checks the result is scoring each alone).
"""
from __future__ import annotations

import signal
import time
from dataclasses import fields, replace
from operator import attrgetter, itemgetter

from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.nouns.layout_codec import layout_pairs
from cost_model.activations import in_flight_count
from cost_model.predict import (Prediction, in_flight_share, memory_verdict, microbatch_split, microbatches,
                                predict, predict_from_verdict)
from experiments.runner import TrialRunner
from search_space.enumerate import (MAX_PLANNED_LAYOUTS, MAX_SPACE_LAYOUTS, ShapeRuns, SpaceTooLarge, shape_dp,
                                    smallest_global_batch, space_plan, space_size)
from search_space.runner_space import RunnerSpace
from tuner.gc_pause import kept_work
from tuner.options import CliError
from tuner.progress import PROGRESS_AFTER_S, Counter, Progress
from tuner import space_pruning
from tuner.space_pruning import PRUNE_ABOVE, Bars, Pruned, bounds_of, highest_first, judges, prunable

_first = itemgetter(0)


def memory_scales(runs: ShapeRuns) -> list[tuple[float, float]]:
    """Per micro-batch choice of a shape (runs.max_tokens), what its layouts' memory reads of the micro-batch: the
    tokens of the largest one and the micro-batches in flight (cost_model.memory.peak_memory grows with each, all
    else alike). Neither need grow with max_tokens_per_gpu: slime's schedule halves bins under VPP, and fewer,
    larger micro-batches fill fewer pipeline slots."""
    s, workload = runs.shape, runs.workload
    dp, pp, vpp = shape_dp(s, runs.world_size), s["pp"], s.get("vpp", 1)
    out = []
    for max_tokens in runs.max_tokens:
        _, n_mb, largest = microbatch_split(max_tokens, dp, pp, vpp, s["cp"], s["ep"], workload)
        count = in_flight_count(pp, vpp, s.get("overlap_moe_expert_parallel_comm", False), n_mb)
        out.append((largest, largest * in_flight_share(max_tokens, dp, pp, vpp, s["cp"], workload, count)))
    return out


def _dominates(ruled_out: list[tuple[float, float]] | None, scale: tuple[float, float]) -> bool:
    """Whether a layout of memory scale `scale` holds no less memory than one of those ruled out (of its run)."""
    return ruled_out is not None and any(t <= scale[0] and f <= scale[1] for t, f in ruled_out)


class _Scoring:
    """The layouts looked at so far: those that may fit (with their predictions), the first refusal of the
    runner, the one nearest to fitting (for the error when none fits)."""

    def __init__(self, config, runner: TrialRunner | None, progress):
        self.config, self.runner = config, runner
        self.fitting: list[tuple[Layout, Prediction]] = []
        self.refused: list[str] = []
        self.least, self.count = None, 0
        # the cost model's memory verdicts (read by the shipped prediction, or a runner declaring it prices as the
        # cost model does): layouts of templates that share their memory share what memory rules out
        self.same_memory = prunable(config, runner)
        # every layout looked at counts (a run of refused or ruled-out ones too), so a large space reports within
        # seconds whatever it holds (tuner.progress)
        self.looked = Counter(progress if isinstance(progress, Progress) else None, "scored layouts",
                              tail=lambda: f", {len(self.fitting):,} may fit; still enumerating")

    def prediction(self, layout: Layout, verdict=None) -> Prediction:
        config, runner = self.config, self.runner
        if runner is None:
            if verdict is not None:
                return predict_from_verdict(verdict, config.gpu, config.workload)
            return predict(config.model, config.gpu, config.workload, layout, profile=config.profile)
        if verdict is not None:   # only a runner that gave the verdict is handed it back
            return runner.predict(config.case(layout), config.profile, verdict=verdict)
        return runner.predict(config.case(layout), config.profile)

    def memory(self, layout: Layout):
        """The memory verdict alone where the runner gives it cheaper (most of a space does not fit)."""
        config = self.config
        if self.runner is None:
            return memory_verdict(config.model, config.gpu, config.workload, layout, profile=config.profile)
        return self.runner.memory_verdict(config.case(layout), config.profile)

    def take_shape(self, runs: ShapeRuns, live: set | None = None) -> int:
        """Every layout of one parallel shape looked at, in runs of siblings: a layout ruled out by memory rules
        out the rest of its run unbuilt (counted all the same). The candidates, the first refusal and the layout
        nearest to fitting are those of taking each layout in shape_layouts' order (ties go to the earlier one).
        `live`: only the layouts whose (tokens per micro-batch, dispatcher) it holds are taken; the layouts left out
        are counted unbuilt, before the enumeration's rules, and the count returned (a pruned scoring's)."""
        placed, refusal, least, left_out = [], None, None, 0
        n_templates, max_tokens = len(runs.templates), runs.max_tokens
        # per run (its first template's index; templates of the same memory are one run where `same_memory`): the
        # memory scales of its layouts ruled out (memory_scales)
        ruled_out: dict[int, list[tuple[float, float]]] = {}
        scales = memory_scales(runs)
        looked = self.looked
        runs_of = runs.same_memory_as if self.same_memory else runs.same_as
        lighter = runs.lighter_than if self.same_memory else [None] * n_templates
        # a template whose layouts a lighter one's rule out is taken after it (the result does not read the order)
        for ti in sorted(range(n_templates), key=lambda t: lighter[t] is not None):
            run = runs_of[ti]
            dispatcher = runs.templates[ti][2]
            lighter_run = None if lighter[ti] is None else runs_of[lighter[ti]]
            for ri, tokens in enumerate(max_tokens):
                if live is not None and (tokens, dispatcher) not in live:
                    left_out += 1   # counted as the enumeration would build it, before its rules (as Pruned says)
                    continue
                if _dominates(ruled_out.get(run), scales[ri]):
                    looked.add()
                    self.count += 1
                    continue
                layout = runs.layout(ri, ti)
                if layout is None:
                    if runs.broken:
                        return 0
                    continue
                looked.add()
                if lighter_run is not None and _dominates(ruled_out.get(lighter_run), scales[ri]):
                    # a layout holding no more memory does not fit: nor does this one (counted, not priced)
                    self.count += 1
                    ruled_out.setdefault(run, []).append(scales[ri])
                    continue
                place = ri * n_templates + ti
                try:
                    mv = self.memory(layout)
                    p = self.prediction(layout, mv) if mv is None or mv.may_fit else None
                except InvalidLayout as e:  # the runner's model run cannot take this layout
                    if refusal is None or place < refusal[0]:
                        refusal = (place, str(e))
                    continue
                self.count += 1
                if p is not None and p.may_fit:
                    placed.append((place, layout, p))
                    continue
                ruled_out.setdefault(run, []).append(scales[ri])
                peak = p.peak_memory_gib if p is not None else mv.memory.total
                if least is None or (peak, place) < least[:2]:
                    least = (peak, place, layout)
        placed.sort(key=_first)
        self.fitting += [(layout, p) for _, layout, p in placed]
        if refusal is not None and not self.refused:
            self.refused.append(refusal[1])
        if least is not None and (self.least is None or least[0] < self.least[1]):
            self.least = (least[2], least[0])
        return left_out

    def result(self) -> list[tuple[Layout, Prediction]]:
        config, runner = self.config, self.runner
        if not self.count:
            if self.refused:
                raise CliError(f"no layout of {config.describe()} can run on the {runner.name} runner: "
                               f"{self.refused[0]}")
            gbs = smallest_global_batch(config.model, config.world_size, config.workload, config.stack,
                                        config.options)
            if gbs is not None:
                raise CliError(f"no valid layout exists for {config.describe()}: the global batch of "
                               f"{config.workload.global_batch:,} rows is too small to give every data-parallel "
                               f"rank a row; --global-batch {gbs:,} (or more, a multiple of DP) has layouts")
            raise CliError(f"no valid layout exists for {config.describe()} (check the GPU count against the "
                           f"model's heads, experts and layers)")
        if not self.fitting:
            layout = self.least[0]
            nearest = self.prediction(layout)
            partial = self._partial_offload(layout)
            raise NoFitError(f"no layout of {config.model.display_name} fits on {config.world_size} x "
                             f"{config.gpu.display_name}: the nearest, {layout.long_label}, predicted peak "
                             f"{nearest.peak_memory_gib:.1f} GiB per GPU: "
                             f"{nearest.reasons[0] if nearest.reasons else 'does not fit'}"
                             f"{self._partial_line(*partial) if partial else ''}",
                             partial[0].optimizer_offload_fraction if partial else None)
        return self.fitting

    def _partial_offload(self, layout: Layout) -> tuple[Layout, Prediction] | None:
        """Where the nearest layout offloads the whole optimizer and the host cannot hold it, the search's offload
        fractions may step over one that fits: the layout at the largest such fraction and its prediction."""
        if layout.optimizer_offload_fraction < 1.0:
            return None
        for fraction in PARTIAL_OFFLOADS:
            if fraction in self.config.options.offload_fractions:
                continue   # searched: it did not fit
            partial = replace(layout, optimizer_offload_fraction=fraction)
            try:
                p = self.prediction(partial)
            except InvalidLayout:
                return None
            if p.fits:
                return partial, p
        return None

    def _partial_line(self, partial: Layout, p: Prediction) -> str:
        c = self.config
        return (f"; but offloading {partial.optimizer_offload_fraction:g} of the optimizer is predicted to fit (peak "
                f"{p.peak_memory_gib:.1f} GiB, {p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU predicted), a fraction "
                f"the search does not try (--offload-fractions): tune predict --model {c.model.name} --gpu "
                f"{c.gpu.name} --gpus {c.world_size} --layout {' '.join(layout_pairs(partial))}")


class NoFitError(CliError):
    """No layout of the space fits; `partial`: the largest optimizer offload fraction, between the searched ones,
    at which the nearest layout is predicted to fit (None: none does)."""

    def __init__(self, message: str, partial: float | None = None):
        super().__init__(message)
        self.partial = partial


# Offload fractions between the search's 0.5 and 1 that a no-fit message tries, largest first (the least GPU memory)
PARTIAL_OFFLOADS = (0.95, 0.9, 0.8, 0.7, 0.6)


def score_space(config, runner: TrialRunner | None = None, space: RunnerSpace | None = None,
                progress=None, ray_address: str | None = None) -> list[tuple[Layout, Prediction]]:
    """Every layout of the space that `runner` can run (`space`: the space narrowed to its stack) and is
    predicted to fit or to be borderline (Prediction.fit_verdict: the agent weighs those by their chance to
    fit), with its prediction for what the runner runs (`runner.predict`; without a runner, the cost model
    for the full model), in the enumeration's order; CliError when none may fit. A space of more than PRUNE_ABOVE
    layouts whose figures are the cost model's own is pruned (tuner.space_pruning), here: what it left out is the
    result's `pruned`. `ray_address`: score the parallel shapes of a space that is not pruned as tasks on that Ray
    cluster ("local": one started on this machine); the same result."""
    options = space.options if space is not None else config.options
    prune = prunable(config, runner)
    shapes, options, size = space_plan(config.model, config.world_size, config.workload, config.stack, options,
                                       limit=MAX_PLANNED_LAYOUTS if prune else MAX_SPACE_LAYOUTS)
    pruned = None
    if prune and size > PRUNE_ABOVE:
        if ray_address is not None:
            # pruning goes shape by shape on what it has scored: done here, its result is the local one
            _check_reachable(ray_address)
        scoring, pruned = _pruned(config, runner, options, shapes, progress)
        pruned.ray_address = ray_address
    elif ray_address is not None:
        scoring = _on_ray(config, runner, options, shapes, ray_address, progress)
    else:
        scoring = _Scoring(config, runner, progress)
        with kept_work():
            for shape in shapes:
                scoring.take_shape(_runs(config, shape, options))
    if isinstance(progress, Progress):
        progress.done()   # erased on a terminal: an error below is the only line left
    return ScoredSpace(scoring.result(), pruned)


class ScoredSpace(list):
    """score_space's candidates, and what a pruned scoring left unscored (`pruned`, None when all was scored)."""

    def __init__(self, items=(), pruned: Pruned | None = None):
        super().__init__(items)
        self.pruned = pruned


def _pruned(config, runner, options, shapes: list[dict], progress) -> tuple[_Scoring, Pruned]:
    """The shapes scored highest ceiling first, the shapes and layouts that cannot matter left out
    (tuner.space_pruning), the scored ones that cannot either dropped at the end; the candidates in the
    enumeration's order all the same. SpaceTooLarge past MAX_SPACE_LAYOUTS scored."""
    every, predict_h = judges(config, runner)
    bounds = bounds_of(shapes, config, options, every)
    keep = space_pruning.KEEP   # read here: a test narrows it
    bars, skipped, no_fit, pruned = Bars(every, predict_h, keep), [], [], Pruned(keep=keep)
    scoring = _Scoring(config, runner, progress)
    scoring.looked.tail = lambda: (f", {len(scoring.fitting):,} may fit, {len(skipped):,} of {len(shapes):,} "
                                   f"shapes and {pruned.layouts:,} layouts of others left unscored; still enumerating")
    parts = {}
    with kept_work():
        for i in highest_first(bounds, bars, skipped):   # the shapes below every bar go to `skipped`
            live = bounds[i].live(every, bars)
            if live is not None and not live:
                skipped.append(i)
                continue
            if bounds[i].cannot_fit():
                no_fit.append(i)
                continue
            start = len(scoring.fitting)
            pruned.layouts += scoring.take_shape(_runs(config, shapes[i], options), live)
            if scoring.looked.count > MAX_SPACE_LAYOUTS:
                raise SpaceTooLarge(f"scoring the search space of {config.model.display_name} on "
                                    f"{config.world_size:,} GPUs passed {MAX_SPACE_LAYOUTS:,} layouts before the rest "
                                    f"could be ruled out; use fewer GPUs (--gpus)")
            parts[i] = scoring.fitting[start:]
            bars.offer(parts[i], bounds[i].shape_ceilings(every), bounds[i])
        if not scoring.count:
            # nothing scored: every shape's memory floor is over the card. Scored all the same, so the error
            # names the layout nearest to fitting (not "no valid layout")
            for i in no_fit:
                scoring.take_shape(_runs(config, shapes[i], options))
                if scoring.looked.count > MAX_SPACE_LAYOUTS:
                    break
            no_fit = []
        kept = {i: bounds[i].kept(part, every, bars) for i, part in parts.items()}
        scoring.fitting = [lp for i in sorted(kept) for lp in kept[i]]
    pruned.shapes = len(skipped)
    pruned.layouts += space_size([shapes[i] for i in skipped], config.model, config.world_size, config.workload,
                                 config.stack, options)
    pruned.dropped = sum(map(len, parts.values())) - len(scoring.fitting)
    pruned.no_fit = len(no_fit)
    pruned.no_fit_layouts = space_size([shapes[i] for i in no_fit], config.model, config.world_size, config.workload,
                                       config.stack, options)
    return scoring, pruned


def _runs(config, shape: dict, options) -> ShapeRuns:
    """The layouts of one parallel shape of the space, run by run."""
    return ShapeRuns(shape, config.model, config.world_size, config.workload, config.stack, options)


def score_shapes(config, runner: TrialRunner | None, options, shapes: list[tuple[int, dict]]) -> list[tuple]:
    """One task of a fanned-out scoring: per shape (its place, as given), what `score_space` keeps of it: the
    candidates, the first refusal, the layout nearest to fitting and its peak, the layouts counted and looked at."""
    out = []
    for place, shape in shapes:
        scoring = _Scoring(config, runner, None)
        scoring.take_shape(_runs(config, shape, options))
        out.append((place, scoring.fitting, scoring.refused, scoring.least, scoring.count, scoring.looked.count))
    return out


def _on_ray(config, runner, options, shapes: list[dict], address: str, progress) -> _Scoring:
    """The shapes scored as Ray tasks (a few per CPU of the cluster, shapes dealt out in turn so each task holds
    large and small ones), merged in the enumeration's order: scoring a shape needs nothing of another's (the
    memory rule's siblings share their shape), so the result is the local one."""
    _check_reachable(address)
    import ray

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR")
    except Exception as e:   # Ray raises many types; the user needs one line
        raise CliError(f"--ray-address {address}: cannot reach a Ray cluster there: "
                       f"{' '.join(str(e).split())[:200]}") from None
    finally:
        for sig, handler in handlers.items():   # Ray installs its own; a signal to tune means what tune says
            if handler is not None:
                signal.signal(sig, handler)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    tasks = max(1, min(len(shapes), 4 * cpus))
    remote = ray.remote(score_shapes)
    args = (ray.put(config), ray.put(runner), ray.put(options))
    pending = [remote.remote(*args, [(i, s) for i, s in enumerate(shapes) if i % tasks == k]) for k in range(tasks)]
    parts, looked, started = [], 0, time.monotonic()
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for part in ray.get(done):
            parts += part
            looked += sum(p[5] for p in part)
        if isinstance(progress, Progress) and time.monotonic() - started >= PROGRESS_AFTER_S:
            t = time.monotonic() - started
            progress(f"  scored layouts: {looked:,} in {t:.0f} s ({looked / t:,.0f}/s) on {cpus} Ray CPUs; "
                     f"{tasks - len(pending)} of {tasks} tasks done")
    merged = _Scoring(config, runner, None)
    for _, fitting, refused, least, count, _ in sorted(parts, key=lambda p: p[0]):
        merged.fitting += fitting
        merged.refused = merged.refused or refused
        merged.count += count
        if least is not None and (merged.least is None or least[1] < merged.least[1]):
            merged.least = least
    return merged


RAY_CONNECT_TIMEOUT_S = 10


def _check_reachable(address: str) -> None:
    """A named cluster answers on its port before Ray is asked to join it (Ray retries an address that never
    answers for minutes): one line otherwise. "local" and "auto" name this machine."""
    import socket

    if address in ("local", "auto"):
        return
    if address.startswith(("http://", "https://")):
        raise CliError(f"--ray-address {address}: scoring joins a Ray cluster by its client or GCS address "
                       f"(ray://HEAD:10001 or HEAD:6379), not its dashboard's http:// address")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"--ray-address {address}: expected ray://HOST:PORT, HOST:PORT or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise CliError(f"--ray-address {address}: nothing answers there ({e.strerror or e})") from None


# A layout's fields but its micro-batch size: two layouts alike in these whose micro-batches slime schedules alike
# are one run (distinct_runs)
_NOT_MICROBATCH = attrgetter(*(f.name for f in fields(Layout) if f.name not in ("max_tokens_per_gpu",
                                                                                 "rows_per_microbatch")))


def distinct_runs(candidates: list, workload) -> tuple[list, int]:
    """(the candidates without a layout that runs exactly as an earlier one, how many were left out). Under slime's
    schedule two max_tokens_per_gpu can make the same micro-batches (under VPP it halves bins until there are DP x PP
    of them: DeepSeek-V3's 128 rows over DP 16 x PP 8 are 128 one-row micro-batches at 1, 2 or 4 rows a bin); a trial
    of the second would run the first again. The first, the smaller bin, is kept: its recipe says what runs. A VLM's
    encoder reads the bin's rows: its layouts are kept."""
    if workload.framework != "slime" or workload.images_per_row:
        return candidates, 0
    seen, kept = set(), []
    for layout, p in candidates:
        key = (_NOT_MICROBATCH(layout), microbatches(layout, workload))
        if key not in seen:
            seen.add(key)
            kept.append((layout, p))
    if len(kept) == len(candidates):
        return candidates, 0
    return ScoredSpace(kept, getattr(candidates, "pruned", None)), len(candidates) - len(kept)
