"""Layouts that add recompute or offload to one measured to run cannot run faster: the agent spends no trial on
them (tuner/dominated.py)."""
from __future__ import annotations

from cost_model.nouns.layout import Layout
from tuner.dominated import adds_work
from tests.test_agent import agent_for, space  # noqa: F401 - the agent's fixture space
from tuner.proposer import History

BASE = Layout(8, tp=2, ep=4, max_tokens_per_gpu=8192)
FULL = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def test_recompute_or_offload_added_is_more_work_and_nothing_else_is():
    assert adds_work(BASE.replace(**FULL), BASE)
    assert adds_work(BASE.replace(optimizer_offload_fraction=0.5), BASE)
    assert adds_work(BASE.replace(optimizer_offload_fraction=1.0, **FULL), BASE)
    assert not adds_work(BASE, BASE)                                             # the same layout
    assert not adds_work(BASE, BASE.replace(**FULL))                             # less work
    assert not adds_work(BASE.replace(max_tokens_per_gpu=16384, **FULL), BASE)  # another micro-batch
    assert not adds_work(BASE.replace(dispatcher="flex", **FULL), BASE)          # another dispatcher
    # recompute added on top of an offloaded layout, offload kept: more work; another fraction: not comparable
    off = BASE.replace(optimizer_offload_fraction=0.5)
    assert adds_work(off.replace(**FULL), off) and not adds_work(off.replace(optimizer_offload_fraction=1.0, **FULL), off)
    # fp32 Adam moments where bf16 ran: twice the bytes Adam moves; the other way round may run faster
    bf16 = BASE.replace(exp_avg_dtype="bf16")
    assert adds_work(BASE, bf16) and adds_work(BASE.replace(**FULL), bf16) and adds_work(off, bf16)
    assert not adds_work(bf16, BASE) and not adds_work(bf16.replace(**FULL), BASE)


def test_the_agent_tries_no_layout_that_only_adds_work_to_a_measured_plain_fit(space):  # noqa: F811
    agent = agent_for(space, stop_margin=None)
    cands = list(agent.by_key.values())
    # the fastest plain fit without recompute that has recompute variants among the candidates
    first = max((c for c in cands if c.prediction.fits and c.layout.recompute_granularity is None
                 and any(adds_work(v.layout, c.layout) for v in cands)),
                key=lambda c: c.prediction.tokens_per_s_per_gpu)
    variants = [c for c in cands if adds_work(c.layout, first.layout)]
    # weighed while nothing is measured (the first layout only tried, say failed for another reason)
    _, before, _ = agent.outlooks(History(tried={first.layout.key()}))
    assert {agent.table.candidates[o.index].layout.key() for o in before} & {c.layout.key() for c in variants}
    history = History(tried={first.layout.key()})
    history.measured_layouts.append((first.layout, first.prediction.tokens_per_s_per_gpu))
    _, outs, _ = agent.outlooks(history)
    left = {agent.table.candidates[o.index].layout.key() for o in outs}
    assert not left & {c.layout.key() for c in variants} and left


def test_the_exported_recipes_are_distinct_choices():
    """`--top N` exports N layouts that are each a choice: a twin that only adds work to one taken (its fp32-moments or
    recompute variant) is passed over for the next row."""
    from types import SimpleNamespace

    from tuner.export import distinct_top

    bf16 = BASE.replace(exp_avg_dtype="bf16")
    rows = [SimpleNamespace(layout=bf16), SimpleNamespace(layout=BASE), SimpleNamespace(layout=BASE.replace(**FULL)),
            SimpleNamespace(layout=BASE.replace(max_tokens_per_gpu=16384)), SimpleNamespace(layout=BASE.replace(tp=4))]
    assert [r.layout for r in distinct_top(rows, 3)] == [bf16, BASE.replace(max_tokens_per_gpu=16384),
                                                         BASE.replace(tp=4)]
    assert distinct_top(rows, 1) == rows[:1] and distinct_top(rows, 0) == []


def test_the_same_recompute_in_other_chunks_is_no_faster():
    """Full uniform recompute reruns every layer whatever its chunk: a layout that differs from one run only there
    (or in more block layers, or more selective modules) cannot run faster; fewer block layers can."""
    uniform = lambda n: BASE.replace(recompute_granularity="full", recompute_method="uniform",  # noqa: E731
                                     recompute_num_layers=n)
    block = lambda n: BASE.replace(recompute_granularity="full", recompute_method="block",  # noqa: E731
                                   recompute_num_layers=n)
    assert adds_work(uniform(4), uniform(1)) and adds_work(uniform(1), uniform(4))
    assert adds_work(uniform(1), block(2)) and adds_work(block(4), block(2))
    assert not adds_work(block(2), block(4)) and not adds_work(block(2), uniform(1))
    selective = lambda mods: BASE.replace(recompute_granularity="selective", recompute_modules=mods)  # noqa: E731
    assert adds_work(selective(("core_attn", "moe_act")), selective(("moe_act",)))
    assert not adds_work(selective(("moe_act",)), selective(("core_attn", "moe_act")))
    assert not adds_work(uniform(1), selective(("moe_act",)))   # another kind: not comparable
