"""Give back a released build's device memory that stray references still hold, and say who holds what is left.

megatron's MoE token dispatchers keep the last forward's routing probabilities (`probs`, `local_probs`,
`token_probs`: tensors with their autograd graph) as attributes. That graph reaches the parameters' gradient
accumulators, whose hooks (megatron's DDP) hold the DDP wrapper, which holds the dispatcher: a cycle through
autograd's C++ nodes that Python's collector cannot see, so a released MoE build stayed allocated on the GPU with
its parameters, gradients and optimizer state (found on CPU with megatron-core 0.19.2's DDP: a dense build is
collected, a MoE build is not until `local_probs` is dropped). `drop_graphs` removes such references from the build's
objects, so the cycle goes; `hollow_out` swaps every device tensor reachable from them for an empty one, so their
storage returns even if something else still holds the objects. `held_tensors` lists the largest device tensors
still alive after that, with what refers to them: the profile logs it when memory stays held.
"""
from __future__ import annotations

import gc
import types
from collections import deque

# not followed: scalars, classes, and modules (their globals are the process's shared state, which the next
# build needs); functions and bound methods are skipped where they are met (they lead to globals too)
_SKIP_TYPES = (type, types.ModuleType, str, bytes, int, float, bool, complex, type(None))
MAX_OBJECTS = 200_000


def _children(obj):
    """What `obj` holds: a container's items, a module's parameters, buffers and submodules, an object's
    attributes (its own, not its class's)."""
    if isinstance(obj, dict):
        yield from obj.keys()
        yield from obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset, deque)):
        yield from obj
    else:
        fields = getattr(obj, "__dict__", None)
        if isinstance(fields, dict):
            yield from fields.values()
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                yield getattr(obj, slot)


def _reachable(*roots, max_objects: int = MAX_OBJECTS):
    """Every object reachable from `roots` through containers and object attributes, each once, breadth first (a
    tensor's .grad and .main_grad followed, nothing else inside a tensor). An object's children are read after the
    caller has seen it, so what the caller removes from it is not walked."""
    import torch

    seen = set()
    queue = deque(roots)
    while queue and len(seen) < max_objects:
        obj = queue.popleft()
        if isinstance(obj, _SKIP_TYPES) or callable(obj) and not isinstance(obj, torch.nn.Module) or id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        if isinstance(obj, torch.Tensor):
            queue.extend(x for x in (getattr(obj, "grad", None), getattr(obj, "main_grad", None))
                         if isinstance(x, torch.Tensor))
        else:
            queue.extend(_children(obj))


def reachable_tensors(*roots, device_type: str = "cuda", max_objects: int = MAX_OBJECTS) -> list:
    """Every tensor of `device_type` reachable from `roots` (`_reachable`), each once."""
    import torch

    return [o for o in _reachable(*roots, max_objects=max_objects)
            if isinstance(o, torch.Tensor) and o.device.type == device_type]


def drop_graphs(*roots, max_objects: int = MAX_OBJECTS) -> list[str]:
    """Remove every reference to a tensor that carries an autograd graph (grad_fn set) from the attributes, dicts
    and lists reachable from `roots`; the names of what held them (type.attribute)."""
    import torch

    dropped = []
    for obj in _reachable(*roots, max_objects=max_objects):
        if isinstance(obj, torch.Tensor):
            continue
        holder = obj if isinstance(obj, (dict, list)) else getattr(obj, "__dict__", None)
        if not isinstance(holder, (dict, list)):
            continue
        for key, value in list(holder.items() if isinstance(holder, dict) else enumerate(holder)):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                holder[key] = None
                dropped.append(f"{type(obj).__name__}.{key}")
    return dropped


def hollow_out(*roots, device_type: str = "cuda") -> int:
    """Swap each `device_type` tensor reachable from `roots` for an empty one of its dtype and device (the Python
    objects stay; their storage goes when nothing else refers to it). Returns the bytes the swapped tensors
    viewed (views of one buffer counted each)."""
    import torch

    freed = 0
    with torch.no_grad():
        for t in reachable_tensors(*roots, device_type=device_type):
            freed += t.numel() * t.element_size()
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            if t.is_leaf:   # a parameter among them
                t.grad = None
    return freed


def _where(holder, held) -> str:
    """`holder`'s type and, where it has one, the key or attribute under which it holds `held`."""
    kind = type(holder)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    items = holder.items() if isinstance(holder, dict) else getattr(holder, "__dict__", {}).items()
    key = next((k for k, v in items if v is held), None)
    return name if key is None else f"{name}[{key!r}]"


def held_tensors(device_type: str = "cuda", top: int = 5, depth: int = 3) -> list[dict]:
    """The `top` largest live `device_type` tensors the collector tracks, each with the chain of what refers to it
    (`depth` steps: the first referrer of each step that is not a frame or this search's own, its type and the key
    or attribute it holds it under)."""
    import torch

    gc.collect()
    live = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.device.type == device_type]
    live.sort(key=lambda t: t.untyped_storage().nbytes(), reverse=True)
    chosen, out = live[:top], []
    del live
    for i in range(len(chosen)):
        chain, node, refs = [], chosen[i], []
        for _ in range(depth):
            mine = {id(chosen), id(chain), id(out), id(refs)}
            refs = [r for r in gc.get_referrers(node) if id(r) not in mine and type(r).__name__ != "frame"]
            if not refs:
                break
            chain.append(_where(refs[0], node))
            node = refs[0]
        t = chosen[i]
        out.append({"gib": round(t.untyped_storage().nbytes() / 2 ** 30, 3), "shape": list(t.shape),
                    "dtype": str(t.dtype).removeprefix("torch."), "held_by": chain})
    return out
