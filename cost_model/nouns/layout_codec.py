"""A Layout as text and back: the one codec for every place a layout is written or read.

Three shapes, one set of rules:
- flat values {field: value} with Megatron's names: CLI `KEY=VALUE` pairs, `predict --batch` requests,
  suite files, stored trial results (`layout_values`, `layout_from_values`, `parse_pairs`);
- a recipe's `layout` block, with nested `recompute` and `offload` groups (`recipe_block`,
  `layout_from_recipe_block`);
- categorical Optuna parameters (OPTUNA_PARAM_NAMES), where recompute and offload are one string each and
  max_tokens_per_gpu follows from rows per micro-batch (`to_optuna_params`, `from_optuna_params`).
Every reader is strict: an unknown key, a wrong type or a repeated key raises InvalidLayout naming it.
Text (`KEY=VALUE` flags) is parsed into types; typed values (JSON, YAML) must already have the right type.
"""
from __future__ import annotations

from dataclasses import fields

from cost_model.nouns.names import shown, shown_name
from cost_model.nouns.batching import max_tokens_per_gpu, rows_per_microbatch
from cost_model.nouns.pipeline_layout import InvalidPipelineLayout, vpp_of
from cost_model.nouns.layout import (ACCOUNT_FIELDS, EP_OVERLAP_FIELD, LAYOUT_STRING_FIELD, SPLIT_FIELDS, UNEVEN_FIELDS,
                                     InvalidLayout, Layout)

LAYOUT_KEYS = tuple(f.name for f in fields(Layout) if f.name != "world_size")
_TEXT_KEYS = ("recompute_method", "dispatcher", "exp_avg_dtype", LAYOUT_STRING_FIELD)
_NULLABLE = ("recompute_granularity", "recompute_method", "recompute_num_layers", "etp",
             "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", LAYOUT_STRING_FIELD)
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_BOOL_KEYS = ("overlap_d2h_h2d", EP_OVERLAP_FIELD) + ACCOUNT_FIELDS

OPTUNA_PARAM_NAMES = ("tp", "pp", "vpp", "cp", "ep", "etp", "rows_per_microbatch", "recompute", "offload",
                      "dispatcher", "pipeline_split")


# ---------------------------------------------------------------- flat values

def layout_value(key: str, raw):
    """One layout field's value from a JSON/YAML value: it must have the field's type (an integer field
    takes an integer, not "8"; a flag takes true/false)."""
    _check_key(key)
    if raw is None and key in _NULLABLE:
        return None
    expected = _typed_kind(key)
    ok = {"int": isinstance(raw, int) and not isinstance(raw, bool),
          "number": isinstance(raw, (int, float)) and not isinstance(raw, bool),
          "bool": isinstance(raw, bool),
          "text": isinstance(raw, str),
          # a list, or the flat form's comma-joined text (`layout_values`)
          "modules": isinstance(raw, str) or (isinstance(raw, (list, tuple)) and all(isinstance(m, str) for m in raw))}[
        expected]
    if not ok:
        raise InvalidLayout(f"layout value {key}={_short(raw)} has the wrong type (expected {_KIND_WORDS[expected]})")
    return text_layout_value(key, raw)


def text_layout_value(key: str, raw):
    """One layout field's value from command-line text (or an already typed value), with its proper type."""
    _check_key(key)
    if raw is None and key in _NULLABLE:
        return None
    try:
        if key == "recompute_granularity":
            return None if str(raw).lower() in ("", "none", "null") else _text(raw)
        if key in _TEXT_KEYS:
            return _text(raw)
        if key == "recompute_modules":
            if isinstance(raw, str):
                items = raw.replace("+", ",").split(",")
            elif isinstance(raw, (list, tuple)):
                items = [_text(m) for m in raw]
            else:
                raise TypeError
            return tuple(m.strip() for m in items if m.strip())
        if key in _NULLABLE and str(raw).strip().lower() in ("", "none", "null"):
            return None
        if key == "optimizer_offload_fraction":
            if isinstance(raw, bool):
                raise TypeError
            value = float(raw)
            if value != value:  # NaN
                raise ValueError
            return value
        if key in _BOOL_KEYS:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text not in _TRUE + _FALSE:
                raise ValueError
            return text in _TRUE
        return _integer(raw)
    except (ValueError, TypeError, OverflowError):
        if isinstance(raw, str) and not raw.strip():
            raise InvalidLayout(f"layout value {key}= has no value (KEY=VALUE)") from None
        raise InvalidLayout(f"layout value {key}={_short(raw)} has the wrong type") from None


