"""Published training-throughput rows (benchmarks/data/public-throughput.csv) as cost-model cases.

Each usable row becomes a `Measurement`: the `Case` the run was (catalog model, GPU, Workload,
Layout) with the published tokens/s per GPU and where it was published beside it. Rows the cost
model cannot represent (FSDP runs, VLMs, models outside the catalog, layouts Megatron's rules
reject, missing fields) come back with a one-line reason instead.

Mapping conventions (see `load_cases`): every public row is a Megatron-LM / Megatron-Bridge / NeMo
run, so framework='megatron'; the dispatcher is 'flex' when the notes name DeepEP or HybridEP; the
routing is 'balanced' when the notes say the router was force-balanced and 'natural' otherwise; peft
is 'lora' when the notes name LoRA or PEFT (a frozen base).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from pathlib import Path

import pandas as pd

from cost_model.nouns.case import Case
from cost_model.nouns.hardware import GpuSpec, HardwareError, load_gpu
from cost_model.nouns.model_spec import ModelSpec, catalog_names, load_model
from cost_model.nouns.workload import Workload, WorkloadError
from cost_model.nouns.layout import RECOMPUTE_MODULES, InvalidLayout, Layout
from cost_model.nouns.batching import max_tokens_per_gpu, rows_per_microbatch
from cost_model.predict import predict
from search_space.enumerate import divisors, pipeline_splits, selective_module_sets
from search_space.rules import violations
from cost_model.nouns.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "data" / "public-throughput.csv"
REFERENCES = ROOT / "tests" / "fixtures" / "reference_recipes"
REFERENCE_GROUP = "reference qwen3.6 h200"

# The image the public runs used: DeepEP/HybridEP present, the Qwen3.5 output-gate fix upstream.
STACK = Stack(output_gate_tp_fix=True)
# Rules that describe slime's data path, not a Megatron run: the public rows set MBS and GBS
# directly (rows_per_microbatch is derived from MBS; Megatron's own GBS % (MBS x DP) check held
# for every published run), and slime's --seq-length 4096 placeholder does not exist there.
IGNORED_RULES = frozenset({"rows_per_microbatch", "global_batch_vs_dp", "global_batch_divisible_by_dp",
                           "cp_divides_2048"})

# Same architecture under another name.
MODEL_ALIASES = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b"}
# Names the sources use for Megatron's --recompute-modules.
MODULE_ALIASES = {"shared_expert": "shared_experts", "shared_experts": "shared_experts", "mla_up": "mla_up_proj",
                  "layer_norm": "layernorm", "attn": "core_attn"}
# Modules Megatron-Bridge recomputes that the cost model has no term for: dropped with a note.
DROPPED_MODULES = ("gdn output-norm", "gdn output norm", "gdn")

LAYOUT_FIELDS = {"TP": "tp", "PP": "pp", "CP": "cp", "EP": "ep", "ETP": "etp", "VP": "vp", "VPP": "vp",
                 "MBS": "mbs", "GBS": "gbs"}


@dataclass
class Measurement:
    """A measured run: the Case it ran, what was measured and where it was published."""
    name: str                      # short unique label, e.g. r025-moonlight-16b-a3b-h100x16
    source: str
    case: Case
    measured_tokens_per_s_per_gpu: float
    group: str                     # rows of one group differ only in layout
    row: dict                      # the raw CSV row (or the recipe's data for reference cases)
    vlm: bool = False              # a VLM run: its images go through the model's vision encoder
    notes: tuple[str, ...] = ()    # what the mapping assumed or dropped
    index: int | None = None       # row index in the CSV (0-based, header excluded)


class Unusable(ValueError):
    """A row the cost model cannot represent; the message is the one-line reason."""


# ------------------------------------------------------------------------------------------ mapping
@lru_cache(maxsize=1)
def _model_index() -> dict[str, str]:
    index = {}
    for key in catalog_names():
        index[key.lower()] = key
        index[load_model(key).display_name.lower()] = key
    for alias, key in MODEL_ALIASES.items():
        index.setdefault(alias, key)
    return index


def map_model(name: str) -> ModelSpec:
    key = _model_index().get(name.strip().lower())
    if key is None:
        raise Unusable(f"model {name} is not in the catalog")
    return load_model(key)


def map_precision(text: str) -> str:
    t = text.strip()
    if t.upper() == "BF16":
        return "bf16"
    if t.upper().startswith("FP8"):
        return "fp8"
    raise Unusable(f"precision '{t}' is neither BF16 nor FP8")


def map_recompute(text: str) -> tuple[dict, list[str]]:
    """Layout keyword arguments for the recompute column, and notes on what was assumed."""
    t = text.strip()
    low = t.lower()
    notes: list[str] = []
    if low in ("", "none"):
        return {}, notes
    if low.startswith("full"):
        m = re.search(r"\b(uniform|block)\b", low)
        k = re.search(r"(\d+)\s*layers?", low)
        method = m.group(1) if m else "uniform"
        num = int(k.group(1)) if k else 1
        if not m or not k:
            notes.append(f"recompute '{t}' read as full {method} {num}")
        return dict(recompute_granularity="full", recompute_method=method, recompute_num_layers=num), notes
    if low.startswith("selective"):
        rest = t[len("selective"):].strip()
        if not rest:
            return dict(recompute_granularity="selective"), notes
        if not rest.startswith(":"):
            raise Unusable(f"recompute '{t}' is not a Megatron recompute setting")
        rest = rest[1:].strip()
        if rest.startswith("[]"):
            # Megatron-Bridge's control: selective granularity with no module recomputes nothing.
            notes.append("selective recompute with no modules (empty control) = no recompute")
            return {}, notes
        mods: list[str] = []
        for raw in rest.split(","):
            name = raw.strip()
            key = name.lower()
            if not key:
                continue
            if key in DROPPED_MODULES:
                notes.append(f"recompute module '{name}' has no cost-model term; dropped")
                continue
            key = MODULE_ALIASES.get(key, key)
            if key not in RECOMPUTE_MODULES:
                raise Unusable(f"recompute module '{name}' is not one of Megatron's ({', '.join(RECOMPUTE_MODULES)})")
            if key not in mods:
                mods.append(key)
        if not mods:
            notes.append(f"recompute '{t}': no modelled module left; read as no recompute")
            return {}, notes
        return dict(recompute_granularity="selective", recompute_modules=tuple(mods)), notes
    raise Unusable(f"recompute '{t}' is not a Megatron recompute setting")


_NATURAL = re.compile(r"\bnatural\b", re.I)
_BALANCED = re.compile(r"forc(?:e|ed)[\s-]+(?:(?:router|expert|load)\s+)?balanc|fake balanced gate", re.I)
_FLEX = re.compile(r"deepep|hybridep", re.I)
_ALLTOALL = re.compile(r"\balltoall\b|dispatcher\s+a2a\b|\ba2a\s+dispatcher", re.I)


_FULL_GRAPHS = re.compile(r"full[- ]iteration (?:CUDA graphs?|CG)|full (?:CUDA graphs?|CG)\b", re.I)
_NO_GRAPHS = re.compile(r"\bno CUDA graphs?\b", re.I)
_GRAPHS = re.compile(r"CUDA graphs?|\bCG\b", re.I)


def map_cuda_graphs(notes: str) -> str:
    """'full' for full-iteration graphs, 'partial' for graphs of some modules, 'none' when the notes say none or
    do not say."""
    if _FULL_GRAPHS.search(notes):
        return "full"
    if _NO_GRAPHS.search(notes):
        return "none"
    return "partial" if _GRAPHS.search(notes) else "none"


_LORA = re.compile(r"\blora\b|\bpeft\b", re.I)


def map_peft(notes: str) -> str:
    """'lora' for a LoRA/PEFT run (frozen base), 'none' otherwise."""
    return "lora" if _LORA.search(notes) else "none"


def map_routing(notes: str) -> str:
    if _NATURAL.search(notes):
        return "natural"
    return "balanced" if _BALANCED.search(notes) else "natural"


def map_dispatcher(notes: str) -> str:
    """flex when the notes name DeepEP or HybridEP, unless they name the alltoall dispatcher."""
    if _ALLTOALL.search(notes):
        return "alltoall"
    return "flex" if _FLEX.search(notes) else "alltoall"


def run_kind(notes: str) -> str:
    low = notes.lower()
    if "lora" in low or "peft" in low:
        kind = "peft"
    elif "sft" in low:
        kind = "sft-long-context" if "long-context" in low or "long context" in low else "sft"
    else:
        kind = "pretrain-long-context" if "long-context" in low or "long context" in low else "pretrain"
    return kind + ("-vlm" if is_vlm(notes) else "")


def is_vlm(notes: str) -> bool:
    return bool(re.search(r"\bVLM\b|\bimage|\bMedPix\b|\bDataComp\b", notes, re.I))


_IMAGE_SIDE = re.compile(r"\b(\d{2,5})\s*x\s*\1\b")


def map_images(notes: str) -> tuple[int, int, str | None]:
    """(images per row, image side in pixels, a mapping note) of a VLM row: one image per sample, as the
    Megatron-Bridge VLM recipes the rows name feed (MedPix and DataComp adapters, the mock VLM dataset); the
    side the notes state, else 256 for mock data (MockVLMSFTDataset's default) and 448 for real data (the
    cards' resize to 448x448, DataComp's max_pixels 448^2). (0, 448, None) for a text row."""
    if not is_vlm(notes):
        return 0, 448, None
    stated = _IMAGE_SIDE.search(notes)
    if stated:
        return 1, int(stated.group(1)), None
    side = 256 if re.search(r"\bmock\b", notes, re.I) else 448
    return 1, side, f"image size not stated: one {side}x{side} image per row ({'mock' if side == 256 else 'real'} data)"


def _fsdp_reason(row: dict) -> str | None:
    source, notes, fsdp = row["source"], row["notes"], row["fsdp"].strip()
    if "torchtitan" in source.lower() or "torchtitan" in notes.lower():
        return "FSDP not modelled (torchtitan FSDP2 run)"
    if "automodel" in source.lower() or "fsdp2" in notes.lower():
        return "FSDP not modelled (NeMo Automodel FSDP2 run)"
    if fsdp not in ("", "0"):
        return f"FSDP not modelled (FSDP {fsdp})"
    return None


def _unstated_fields(notes: str) -> set[str]:
    """Layout fields the notes say the source does not state ('PP/EP not stated')."""
    out = set()
    for m in re.finditer(r"((?:[A-Z]{2,3}/)*[A-Z]{2,3})\s+not\s+(?:stated|restated|given)", notes):
        for name in m.group(1).split("/"):
            if name in LAYOUT_FIELDS:
                out.add(LAYOUT_FIELDS[name])
    if re.search(r"layout\s+not\s+captured", notes, re.I):
        out.update({"tp", "pp", "ep"})
    return out


_PP_LAYOUT = re.compile(r"PP layout ([EtmL|()*\d]+)")


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    text = row[key].strip()
    if text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise Unusable(f"column {key} is not a number: '{text}'") from None
    if value != int(value) or value < 0:
        raise Unusable(f"column {key} is not a non-negative integer: '{text}'")
    return int(value)


def _published_run(row: dict) -> tuple[float, ModelSpec, str, GpuSpec]:
    """(tokens/s per GPU, model, precision, GPU) of a run the cost model can represent; Unusable otherwise."""
    tps_text = row["tokens_per_s_per_gpu"].strip()
    if not tps_text:
        raise Unusable("no tokens/s per GPU published" + (" (TFLOP/s only)" if row["tflops_per_gpu"].strip() else ""))
    measured = float(tps_text)
    reason = _fsdp_reason(row)   # the framework first: a torchtitan or Automodel run is not a Megatron row at all
    if reason:
        raise Unusable(reason)
    model = map_model(row["model"])
    precision = map_precision(row["precision"])
    try:
        gpu = load_gpu(row["gpu"])
    except HardwareError as e:
        raise Unusable(str(e)) from None
    return measured, model, precision, gpu


# Layout fields a row may leave out and still be predicted: searched over the values Megatron accepts (_unknowns).
SEARCHABLE_FIELDS = ("pp", "ep")
_STEP_MS = re.compile(r"\bstep\s+([\d.]+)\s*ms\b")


def _run_size(row: dict) -> tuple[int, int, int, set[str], list[str]]:
    """(seq_len, global batch, GPUs, the layout fields to search, notes), once the source states or implies
    them: a global batch left out is the one the published step time implies, when that is a whole number."""
    seq_len = _int(row, "seq_len")
    if not seq_len:
        raise Unusable("seq_len not stated")
    world = _int(row, "num_gpus")
    if not world:
        raise Unusable("num_gpus not stated")
    notes: list[str] = []
    gbs = _int(row, "gbs")
    if not gbs:
        gbs = _implied_global_batch(row, seq_len, world)
        notes.append(f"GBS not stated: {gbs}, the whole number of rows the published tokens/s x step time x "
                     f"GPUs / seq_len gives")
    unstated = {k for k in _unstated_fields(row["notes"]) if not row[k].strip()} - {"gbs"}   # gbs: implied above
    if "mbs" in unstated:   # Megatron-Bridge's default, and the only size a packed long-context row runs at
        notes.append("MBS not stated: 1, Megatron-Bridge's default")
        unstated.discard("mbs")
    if unstated - set(SEARCHABLE_FIELDS):
        raise Unusable(f"layout field(s) {', '.join(sorted(unstated))} not stated by the source")
    if all(not row[k].strip() for k in ("tp", "pp", "ep")):
        raise Unusable("parallel layout not stated")
    return seq_len, gbs, world, unstated, notes


def _implied_global_batch(row: dict, seq_len: int, world: int) -> int:
    """The rows per step a published step time and tokens/s imply (the run's own batch); Unusable unless it is a
    whole number to 2%."""
    step = _STEP_MS.search(row["notes"])
    if not step:
        raise Unusable("global batch (gbs) not stated")
    rows = float(row["tokens_per_s_per_gpu"]) * float(step.group(1)) / 1000 * world / seq_len
    whole = round(rows)
    if whole < 1 or abs(rows - whole) > 0.02 * whole:
        raise Unusable(f"global batch (gbs) not stated (the step time implies {rows:.2f} rows, not a whole number)")
    return whole


_EP_OVERLAP = re.compile(r"\bEP (?:comm )?overlap\b|\bA2A overlap\b", re.I)
_PP_SPLIT = re.compile(r"\b(\d+)/(\d+)(?:\s+language-layer)?\s+PP split\b")


def _layout_fields(row: dict, model: ModelSpec) -> tuple[dict, int, list[str]]:
    """The Layout keyword arguments the row states (rows_per_microbatch aside), its MBS, and mapping notes."""
    notes_text = row["notes"]
    mapping_notes: list[str] = []
    tp = _int(row, "tp", 1)
    values = dict(tp=tp, pp=_int(row, "pp", 1), cp=_int(row, "cp", 1), vpp=_int(row, "vp", 1) or 1)
    mbs = _int(row, "mbs", 1) or 1
    if model.is_moe:
        etp = _int(row, "etp")
        if etp is None and tp > 1:
            mapping_notes.append(f"ETP not stated: TP {tp}, Megatron's default")
        values.update(ep=_int(row, "ep", 1), etp=tp if etp is None else etp)
    else:
        values.update(ep=1, etp=tp)
    recompute, rc_notes = map_recompute(row["recompute"])
    values.update(recompute)
    mapping_notes += rc_notes
    moe_parallel = model.is_moe and values["ep"] * values["etp"] > 1
    values["dispatcher"] = map_dispatcher(notes_text) if moe_parallel else "alltoall"
    if re.search(r"\bSP off\b", notes_text):
        mapping_notes.append("SP off in the run; the cost model always uses SP at TP > 1")
    split = _PP_SPLIT.search(notes_text)
    if split and values["pp"] == 2:   # "16/24 language-layer PP split": the first and the last stage's layers
        values["decoder_first_pipeline_num_layers"] = int(split.group(1))
        values["decoder_last_pipeline_num_layers"] = int(split.group(2))
    stated = _PP_LAYOUT.search(notes_text)
    if stated:   # the source gives Megatron's --pipeline-model-parallel-layout ("PP layout Et|(tt|)*30L")
        values["pipeline_model_parallel_layout"] = stated.group(1)
    if re.search(r"BF16 optimizer states|reduced-precision optimizer moments", notes_text, re.I):
        values["exp_avg_dtype"] = "bf16"
    if _EP_OVERLAP.search(notes_text):   # Megatron's --overlap-moe-expert-parallel-comm
        values["overlap_moe_expert_parallel_comm"] = True
    return values, mbs, mapping_notes


def _layout(values: dict, mbs: int, world: int, workload: Workload) -> Layout:
    """The Layout of the stated fields; MBS becomes max tokens per GPU, then slime's rows per micro-batch."""
    cp = values["cp"]
    try:
        layout = Layout(world_size=world, max_tokens_per_gpu=max_tokens_per_gpu(mbs, cp, workload.seq_len),
                        rows_per_microbatch=mbs, **values)
        # The rows_per_microbatch rule is slime's binning; take the value it gives for this MBS.
        return layout.replace(rows_per_microbatch=rows_per_microbatch(layout.max_tokens_per_gpu, cp, workload.seq_len))
    except InvalidLayout as e:
        raise Unusable(f"invalid layout: {e}") from None


def row_to_case(row: dict, index: int) -> Measurement:
    """The Measurement of one CSV row; raises Unusable with a one-line reason."""
    measured, model, precision, gpu = _published_run(row)
    seq_len, gbs, world, searched_fields, size_notes = _run_size(row)
    values, mbs, mapping_notes = _layout_fields(row, model)
    mapping_notes = size_notes + mapping_notes
    notes_text = row["notes"]
    routing = map_routing(notes_text)
    images, image_size, image_note = map_images(notes_text)
    if images and model.vision is None:
        raise Unusable(f"VLM run: {model.display_name} has no vision encoder in the catalog")
    if image_note:
        mapping_notes.append(image_note)
    try:
        workload = Workload(seq_len=seq_len, global_batch=gbs, precision=precision, routing=routing,
                            framework="megatron", cuda_graphs=map_cuda_graphs(notes_text), peft=map_peft(notes_text),
                            images_per_row=images, image_size=image_size)
    except WorkloadError as e:
        raise Unusable(f"invalid layout: {e}") from None
    if model.is_moe and _int(row, "etp") is None and values["etp"] > 1 and (model.mlp_bias or model.expert_bias):
        # Megatron refuses biased experts at ETP > 1 ("Bias in Moe is only supported when ETP==1")
        mapping_notes.append(f"ETP not stated; {model.display_name}'s biased experts need ETP 1")
        values["etp"] = 1
    elif model.is_moe and _int(row, "etp") is None and world % (values["etp"] * values["ep"] * values["pp"]):
        # Megatron's default ETP (= TP) leaves no valid expert grid: the run must have set ETP 1
        mapping_notes.append(f"ETP not stated and TP {values['tp']} x EP {values['ep']} x PP {values['pp']} does not "
                             f"divide {world} GPUs: ETP 1")
        values["etp"] = 1
    values, searched = _search_unknowns(row, model, gpu, workload, values, mbs, world, searched_fields)
    mapping_notes += searched
    layout = _layout(values, mbs, world, workload)
    if layout.rows_per_microbatch != mbs:
        mapping_notes.append(f"MBS {mbs} read as {layout.rows_per_microbatch} rows per microbatch")
    found = [v for v in violations(layout, model, workload, STACK) if v.rule not in IGNORED_RULES]
    if found:
        raise Unusable(f"invalid layout {layout.label}: " + "; ".join(str(v) for v in found))

    group = " | ".join((row["source"], model.display_name, gpu.display_name, f"seq {seq_len}", f"gbs {gbs}",
                        row["precision"].strip(), routing, workload.framework, f"graphs {workload.cuda_graphs}",
                        f"peft {workload.peft}",
                        run_kind(notes_text)))
    return Measurement(name=f"r{index:03d}-{model.name}-{gpu.name}x{world}", source=row["source"],
                       case=Case(model, gpu, workload, layout, STACK), measured_tokens_per_s_per_gpu=measured,
                       group=group, row=dict(row), vlm=bool(images), notes=tuple(mapping_notes), index=index)


def _unknowns(row: dict, model: ModelSpec, values: dict, world: int = 1,
              fields: set[str] = frozenset()) -> list[tuple[str, list[dict]]]:
    """What the row leaves open that Megatron needs, each with the settings the source allows: the recompute
    when the column is empty (not 'none'); PP and EP where the source says it does not state them (every
    value that divides the GPUs, with each PP's pipeline splits); the pipeline split when the layers do not
    divide."""
    open_: list[tuple[str, list[dict]]] = []
    per_replica = world // (values["tp"] * values["cp"])
    if "pp" in fields:
        choices = [dict(pp=pp, **split) for pp in divisors(per_replica) if pp <= model.num_hidden_layers
                   for split in (pipeline_splits(model, pp, 1) or [{}])]
        open_.append(("pp", choices))
    if "ep" in fields and model.is_moe:
        open_.append(("ep", [dict(ep=ep) for ep in divisors(world) if model.num_experts % ep == 0]))
    if not row["recompute"].strip():
        choices = [dict(recompute_granularity=None)]
        choices += [dict(recompute_granularity="selective", recompute_modules=mods)
                    for mods in selective_module_sets(model)]
        choices.append(dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1))
        open_.append(("recompute", choices))
    pp, vpp = values["pp"], values["vpp"]
    if pp > 1 and "pipeline_model_parallel_layout" not in values and "pp" not in fields:
        splits = pipeline_splits(model, pp, vpp)
        if splits != [{}] and splits:
            open_.append(("pipeline split", splits))
    return open_


