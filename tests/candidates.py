"""The proposer's candidates for test studies: the layouts of a space that the cost model predicts to fit."""
import itertools

from cost_model.predict import predict
from search_space.enumerate import enumerate_layouts
from cost_model.nouns.stack import Stack
from tuner.proposer import Candidate

# One space's candidates are computed once a session (the whole 8-GPU space of Qwen3.6-35B-A3B: about 10 s, asked
# for by test_proposer and test_verify); each caller gets its own list of them.
_computed: dict = {}


def fitting_candidates(model, gpu, workload, world_size: int = 8, stack: Stack = Stack(), every: int = 1):
    """Candidates for every `every`-th layout of the space (1: all) that is predicted to fit."""
    key = repr((model, gpu, workload, world_size, stack, every))
    if key not in _computed:
        layouts = itertools.islice(enumerate_layouts(model, world_size, workload, stack), 0, None, every)
        _computed[key] = [Candidate(layout, p) for layout in layouts if (p := predict(model, gpu, workload, layout)).fits]
    return list(_computed[key])