def parse_pairs(pairs: list[str]) -> dict:
    """`KEY=VALUE` pairs (dashes or underscores) to typed values; a key given twice is an error."""
    values: dict = {}
    for pair in _split_joined(pairs):
        key, sep, raw = str(pair).partition("=")
        if not sep:
            raise InvalidLayout(f"layout value {_short(pair)} is not KEY=VALUE")
        key = key.strip().replace("-", "_")
        if "=" in raw:
            raise InvalidLayout(f"layout value {key}=... holds another '=': give each pair on its own, separated by "
                                "spaces (--layout tp=2 ep=8)")
        if key in values:
            raise InvalidLayout(f"layout key '{key}' is given twice")
        values[key] = text_layout_value(key, raw.strip())
    return values


def _split_joined(pairs: list[str]) -> list[str]:
    """Pairs as given, a comma-joined one (`tp=2,ep=8`) split where every piece is a pair (a module list's commas,
    `recompute_modules=core_attn,mlp`, stay)."""
    out = []
    for pair in pairs:
        pieces = str(pair).split(",")
        out += pieces if len(pieces) > 1 and all("=" in p for p in pieces) else [pair]
    return out


def layout_pairs(layout: Layout) -> list[str]:
    """The layout as `--layout KEY=VALUE` pairs, parse_pairs' inverse: the fields that differ from their defaults
    (ETP's is the layout's TP), and always the micro-batch's two sizes (a missing one is derived from the row
    length, which need not give the layout's)."""
    default = {**layout_values(Layout(world_size=layout.world_size)), "etp": layout.tp}
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in layout_values(layout).items()
            if value != default[key] or key in ("max_tokens_per_gpu", "rows_per_microbatch")]


def layout_from_values(values: dict, world_size: int, seq_len: int) -> Layout:
    """A Layout from flat values; rows per micro-batch and max tokens per GPU each follow from the other."""
    if not isinstance(values, dict):
        raise InvalidLayout("a layout must be a mapping of layout keys to values")
    typed = {key: layout_value(key, raw) for key, raw in values.items()}
    cp = typed.get("cp", 1)
    if not isinstance(cp, int) or cp < 1:
        raise InvalidLayout(f"cp must be a positive integer, got {cp!r}")
    text = typed.get(LAYOUT_STRING_FIELD)
    if isinstance(text, str) and "vpp" not in typed and isinstance(typed.get("pp", 1), int) and typed.get("pp", 1) >= 1:
        try:   # as Megatron does: the layout string's stages over PP set the virtual stages
            typed["vpp"] = vpp_of(text, typed.get("pp", 1))
        except InvalidPipelineLayout as e:
            raise InvalidLayout(str(e)) from None
    if "max_tokens_per_gpu" not in typed:
        typed["max_tokens_per_gpu"] = max_tokens_per_gpu(typed.get("rows_per_microbatch", 1), cp, seq_len)
    if "rows_per_microbatch" not in typed:
        typed["rows_per_microbatch"] = rows_per_microbatch(typed["max_tokens_per_gpu"], cp, seq_len)
    return Layout(world_size=world_size, **typed)


def layout_values(layout: Layout) -> dict:
    """Flat JSON-able values of every field but world_size (recompute_modules joined by commas)."""
    return {key: ",".join(value) if isinstance(value, tuple) else value
            for key in LAYOUT_KEYS for value in [getattr(layout, key)]}


def layout_from_stored(values: dict) -> Layout:
    """A Layout from `layout_values` plus world_size, as stored in a study or a result file."""
    values = dict(values)
    world_size = values.pop("world_size", None)
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise InvalidLayout(f"a stored layout needs an integer world_size, got {_short(world_size)}")
    return Layout(world_size=world_size, **{key: text_layout_value(key, raw) for key, raw in values.items()})


# ---------------------------------------------------------------- a recipe's layout block

def recipe_block(layout: Layout) -> dict:
    """The fields of a recipe's `layout` group that describe the layout (the recipe adds its prose)."""
    if layout.recompute_granularity is None:
        recompute = None
    else:
        recompute = {"granularity": layout.recompute_granularity, "method": layout.recompute_method,
                     "num_layers": layout.recompute_num_layers}
        if layout.recompute_granularity == "selective":
            recompute["modules"] = list(layout.recompute_modules) or None
    offload = None
    if layout.offloaded:
        offload = {"optimizer_fraction": float(layout.optimizer_offload_fraction),
                   "overlap_d2h_h2d": layout.overlap_d2h_h2d}
    block = {"tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep,
             "etp": layout.etp, "dp": layout.dp, "sequence_parallel": layout.sequence_parallel,
             # Megatron's uneven pipeline split (the first and last stages' layers); null: the even split.
             "layer_split": split_block(layout),
             "max_tokens_per_gpu": layout.max_tokens_per_gpu, "rows_per_microbatch": layout.rows_per_microbatch,
             "recompute": recompute, "offload": offload, "dispatcher": layout.dispatcher}
    if layout.exp_avg_dtype != "fp32":
        block["exp_avg_dtype"] = layout.exp_avg_dtype
    if layout.overlap_moe_expert_parallel_comm:
        block[EP_OVERLAP_FIELD] = True
    return block