def _search_unknowns(row: dict, model: ModelSpec, gpu: GpuSpec, workload: Workload, values: dict, mbs: int,
                     world: int, fields: set[str] = frozenset()) -> tuple[dict, list[str]]:
    """The row's open settings searched, not assumed: of every combination the source allows, the one the cost
    model (default constants) predicts fastest among those predicted to fit, as a tuned run would have chosen;
    the note says what was chosen. The published figure is not looked at."""
    open_ = _unknowns(row, model, values, world, fields)
    if not open_:
        return values, []
    best = None
    for combo in product(*(choices for _, choices in open_)):
        trial = dict(values)
        for choice in combo:
            trial.update(choice)
        try:
            layout = _layout(trial, mbs, world, workload)
        except Unusable:
            continue
        if [v for v in violations(layout, model, workload, STACK) if v.rule not in IGNORED_RULES]:
            continue
        p = predict(model, gpu, workload, layout)
        score = (p.under_limit, p.tokens_per_s_per_gpu)   # the point prediction: these runs ran
        if best is None or score > best[0]:
            best = (score, trial, layout)
    if best is None:
        return values, []
    (fits, _), trial, layout = best
    what = []
    for name, _ in open_:
        if name == "recompute":
            what.append(f"recompute {layout.recompute_label}")
        elif name == "pp":
            what.append(f"PP {layout.label.split()[1][2:]}")
        elif name == "ep":
            what.append(f"EP {layout.ep}")
        else:
            what.append(f"pipeline split {layout.label.split()[1]}")
    n = 1
    for _, choices in open_:
        n *= len(choices)
    verdict = "predicted fastest that fits" if fits else "none predicted to fit; the fastest"
    return trial, [f"not stated by the source, searched: {', '.join(what)} ({verdict} of {n} it allows)"]


