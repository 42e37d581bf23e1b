"""slime's dynamic batching of a step's rows into micro-batches (slime/utils/dp_schedule.py), as the cost model
prices it: the closed walk in cost_model.nouns.batching.slime_schedule against a plain re-enactment of slime's
steps, and what it does to a prediction (rows the busiest rank works through, not a full bin per micro-batch)."""
import itertools

import pytest

from cost_model.nouns.batching import slime_bin_count, slime_schedule
from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload
from cost_model.predict import microbatches, predict
from search_space.rules import violations


def _slime_steps(rows: int, dp: int, rows_per_bin: int, align: int, coupled: bool) -> tuple[float, int, int]:
    """slime's own steps on `rows` equal rows, one list operation at a time: first-fit packing, splitting the
    largest multi-sample bin (by (tokens, index)) in two with its samples dealt alternately, round-robin ranks."""
    bins: list[list[int]] = []
    for i in range(rows):
        for b in bins:
            if len(b) + 1 <= rows_per_bin:
                b.append(i)
                break
        else:
            bins.append([i])
    target = max(-(-len(bins) // align) * align, align)
    while len(bins) < target:
        _, at = max((len(b), k) for k, b in enumerate(bins) if len(b) > 1)
        halves: list[list[int]] = [[], []]
        for sample in bins[at]:
            halves[0 if len(halves[0]) <= len(halves[1]) else 1].append(sample)
        bins[at] = halves[0]
        bins.append(halves[1])
    sizes = [len(b) for b in bins]
    ranks = [sizes[r::dp] for r in range(dp)]
    per_rank = len(sizes) // dp
    if coupled:
        work = sum(max(ranks[r][k] for r in range(dp)) for k in range(per_rank))
    else:
        work = max(sum(r) for r in ranks)
    return float(work), per_rank, max(sizes)


@pytest.mark.parametrize("rows,dp,align_factor", [(16, 1, 1), (24, 2, 1), (64, 4, 2), (128, 8, 1), (96, 8, 2),
                                                  (40, 4, 4)])
def test_the_closed_walk_is_slimes_schedule(rows, dp, align_factor):
    for rows_per_bin, coupled in itertools.product(range(1, rows // dp + 1), (False, True)):
        align = dp * align_factor
        if slime_bin_count(rows, rows_per_bin, align) > rows:
            continue   # slime raises: more bins than rows (search_space.rules refuses the layout)
        assert slime_schedule(rows, dp, rows_per_bin, align, coupled) == \
            _slime_steps(rows, dp, rows_per_bin, align, coupled), (rows, dp, rows_per_bin, align, coupled)


@pytest.mark.parametrize("rows,dp,align_factor", [(16, 1, 1), (24, 2, 1), (64, 4, 2), (40, 4, 4), (7, 8, 1)])
def test_rows_held_in_flight_are_each_ranks_k_largest_bins(rows, dp, align_factor):
    """slime_rows_held sums running totals (a step of 65,536 rows deals thousands of bins to a rank): the same as
    summing each rank's k largest bins afresh for every k."""
    from cost_model.nouns.batching import _slime_bins, slime_rows_held

    for rows_per_bin in range(1, max(rows // dp, 1) + 1):
        align = dp * align_factor
        bins = _slime_bins(rows, rows_per_bin, align)
        ranks = [sorted(bins[r::dp], reverse=True) for r in range(dp)]
        want = tuple(max(sum(b[:k]) for b in ranks) for k in range(1, max(len(b) for b in ranks) + 1))
        assert slime_rows_held(rows, dp, rows_per_bin, align) == want, (rows, dp, rows_per_bin, align)


def test_a_bin_that_does_not_divide_the_ranks_rows_costs_the_busiest_ranks_rows():
    """128 rows of 8k over DP 8 in bins of 12 (--max-tokens-per-gpu 98,304): 16 bins after splitting, the busiest
    rank gets 12 + 8 = 20 rows; not 2 x 12 = 24 (a full bin per micro-batch), nor the mean 16."""
    assert slime_schedule(128, 8, 12, 8, False) == (20.0, 2, 12)
    assert slime_schedule(128, 8, 8, 8, False) == (16.0, 2, 8)


def test_an_uneven_bin_is_priced_between_the_even_ones():
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h200")
    w = Workload()
    step = {mt: predict(model, gpu, w, Layout(8, ep=8, max_tokens_per_gpu=mt)).step_time_s
            for mt in (65536, 98304, 131072)}
    tokens, n_mb, largest = microbatches(Layout(8, ep=8, max_tokens_per_gpu=98304), w)
    assert (n_mb, tokens, largest) == (2, 10 * 8192, 12 * 8192)
    # 20 rows a rank (the even layouts run 16) at most 25% more than the even bins' time; more than 8 rows a bin
    assert step[65536] < step[98304] < 1.25 * step[65536]
    assert step[98304] != step[131072]


def test_interleaving_splits_bins_rather_than_adding_whole_ones():
    """Under VPP slime raises the micro-batch count to a multiple of DP x PP by halving bins: PP 2 x VPP 2 over
    DP 2 with 16 rows in bins of 8 runs 2 micro-batches of 4 rows a rank, 8 rows in all."""
    w = Workload(global_batch=16)
    layout = Layout(8, tp=2, pp=2, vpp=2, max_tokens_per_gpu=8 * 8192)
    assert (layout.dp, microbatches(layout, w)) == (2, (4 * 8192, 2, 4 * 8192))
    # Megatron's fixed micro-batch keeps its rows (the runner and --framework megatron)
    assert microbatches(layout, Workload(global_batch=16, framework="megatron"))[0] == 8 * 8192


def test_interleaving_with_fewer_rows_than_dp_x_pp_micro_batches_is_refused():
    model = load_model("llama3-8b")
    layout = Layout(64, pp=8, vpp=4)
    refused = lambda gbs, lay: [v for v in violations(lay, model, Workload(global_batch=gbs), Stack())  # noqa: E731
                                if v.rule == "vpp_rows_per_step"]
    found = refused(32, layout)
    assert found and "DP 8 x PP 8 = 64" in str(found[0])
    assert not refused(64, layout)
    # 72 one-row bins round up to 128 micro-batches: more than the rows; bins of 2 rows make 64 of them
    assert refused(72, layout) and not refused(72, Layout(64, pp=8, vpp=4, max_tokens_per_gpu=2 * 8192))


def test_explain_says_the_micro_batches_are_uneven():
    from tuner.what_if import microbatch_line

    model, gpu, w = load_model("qwen3-30b-a3b"), load_gpu("h200"), Workload()
    uneven = microbatch_line(predict(model, gpu, w, Layout(8, ep=8, max_tokens_per_gpu=98304)))
    assert uneven.startswith("2 micro-batches of 81,920 tokens") and "the largest, 98,304 tokens" in uneven
    assert microbatch_line(predict(model, gpu, w, Layout(8, ep=8, max_tokens_per_gpu=65536))) == \
        "2 micro-batches of 65,536 tokens per GPU per step"


def test_layouts_slime_runs_alike_are_one_candidate():
    """Under VPP slime halves bins until DP x PP of them: 128 rows over DP 16 x PP 8 (DeepSeek-V3 on 256 GPUs at
    CP 2) are 128 one-row micro-batches whatever the bin; one layout of them is kept, the smallest bin."""
    from tuner.space_scoring import distinct_runs

    w = Workload()
    same = [Layout(256, pp=8, vpp=4, cp=2, ep=16, max_tokens_per_gpu=mt, rows_per_microbatch=mt * 2 // 8192)
            for mt in (4096, 8192, 16384)]
    other = Layout(8, ep=8, max_tokens_per_gpu=16384, rows_per_microbatch=2)
    kept, dropped = distinct_runs([(l, None) for l in same + [other]], w)
    assert [l for l, _ in kept] == [same[0], other] and dropped == 2
    # Megatron's fixed micro-batch runs each size as asked
    assert distinct_runs([(l, None) for l in same], Workload(framework="megatron")) == ([(l, None) for l in same], 0)


def test_a_recipe_says_what_slimes_schedule_runs():
    from recipes.recipe import layout_summary

    vpp = Layout(64, pp=2, vpp=4, ep=8, max_tokens_per_gpu=32768, rows_per_microbatch=4)
    assert "four 8,192-token rows per microbatch (slime's schedule: 2 micro-batches a rank, the largest of 2 rows" in \
        layout_summary(vpp, Workload(), True)
    even = Layout(8, ep=8, max_tokens_per_gpu=16384, rows_per_microbatch=2)
    assert "two 8,192-token rows per microbatch;" in layout_summary(even, Workload(), True)


def test_a_pipelines_uneven_micro_batches_in_flight_hold_their_own_rows():
    """Llama3-70B on 32 x H200 at 12 rows a step, TP4 PP4 (DP 2): bins of 4 rows make a rank's micro-batches 4 + 2
    rows, both in flight on the first stage: 6 rows, as bins of 3 (3 + 3) hold; priced as two of the largest (8 rows)
    it was called out of memory (146.9 GiB) where the 3-row one fits."""
    from cost_model.activations import in_flight_microbatches
    from cost_model.nouns.batching import slime_rows_held
    from cost_model.predict import in_flight_share

    assert slime_rows_held(12, 2, 4, 2) == (4, 6) and slime_rows_held(12, 2, 3, 2) == (3, 6)
    model, gpu, w = load_model("llama3-70b"), load_gpu("h200"), Workload(global_batch=12)
    four, three = (Layout(32, tp=4, pp=4, max_tokens_per_gpu=r * 8192, rows_per_microbatch=r) for r in (4, 3))
    assert in_flight_share(four.max_tokens_per_gpu, 2, 4, 1, 1, w, in_flight_microbatches(four, 2)) == 1.5
    peaks = [predict(model, gpu, w, layout).peak_memory_gib for layout in (four, three)]
    assert peaks[1] <= peaks[0] < peaks[1] * 1.02
