"""Scoring a very large space without the parallel shapes that cannot matter.

A space of more than PRUNE_ABOVE layouts (50,000) is scored shape by shape, highest ceiling first (cost_model.bounds: the
tokens/s/GPU no layout of the shape reaches). The judges are the shipped prediction and each hypothesis the agent
weighs; each keeps the KEEP best fitting figures so far (`Bars`). A shape, or a micro-batch size and dispatcher of
one, whose ceiling is below every judge's KEEP-th best is in no judge's KEEP best and is not scored; nor is a shape
whose memory floor fits under none of its optimizer choices; scored layouts below every final bar are dropped.
What is skipped is counted (`Pruned`) and said. A pruned space is scored here, not on Ray (each step reads the bars
the steps before it raised); smaller spaces are scored whole, unchanged to the bit.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Iterator

from cost_model.nouns.batching import max_tokens_per_gpu
from cost_model.bounds import (cannot_fit, ceilings_of, floors_below, launch_floor_s, launch_key, launch_parts,
                               memory_floor_gib, optimistic_constants, step_floor_s)
from cost_model.constants import default_constants
from cost_model.nouns.layout import InvalidLayout, Layout
from cost_model.predict import microbatches
from search_space.enumerate import offload_choices, rows_choices, shape_dispatchers, shape_dp

# Spaces up to this many layouts are scored whole; above it (the default job's 104,316 among them), pruned: the
# agent then weighs the candidates that can still matter, not every one that may fit.
PRUNE_ABOVE = 50_000
# The fitting layouts that must beat a skipped shape's every layout under every hypothesis: the top 20 the exactness
# test checks and every layout the agent's first proposals weigh seriously are among them.
KEEP = 200


@dataclass
class Pruned:
    """What a pruned scoring left out: whole shapes, the layouts not scored (of those shapes, as the enumeration
    would build them before its rules, and of scored shapes), and the scored ones dropped at the end."""

    shapes: int = 0
    layouts: int = 0
    dropped: int = 0
    keep: int = KEEP
    no_fit: int = 0            # shapes whose every layout's memory floor does not fit
    no_fit_layouts: int = 0
    ray_address: str | None = None   # named, and not used: a pruned space is scored here

    def line(self) -> str:
        out = (f"{self.layouts:,} layouts left unscored ({self.shapes:,} whole parallel shapes) and {self.dropped:,} "
               f"scored ones dropped: under the shipped model and each hypothesis, each is slower than {self.keep} "
               f"scored layouts that fit (cost_model.bounds)")
        if self.no_fit:
            out += (f"; {self.no_fit_layouts:,} layouts of {self.no_fit:,} parallel shapes not scored: their memory "
                    f"floor (weights, gradients and optimizer state alone) does not fit")
        if self.ray_address is not None:
            out += (f"; scored here, not on --ray-address {self.ray_address}: pruning goes shape by shape on what "
                    f"it has scored")
        return out


def prunable(config, runner) -> bool:
    """Whether the scored figures are the cost model's own with the shipped constants (what the ceilings bound):
    no runner, or one that declares so (TrialRunner.scores_shipped_cost_model: the predicting runner without
    constants or a profile of its own)."""
    return runner is None or runner.scores_shipped_cost_model(config.profile)


@dataclass(frozen=True)
class Judge:
    """The shipped prediction (`hypothesis` None) or one hypothesis, with the constants its ceilings use."""

    name: str
    hypothesis: object
    constants: object


def judges(config, runner) -> tuple[list[Judge], object]:
    """(the judges, predict_h for their figures): hypotheses that price a step's floor alike share one constants
    object (the cost model's memos are keyed by its identity)."""
    from tuner.intervals import hypothesis_predictor
    from experiments.predicted_runner import PredictedRunner

    hypotheses, predict_h = hypothesis_predictor(config, runner or PredictedRunner(profile=config.profile))
    c, shared = default_constants(), {}
    out = [Judge("shipped", None, c)]
    for h in hypotheses:
        # a floor leaves out the offload term, the only one the CPU-Adam share prices
        key = (h.layer_launch_overhead_s, h.flex_overhead_factor)
        if key not in shared:
            shared[key] = replace(c, layer_launch_overhead_s=key[0], flex_overhead_factor=key[1])
        out.append(Judge(h.name, h, shared[key]))
    return out, predict_h


class Bars:
    """Per judge, the KEEP best figures of the fitting layouts scored so far (min-heaps). A hypothesis is asked only
    of a few layouts of each shape (`offer`): the figures of any KEEP fitting layouts make a sound bar, and those
    are the ones likely to raise it."""

    def __init__(self, judges: list[Judge], predict_h, keep: int = KEEP):
        self.judges, self.predict_h, self.keep = judges, predict_h, keep
        self.heaps = [[] for _ in judges]

    def bar(self, k: int) -> float:
        """Below it a layout is slower than KEEP fitting ones under judge `k` (0 until KEEP are held)."""
        heap = self.heaps[k]
        return heap[0] if len(heap) >= self.keep else 0.0

    def lowest(self) -> float:
        return min(self.bar(k) for k in range(len(self.judges)))

    def offer(self, fitting: list, ceilings: list[float], bounds: "ShapeBounds | None" = None) -> None:
        """A scored shape's layouts that may fit, with (layout, prediction): each plain fit to the shipped bar;
        to a hypothesis's, the fastest plain fit of each micro-batch size and dispatcher (where it is fastest
        under any hypothesis), and only where the shape's ceiling under it can raise its bar (`ceilings`). A
        layout whose rep's ceiling under a hypothesis is already below its bar (`bounds`, ShapeBounds.below) is not
        priced: its figure could not enter the heap (the same bars as pricing it)."""
        fastest = {}
        for layout, p in fitting:
            if p.fits:
                _push(self.heaps[0], p.tokens_per_s_per_gpu, self.keep)
                key = (layout.max_tokens_per_gpu, layout.dispatcher)
                if key not in fastest or p.tokens_per_s_per_gpu > fastest[key][1].tokens_per_s_per_gpu:
                    fastest[key] = (layout, p)
        for k, judge in enumerate(self.judges[1:], 1):
            if ceilings[k] > self.bar(k):
                for key, (layout, _) in fastest.items():
                    if bounds is not None and bounds.below(k, judge, key, self.bar(k)):
                        continue
                    _push(self.heaps[k], self.predict_h(judge.hypothesis, layout), self.keep)


def _push(heap: list, value: float, keep: int) -> None:
    """Into a min-heap of the `keep` largest values."""
    if len(heap) < keep:
        heapq.heappush(heap, value)
    elif value > heap[0]:
        heapq.heapreplace(heap, value)


class ShapeBounds:
    """One shape's fastest layouts (cost_model.bounds), one per micro-batch size and dispatcher ("rep"), and their
    ceilings: a layout of the shape is at most its rep's ceiling, under every judge at once (optimistic_constants)
    or under one judge. The shape's ceiling is bounded before its floors are priced (`ceiling_bound`), and they are
    priced only when that bound comes first (highest_first). A judge's ceiling is first bounded from the optimistic
    floor (`cheap`), then from it and the launch time the judge adds (`_launch_ceiling`), and worked out only where
    neither settles it. Floors are shared by the judges that read the same launch time."""

    def __init__(self, shape: dict, config, options, offload: dict, optimistic, memo: dict | None = None):
        self.config, self.optimistic, self.shape, self.options = config, optimistic, shape, options
        self.fastest = _fastest(shape, config, options, offload)
        self.rep = {} if self.fastest is None else {
            (layout.max_tokens_per_gpu, layout.dispatcher): r for r, layout in enumerate(self.fastest)}
        self.floors, self.cheap, self.exact, self.counts = {}, {}, {}, None
        self.launch_ceilings, self.launch_parts = {}, {}   # per (judge, rep); per rep
        self.memo = memo   # the scoring's for floors_below

    @cached_property
    def opt(self) -> list[float] | None:
        """Per rep, its floor under the optimistic constants, priced when first asked (a shape whose bound is below
        the bars needs none)."""
        return self._floors(self.optimistic)

    def _floors(self, constants) -> list[float] | None:
        """Per rep, its floor under `constants` (None where the shape cannot be bounded: it is scored whole)."""
        if self.fastest is None:
            return None
        try:
            return [self._floor(constants, r) for r in range(len(self.fastest))]
        except (InvalidLayout, ValueError):
            self.fastest = None
            return None

    def _floor_key(self, constants, r: int) -> tuple:
        layout = self.fastest[r]
        return launch_key(constants, layout, self.config.workload), layout.max_tokens_per_gpu, layout.dispatcher

    def _floor(self, constants, r: int) -> float:
        """Rep `r`'s floor under `constants`, shared by the constants that price its launch alike."""
        config, layout, key = self.config, self.fastest[r], self._floor_key(constants, r)
        floor = self.floors.get(key)
        if floor is None:
            floor = self.floors[key] = step_floor_s(config.model, config.gpu, config.workload, layout, constants,
                                                    config.profile)
        return floor

    def cannot_fit(self) -> bool:
        """Whether no layout of the shape may fit: under each dispatcher and optimizer choice its memory floor
        (cost_model.bounds) is predicted not to fit. Those layouts would not be kept: skipping them changes nothing."""
        if not self.fastest:
            return False
        config, layout = self.config, self.fastest[0]
        c = default_constants()
        try:
            for dispatcher in {r.dispatcher for r in self.fastest}:
                for offload in offload_choices(self.options):
                    probe = replace(layout, dispatcher=dispatcher, **offload)
                    floor, usable = memory_floor_gib(config.model, config.gpu, config.workload, probe, c,
                                                     config.profile)
                    if not cannot_fit(floor, usable, c):
                        return False
        except (InvalidLayout, ValueError):
            return False
        return True

    def ceiling(self) -> float:
        """Above every layout of the shape under every judge (0 for a shape without layouts: no dispatcher)."""
        if self.opt is None:
            return math.inf
        return max(ceilings_of(self.opt, self.fastest, self.config.workload), default=0.0)

    def ceiling_bound(self) -> float:
        """At or above `ceiling`, cheaper (cost_model.bounds.floors_below); math.inf where that does not hold."""
        if not self.fastest:
            return math.inf if self.fastest is None else 0.0
        config = self.config
        try:
            floors = floors_below(self.fastest, config.model, config.gpu, config.workload, self.optimistic,
                                  config.profile, self.memo)
        except (InvalidLayout, ValueError):
            return math.inf
        return math.inf if floors is None else max(ceilings_of(floors, self.fastest, config.workload))

    def _cheap(self, k: int, judge: Judge) -> list[float]:
        hit = self.cheap.get(k)
        if hit is None:
            hit = self.cheap[k] = ceilings_of(self.opt, self.fastest, self.config.workload, judge.hypothesis,
                                              self._counts())
        return hit

    def _counts(self) -> list[int]:
        """Per rep, its micro-batches per step (what a hypothesis's extra term reads), worked out once."""
        if self.counts is None:
            self.counts = [microbatches(layout, self.config.workload)[1] for layout in self.fastest]
        return self.counts

    def _exact(self, k: int, judge: Judge) -> list[float] | None:
        """Per rep, its ceiling under judge `k` (None where the shape cannot be bounded)."""
        if self.fastest is None:
            return None
        out = [self._exact_at(k, judge, r) for r in range(len(self.fastest))]
        return None if None in out else out

    def _exact_at(self, k: int, judge: Judge, r: int) -> float | None:
        """Rep `r`'s ceiling under judge `k`, worked out once and only where asked (most reps are settled by the
        cheap bound or by another judge: their floors under this judge's constants are never priced)."""
        if self.fastest is None:
            return None
        known = self.exact.setdefault(k, {})
        if r not in known:
            try:
                floor = self._floor(judge.constants, r)
            except (InvalidLayout, ValueError):
                self.fastest, known[r] = None, None
                return None
            known[r] = ceilings_of([floor], [self.fastest[r]], self.config.workload, judge.hypothesis,
                                   [self._counts()[r]])[0]
        return known[r]

    def _launch_ceiling(self, k: int, judge: Judge, r: int) -> float:
        """Rep `r`'s ceiling under judge `k` bounded from its optimistic floor and the launch time the judge's
        constants add (cost_model.bounds.launch_floor_s): above the exact one, and near it. The optimistic floor's
        layout priced without error: so does the judge's (only the launch constants differ)."""
        hit = self.launch_ceilings.get((k, r))
        if hit is None:
            config, layout = self.config, self.fastest[r]
            if r not in self.launch_parts:
                try:
                    self.launch_parts[r] = launch_parts(config.model, config.gpu, config.workload, layout,
                                                        self.optimistic, config.profile)
                except (InvalidLayout, ValueError):
                    self.launch_parts[r] = None
            parts = self.launch_parts[r]
            hit = self.launch_ceilings[(k, r)] = math.inf if parts is None else ceilings_of(
                [launch_floor_s(self.opt[r], parts, judge.constants, layout, config.workload)], [layout],
                config.workload, judge.hypothesis, [self._counts()[r]])[0]
        return hit

    def above(self, k: int, judge: Judge, r: int, bar: float) -> bool:
        """Whether rep `r`'s ceiling under judge `k` reaches `bar`: its cheap ceiling asked first, then (where its
        floor under the judge's constants is not priced yet) its launch ceiling, then the exact one."""
        if self._cheap(k, judge)[r] < bar:
            return False
        if (self.fastest is not None and self._floor_key(judge.constants, r) not in self.floors
                and self._launch_ceiling(k, judge, r) < bar):
            return False
        exact = self._exact_at(k, judge, r)
        return exact is None or exact >= bar

    def below(self, k: int, judge: Judge, key: tuple, bar: float) -> bool:
        """Whether every layout of rep `key` (micro-batch size, dispatcher) is below `bar` under judge `k`, by the
        bounds worked out so far (nothing new is worked out: False where they do not settle it)."""
        r = self.rep.get(key)
        if self.opt is None or r is None or bar <= 0.0:
            return False
        if self._cheap(k, judge)[r] < bar or self.launch_ceilings.get((k, r), math.inf) < bar:
            return True
        exact = self.exact.get(k, {}).get(r)
        return exact is not None and exact < bar

    def shape_ceilings(self, judges: list[Judge]) -> list[float]:
        """Per judge, a bound above every layout of the shape (the cheap one)."""
        if self.opt is None:
            return [math.inf] * len(judges)
        return [max(self._cheap(k, j), default=0.0) for k, j in enumerate(judges)]

    def live(self, judges: list[Judge], bars: Bars) -> set | None:
        """The reps (micro-batch size, dispatcher) whose layouts may be among some judge's KEEP best (None: all)."""
        if self.opt is None:
            return None
        levels = [bars.bar(k) for k in range(len(judges))]   # read once: the bars do not move while this runs
        cheap = [self._cheap(k, j) for k, j in enumerate(judges)]
        # `above` per judge in turn, its cheap test read here first (most reps of most shapes fail it under all)
        out = {key for key, r in self.rep.items() if any(
            self.above(k, judges[k], r, levels[k]) for k in range(len(judges)) if not cheap[k][r] < levels[k])}
        return None if self.fastest is None else out

    def matters(self, layout: Layout, prediction, judges: list[Judge], bars: Bars) -> bool:
        """Whether a scored layout may be among some judge's KEEP best: its own shipped figure, its rep's ceilings
        under the hypotheses."""
        return bool(self.kept([(layout, prediction)], judges, bars))

    def kept(self, fitting: list, judges: list[Judge], bars: Bars) -> list:
        """The (layout, prediction) of `fitting` that `matters` keeps, each rep's ceilings asked once."""
        if self.opt is None:
            return list(fitting)
        levels = [bars.bar(k) for k in range(len(judges))]
        reaches: dict[int, bool] = {}   # per rep: its ceiling under some hypothesis reaches that one's bar
        out = []
        for layout, p in fitting:
            r = self.rep.get((layout.max_tokens_per_gpu, layout.dispatcher))
            if r is None or p.tokens_per_s_per_gpu >= levels[0]:
                out.append((layout, p))
                continue
            hit = reaches.get(r)
            if hit is None:
                hit = reaches[r] = any(self.above(k, j, r, levels[k]) for k, j in enumerate(judges) if k)
            if hit:
                out.append((layout, p))
        return out


def shape_bounds(shapes: list[dict], config, options, judges: list[Judge]) -> tuple[list[ShapeBounds], list[float]]:
    """Per shape, its bounds and its ceiling under every judge at once (math.inf where it cannot be bounded)."""
    bounds = bounds_of(shapes, config, options, judges)
    return bounds, [b.ceiling() for b in bounds]


def bounds_of(shapes: list[dict], config, options, judges: list[Judge]) -> list[ShapeBounds]:
    """Per shape, its bounds, their floors priced when first asked."""
    c = optimistic_constants(default_constants(), [j.hypothesis for j in judges if j.hypothesis is not None])
    offs = offload_choices(options)
    top = max(o["optimizer_offload_fraction"] for o in offs)
    offload = next(o for o in offs if o["optimizer_offload_fraction"] == top)
    memo: dict = {}
    return [ShapeBounds(shape, config, options, offload, c, memo) for shape in shapes]


def highest_first(bounds: list[ShapeBounds], bars: Bars, skipped: list) -> Iterator[int]:
    """The shapes by ceiling, highest first (ties: the earlier shape), as sorting their ceilings orders them: a shape
    waits on its bound (ShapeBounds.ceiling_bound, at or above its ceiling) and its ceiling is priced when that bound
    comes first. Once the first is below every judge's bar, so is every later one's ceiling: they go to `skipped`."""
    heap = [(-b.ceiling_bound(), i, False) for i, b in enumerate(bounds)]
    heapq.heapify(heap)
    while heap:
        top, i, exact = heapq.heappop(heap)
        if -top < bars.lowest():
            skipped += [i] + [j for _, j, _ in heap]
            return
        if exact:
            yield i
            continue
        ceiling = bounds[i].ceiling()
        assert ceiling <= -top, f"shape {i}: its ceiling {ceiling} is above its bound {-top}"
        heapq.heappush(heap, (-ceiling, i, True))


def _fastest(shape: dict, config, options, offload: dict) -> list[Layout] | None:
    world, workload = config.world_size, config.workload
    out = []
    for rows in rows_choices(options, workload, shape_dp(shape, world), shape["cp"]):
        for dispatcher in shape_dispatchers(shape, config.stack, options):
            try:
                out.append(Layout(world, **shape, max_tokens_per_gpu=max_tokens_per_gpu(
                    rows, shape["cp"], workload.seq_len), rows_per_microbatch=rows, dispatcher=dispatcher, **offload))
            except InvalidLayout:
                return None
    return out
