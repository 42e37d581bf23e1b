"""A faster __init__ for the frozen dataclasses a scored space builds one of per layout.

A frozen dataclass's generated __init__ sets each field through object.__setattr__ (it refuses plain assignment):
about 0.15 us a field, so 3 us for a 19-field StepContext, and a scored space builds several such objects per
layout. `quick_init` gives the class an __init__ of the same signature (the fields in order, their defaults and
default factories) that writes the instance's dict directly, then runs __post_init__ where the class has one: the
same object, several times faster to build. Frozen stays frozen (assignment after __init__ still raises);
equality, hashing, repr, pickling and dataclasses.replace are the dataclass's own.
"""
from __future__ import annotations

import keyword
from dataclasses import MISSING, fields, is_dataclass


def quick_init(cls):
    """Decorate a frozen dataclass (applied above @dataclass) without __slots__, init-only or keyword-only
    fields."""
    assert is_dataclass(cls) and cls.__dataclass_params__.frozen and not hasattr(cls, "__slots__"), cls
    names, params, env = [], [], {}
    for f in fields(cls):
        # the generated source holds nothing but these names: identifiers of our own classes, never user input
        assert f.init and not f.kw_only and f.name != "_instance_dict_" and f.name.isidentifier() \
            and not keyword.iskeyword(f.name), (cls, f.name)
        names.append(f.name)
        if f.default is not MISSING:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not MISSING:
            env[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
        else:
            params.append(f.name)
    env["_FACTORY"] = _FACTORY = object()   # noqa: F841 - the sentinel the generated code reads
    body = [f"    if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()"
            for f in fields(cls) if f.default is MISSING and f.default_factory is not MISSING]
    body.append("    _instance_dict_ = self.__dict__")
    body += [f"    _instance_dict_[{n!r}] = {n}" for n in names]
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(source, env)   # noqa: S102 - generated from the class's own field names, as dataclasses does
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
