"""Megatron's --pipeline-model-parallel-layout: the layers of every (virtual) pipeline stage, spelled out.

"Et|(tt|)*30L" is DeepSeek-V3's 61 layers over PP 8 x VPP 4: stages are separated by '|'; in a stage, E is the
embedding, t a decoder layer, m a multi-token-prediction (MTP) layer, L the loss (with the LM head); "(...)*n"
and "x*n" repeat; commas are cosmetic. Stage k of the list is virtual stage k // PP of pipeline rank k % PP, so
the number of stages is PP x VPP. The checks are megatron-core's (PipelineParallelLayerLayout): the embedding
first and the loss last, once each; as many decoder layers as the model has; MTP layers after every decoder
layer, all in one stage, the last virtual stage of a rank other than the first.
"""
from __future__ import annotations

import re
from functools import lru_cache

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown

LAYER_CHARS = "EtmL"
MAX_EXPANDED = 100_000          # characters once the repeats are unrolled (a 1,000-layer model is 1,000)
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_SINGLE = re.compile(r"(.)\*(\d+)")

_LAYOUT_SYNTAX = frozenset(LAYER_CHARS + "|()*, 0123456789")


class InvalidPipelineLayout(AttuneError, ValueError):
    """A --pipeline-model-parallel-layout Megatron would reject; the message says which rule."""


def _unroll(pattern: re.Pattern, text: str) -> str:
    def repeat(m: re.Match) -> str:
        count = int(m.group(2))
        if count * len(m.group(1)) > MAX_EXPANDED:
            raise InvalidPipelineLayout(f"pipeline layout repeats '{m.group(1)}' {count} times: more than "
                                        f"{MAX_EXPANDED:,} layers")
        return m.group(1) * count

    while True:
        out = pattern.sub(repeat, text)
        if len(out) > MAX_EXPANDED:
            raise InvalidPipelineLayout(f"pipeline layout unrolls to more than {MAX_EXPANDED:,} characters")
        if out == text:
            return out
        text = out


@lru_cache(maxsize=1024)
def parse_stages(text: str) -> tuple[str, ...]:
    """The stages of a layout string, each a string over E, t, m and L, in the flag's order."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidPipelineLayout(f"pipeline layout must be a non-empty string, got {shown(text)}")
    # a string of many other characters may be another file's line: said by count, never shown (a typo or two
    # is named, as the layout's own characters are)
    foreign = [ch for ch in text if ch not in _LAYOUT_SYNTAX]
    if len(foreign) > 2:
        raise InvalidPipelineLayout(f"pipeline layout has {len(foreign):,} characters outside its syntax: the layer "
                                    f"characters are E (embedding), t (decoder), m (MTP), L (loss), '|' between "
                                    f"stages, (...)*N and X*N repeats")
    flat = _unroll(_SINGLE, _unroll(_GROUP, text.replace(",", "").replace(" ", "")))
    bad = sorted(set(flat) - set(LAYER_CHARS) - {"|"})
    if bad:
        raise InvalidPipelineLayout(f"pipeline layout '{text}' has {', '.join(repr(c) for c in bad)}: the layer "
                                    f"characters are E (embedding), t (decoder), m (MTP), L (loss), '|' between stages")
    return tuple(flat.split("|"))


@lru_cache(maxsize=1024)
def stage_grid(text: str, pp: int, num_layers: int, mtp_layers_allowed: int = 0) -> tuple[tuple[str, ...], ...]:
    """grid[v][r]: the layers of virtual stage v of pipeline rank r, validated as megatron-core does against
    `num_layers` decoder layers; MTP layers up to `mtp_layers_allowed` (the model's MTP depth)."""
    stages = parse_stages(text)
    if pp < 1 or len(stages) % pp:
        raise InvalidPipelineLayout(f"pipeline layout '{text}' has {len(stages)} stages, not a multiple of PP {pp}")
    flat = "".join(stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        raise InvalidPipelineLayout(f"pipeline layout '{text}': the embedding (E) must come first, exactly once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise InvalidPipelineLayout(f"pipeline layout '{text}': the loss (L) must come last, exactly once")
    if flat.count("t") != num_layers:
        raise InvalidPipelineLayout(f"pipeline layout '{text}' places {flat.count('t')} decoder layers (t); the "
                                    f"model has {num_layers}")
    mtp = flat.count("m")
    if mtp > mtp_layers_allowed:
        raise InvalidPipelineLayout(f"pipeline layout '{text}' places {mtp} MTP layers (m); the model has "
                                    f"{mtp_layers_allowed}")
    if mtp and "t" in flat[flat.index("m"):]:
        raise InvalidPipelineLayout(f"pipeline layout '{text}': decoder layers must come before the MTP layers")
    vpp = len(stages) // pp
    grid = tuple(tuple(stages[v * pp + r] for r in range(pp)) for v in range(vpp))
    if mtp:
        holders = [(v, r) for v in range(vpp) for r in range(pp) if "m" in grid[v][r]]
        v, r = holders[0]
        if len(holders) > 1 or v != vpp - 1 or (r == 0 and vpp > 1):
            raise InvalidPipelineLayout(f"pipeline layout '{text}': all MTP layers must be in one stage, the last "
                                        f"virtual stage of a pipeline rank other than the first")
    return grid


def vpp_of(text: str, pp: int) -> int:
    """The virtual stages per pipeline rank a layout string implies (its stages / PP)."""
    return max(1, len(parse_stages(text)) // pp)


@lru_cache(maxsize=4096)
def balanced_layout(num_layers: int, pp: int, vpp: int) -> str | None:
    """The layout string that spreads the layers, the embedding and the loss (each counted as one layer) as
    evenly as possible over PP x VPP stages, the lighter stages last (the loss stage also runs the LM head);
    None when the even split or the embedding/loss accounting already divides, or a stage would be empty."""
    stages = pp * vpp
    slots = num_layers + 2
    if pp < 2 or num_layers % stages == 0 or slots % stages == 0:
        return None
    small, extra = divmod(slots, stages)
    sizes = [small + 1] * extra + [small] * (stages - extra)
    counts = [sizes[0] - 1] + sizes[1:-1] + [sizes[-1] - 1]   # the embedding and the loss take one slot each
    if min(counts[1:-1] or [1]) < 1 or min(counts[0], counts[-1]) < 0:
        return None
    return compress(["E" + "t" * counts[0]] + ["t" * c for c in counts[1:-1]] + ["t" * counts[-1] + "L"])


def compress(stages: list[str]) -> str:
    """Stages written the short way Megatron's recipes write them: a run of identical middle stages as
    (..|)*n, a run of t as t*n ("Et|(tt|)*30L")."""
    def short(stage: str) -> str:
        return re.sub(r"t{3,}", lambda m: f"t*{len(m.group(0))}", stage)

    out = short(stages[0]) + "|"
    i = 1
    while i < len(stages) - 1:
        j = i
        while j + 1 < len(stages) - 1 and stages[j + 1] == stages[i]:
            j += 1
        n = j - i + 1
        out += f"({short(stages[i])}|)*{n}" if n > 1 else short(stages[i]) + "|"
        i = j + 1
    return out + short(stages[-1])