def layout_from_recipe_block(block: dict, world_size: int) -> Layout:
    """The Layout a recipe's `layout` group describes; its derived fields (dp, sequence_parallel) must agree."""
    if not isinstance(block, dict):
        raise InvalidLayout("the layout group must be a mapping")
    values = {}
    for key in ("tp", "pp", "vpp", "cp", "ep", "etp", "max_tokens_per_gpu", "rows_per_microbatch", "dispatcher"):
        if key not in block:
            raise InvalidLayout(f"missing field '{key}'")
        values[key] = block[key]
    for key in ("exp_avg_dtype", EP_OVERLAP_FIELD):
        if key in block:
            values[key] = block[key]
    split = block.get("layer_split")
    if split is not None:
        if not isinstance(split, dict) or set(split) - set(SPLIT_FIELDS):
            raise InvalidLayout(f"field 'layer_split' must be null or a mapping of {', '.join(SPLIT_FIELDS)}")
        values.update({key: split[key] for key in SPLIT_FIELDS if split.get(key) is not None})
    recompute = block.get("recompute")
    if recompute is not None:
        if not isinstance(recompute, dict):
            raise InvalidLayout("field 'recompute' must be a mapping or null")
        values["recompute_granularity"] = recompute.get("granularity")
        values["recompute_method"] = recompute.get("method")
        values["recompute_num_layers"] = recompute.get("num_layers")
        if recompute.get("modules") is not None:
            values["recompute_modules"] = recompute["modules"]
    offload = block.get("offload")
    if offload is not None:
        if not isinstance(offload, dict):
            raise InvalidLayout("field 'offload' must be a mapping or null")
        values["optimizer_offload_fraction"] = offload.get("optimizer_fraction")
        values["overlap_d2h_h2d"] = offload.get("overlap_d2h_h2d")
    layout = Layout(world_size=world_size, **{key: layout_value(key, raw) for key, raw in values.items()})
    dp = block.get("dp")
    if dp is not None and dp != layout.dp:
        raise InvalidLayout(f"field 'dp' is {dp!r}, but GPUs {world_size} / (TP {layout.tp} x PP {layout.pp} x "
                            f"CP {layout.cp}) = {layout.dp}")
    sp = block.get("sequence_parallel")
    if sp is not None and sp != layout.sequence_parallel:
        raise InvalidLayout(f"field 'sequence_parallel' is {sp!r}, but slime passes --sequence-parallel exactly "
                            f"when TP > 1 (TP {layout.tp})")
    return layout


# ---------------------------------------------------------------- Optuna parameters

def encode_recompute(granularity: str | None, method: str | None = None, num_layers: int | None = None,
                     modules: tuple[str, ...] = ()) -> str:
    """'none', 'full:block:1' or 'selective:core_attn+moe_act' (Megatron's default module when none given)."""
    if granularity == "full":
        return f"full:{method}:{num_layers}"
    if granularity == "selective":
        return "selective:" + "+".join(modules or ("core_attn",))
    return "none"


def decode_recompute(value: str) -> dict:
    if value == "none":
        return dict(recompute_granularity=None)
    kind, _, rest = value.partition(":")
    if kind == "full":
        method, _, k = rest.partition(":")
        return dict(recompute_granularity="full", recompute_method=method, recompute_num_layers=int(k))
    return dict(recompute_granularity="selective", recompute_modules=tuple(rest.split("+")))


def encode_offload(fraction: float, overlap: bool, moments: str = "fp32") -> str:
    """The optimizer's placement: '0' (on the GPU), '0:bf16' (bf16 moments), '0.5:overlap', '1'..."""
    if fraction == 0:
        return "0" if moments == "fp32" else f"0:{moments}"
    return f"{fraction:g}" + (":overlap" if overlap else "")


def decode_offload(value: str) -> dict:
    fraction, _, rest = value.partition(":")
    return dict(optimizer_offload_fraction=float(fraction), overlap_d2h_h2d=rest == "overlap",
                exp_avg_dtype=rest if rest in ("bf16",) else "fp32")


