"""quick_init: the faster __init__ of the frozen dataclasses a scored space builds, the same objects as the dataclass's
own __init__ makes, the same errors, and generated source that holds only the class's own identifiers."""
from __future__ import annotations

import inspect
import pickle
from dataclasses import FrozenInstanceError, dataclass, field, replace

import pytest

from cost_model.nouns import quick_init as module
from cost_model.nouns.quick_init import quick_init


@dataclass(frozen=True)
class Plain:
    a: int
    b: str
    c: float = 1.5
    d: tuple = ()
    e: list = field(default_factory=list)

    def __post_init__(self):
        if self.a < 0:
            raise ValueError(f"a must be >= 0, got {self.a}")


@quick_init
@dataclass(frozen=True)
class Quick(Plain):
    pass


def _pair():
    return Plain, Quick


@pytest.mark.parametrize("args,kwargs", [((1, "x"), {}), ((1,), {"b": "y", "d": (2,)}), ((), {"a": 3, "b": "z"}),
                                         ((1, "x", 2.0, (1,), [4]), {})])
def test_the_same_object_as_the_dataclass_init_makes(args, kwargs):
    plain, quick = _pair()
    p, q = plain(*args, **kwargs), quick(*args, **kwargs)
    assert [getattr(q, n) for n in "abcde"] == [getattr(p, n) for n in "abcde"]
    assert repr(q).split("(", 1)[1] == repr(p).split("(", 1)[1]
    assert q == quick(*args, **kwargs) and hash(replace(q, e=None)) == hash(replace(quick(*args, **kwargs), e=None))
    assert pickle.loads(pickle.dumps(q)) == q and replace(q, a=7).a == 7


def test_the_same_errors_and_frozen():
    plain, quick = _pair()
    for call in (lambda c: c(1), lambda c: c(1, "x", zz=1), lambda c: c(1, "x", a=2), lambda c: c(*range(6))):
        with pytest.raises(TypeError):
            call(plain)
        with pytest.raises(TypeError):
            call(quick)
    with pytest.raises(ValueError, match="a must be >= 0"):
        quick(-1, "x")
    q = quick(1, "x")
    with pytest.raises(FrozenInstanceError):
        q.a = 2
    assert quick(1, "x").e is not q.e   # a default factory runs per object


def test_the_generated_init_holds_only_the_classes_own_identifiers():
    """quick_init's one exec (benchmarks/hostile_inputs.py ALLOWED_CALLS) builds source from field names it asserts
    are identifiers (dataclasses already refuses others): a field renamed otherwise is refused before any code is
    made."""
    @dataclass(frozen=True)
    class Odd:
        x: int

    Odd.__dataclass_fields__["x"].name = "x=0; import os"
    with pytest.raises(AssertionError):
        quick_init(Odd)
