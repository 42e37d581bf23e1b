"""One training case: what the cost model answers for and what a trial runs.

(model, gpu, workload, layout) plus the training image's stack: the CLI's what-if questions, a
recipe, a trial and a published measurement are all one of these with extras beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from cost_model.nouns.quick_init import quick_init

from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import Layout
from cost_model.nouns.model_spec import ModelSpec
from cost_model.nouns.stack import Stack
from cost_model.nouns.workload import Workload


@quick_init
@dataclass(frozen=True)
class Case:
    model: ModelSpec
    gpu: GpuSpec
    workload: Workload
    layout: Layout
    stack: Stack = Stack()

    def replace(self, **changes) -> "Case":
        return replace(self, **changes)