def read_rows(csv_path: str | Path = DEFAULT) -> list[dict]:
    """The CSV's rows as {column: text}, an empty cell as ''."""
    return pd.read_csv(csv_path, dtype=str, keep_default_na=False, encoding="utf-8").to_dict("records")


def load_cases(csv_path: str | Path = DEFAULT) -> tuple[list[Measurement], list[tuple[dict, str]]]:
    """The usable rows of the CSV as Measurements, and each unusable row with a one-line reason."""
    cases: list[Measurement] = []
    unusable: list[tuple[dict, str]] = []
    for i, row in enumerate(read_rows(csv_path)):
        try:
            cases.append(row_to_case(row, i))
        except Unusable as e:
            unusable.append((row, str(e)))
    return cases, unusable


def reference_cases() -> list[Measurement]:
    """The two measured reference recipes (slime on 8 x H200) as Measurements."""
    from recipes.recipe import load_recipe

    out = []
    for path in sorted(REFERENCES.glob("*.yaml")):
        r = load_recipe(path)
        out.append(Measurement(name=f"ref-{path.stem}", source=str(path.relative_to(ROOT)), case=r.case,
                               measured_tokens_per_s_per_gpu=float(r.data["result"]["tokens_per_s_per_gpu"]),
                               group=REFERENCE_GROUP, row=r.data))
    return out