def to_optuna_params(layout: Layout) -> dict:
    return {
        "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep, "etp": layout.etp,
        "rows_per_microbatch": layout.rows_per_microbatch,
        "recompute": encode_recompute(layout.recompute_granularity, layout.recompute_method,
                                      layout.recompute_num_layers, layout.selective_modules),
        "offload": encode_offload(layout.optimizer_offload_fraction, layout.overlap_d2h_h2d, layout.exp_avg_dtype),
        "dispatcher": layout.dispatcher,
        # only for a split other than the even one: a space whose layers divide has no such parameter
        **({"pipeline_split": encode_split(layout.decoder_first_pipeline_num_layers,
                                           layout.decoder_last_pipeline_num_layers,
                                           layout.account_for_embedding_in_pipeline_split,
                                           layout.account_for_loss_in_pipeline_split)}
           if layout.split_set and layout.pipeline_model_parallel_layout is None else {}),
        # a parameter of its own, so studies whose pipeline_split choices predate layout strings still resume
        **({"pipeline_layout": layout.pipeline_model_parallel_layout}
           if layout.pipeline_model_parallel_layout is not None else {}),
        # only when set (the search space does not enumerate it; a study's older trials have no such parameter)
        **({EP_OVERLAP_FIELD: True} if layout.overlap_moe_expert_parallel_comm else {}),
    }


def from_optuna_params(params: dict, world_size: int, seq_len: int) -> Layout:
    """Raises InvalidLayout when the combination breaks a layout rule."""
    rows, cp = params["rows_per_microbatch"], params["cp"]
    return Layout(world_size, tp=params["tp"], pp=params["pp"], vpp=params["vpp"], cp=cp, ep=params["ep"],
                  etp=params["etp"], rows_per_microbatch=rows, max_tokens_per_gpu=max_tokens_per_gpu(rows, cp, seq_len),
                  dispatcher=params["dispatcher"], **decode_recompute(params["recompute"]),
                  **decode_offload(params["offload"]), **decode_split(params.get("pipeline_split", "even")),
                  **decode_pipeline_layout(params.get("pipeline_layout", NO_PIPELINE_LAYOUT)),
                  overlap_moe_expert_parallel_comm=bool(params.get(EP_OVERLAP_FIELD, False)))


def split_block(layout: Layout) -> dict | None:
    """A recipe's `layer_split`: Megatron's split arguments that are set, or None for the even split."""
    if layout.uneven:
        return {key: getattr(layout, key) for key in UNEVEN_FIELDS}
    if layout.pipeline_model_parallel_layout is not None:
        return {LAYOUT_STRING_FIELD: layout.pipeline_model_parallel_layout}
    if layout.split_set:
        return {key: getattr(layout, key) for key in ACCOUNT_FIELDS}
    return None


NO_PIPELINE_LAYOUT = "none"   # the Optuna `pipeline_layout` value of a layout without a layout string


def decode_pipeline_layout(value: str) -> dict:
    return {} if value == NO_PIPELINE_LAYOUT else {LAYOUT_STRING_FIELD: value}


def encode_split(first: int | None = None, last: int | None = None, embedding: bool = False,
                 loss: bool = False) -> str:
    """An Optuna categorical value: 'even'; 'FIRST:LAST' with an unset side left empty ('13:'); or 'E', 'L',
    'E+L' for the embedding/loss accounted as layers. (A layout string is the `pipeline_layout` parameter.)"""
    if embedding or loss:
        return "+".join(x for x, on in (("E", embedding), ("L", loss)) if on)
    if first is None and last is None:
        return "even"
    return f"{'' if first is None else first}:{'' if last is None else last}"


def decode_split(value: str) -> dict:
    if value == "even":
        return {}
    if ":" not in str(value):
        parts = str(value).split("+")
        return dict(account_for_embedding_in_pipeline_split="E" in parts, account_for_loss_in_pipeline_split="L" in parts)
    first, _, last = str(value).partition(":")
    return dict(decoder_first_pipeline_num_layers=int(first) if first else None,
                decoder_last_pipeline_num_layers=int(last) if last else None)


# ---------------------------------------------------------------- helpers

_KIND_WORDS = {"int": "an integer", "number": "a number", "bool": "true or false", "text": "a string",
               "modules": "a list of module names or a comma-separated string"}


def _check_key(key: str):
    if key not in LAYOUT_KEYS:
        raise InvalidLayout(f"unknown layout key {shown_name(key)}; known: {', '.join(LAYOUT_KEYS)}")


def _typed_kind(key: str) -> str:
    if key == "recompute_modules":
        return "modules"
    if key == "optimizer_offload_fraction":
        return "number"
    if key in _BOOL_KEYS:
        return "bool"
    if key in _TEXT_KEYS or key == "recompute_granularity":
        return "text"
    return "int"


def _integer(raw) -> int:
    if isinstance(raw, bool):
        raise TypeError
    if isinstance(raw, float):
        if not raw.is_integer():
            raise ValueError
        return int(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and len(raw.strip()) <= 30:
        return int(raw.strip())
    raise TypeError


def _text(raw) -> str:
    if not isinstance(raw, str):
        raise TypeError
    return raw.strip()


def _short(raw) -> str:
    return shown(raw)   # a short word or number, else its kind: a request's value is never echoed
