"""Every flag of every slime command attune generates is one slime and Megatron-LM accept (issue 14, point 3).

The table of what they accept, tests/data/slime_megatron_args.json, is extracted from their sources by
tests/data/make_slime_args.py (ast, nothing imported): THUDM/slime at 624b824 and NVIDIA/Megatron-LM at the
commit slime's docker/Dockerfile pins (1dcf0da), with slime's docker/patch/latest/megatron*.patch applied.
slime parses Megatron's arguments with `parse_known_args` (ignore_unknown_args=True), so a flag neither knows is
dropped without a word: nothing at run time would catch it.

The commands checked:
* recipe:    the `run` of each reference recipe (benchmarks.public_data.reference_cases);
* exported:  the `run` of the recipes `tune export` writes for the default study (Qwen3.6-35B-A3B on 8 x H200,
             default workload): the 10 layouts predicted fastest, and the fastest with each of offload (partial,
             overlapped), PP with VPP, CP, TP with SP, selective / no recompute, flex / alltoall, bf16 moments;
* runner:    the argument list SlimeRunner submits (SlimeRunner.command(spec).argv, no Ray cluster needed: a stub
             client), for a few of those layouts, with MODEL_ARGS from slime's script and given as a list;
* model_args: search_space.megatron_args.model_args of every catalog model (what the runner passes as MODEL_ARGS
             when slime has no scripts/models script for the model).
`${MODEL_ARGS[@]}` (slime's scripts' own flags) is not expanded; a value that is a shell variable ("$HF_CKPT")
may be anything. The `--sglang-*` / `--router-*` options slime copies from SGLang's ServerArgs and sglang_router's
RouterArgs are not in the table (they live in those packages): none is generated, and one would be reported.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

DATA = Path(__file__).parent / "data" / "slime_megatron_args.json"
ARGS = json.loads(DATA.read_text())
OPTIONS: dict[str, dict] = ARGS["options"]
DEPRECATED: dict[str, str] = ARGS["deprecated"]
KINDS = ("recipe", "exported", "runner", "model_args")

# Words that are neither slime's nor Megatron's flags, the command kinds they may appear in, and why. Nothing
# else is exempt.
ALLOWED = {
    "--async": ({"recipe", "exported"},
                "the leaderboard recipe format's shorthand `python3 -m <slime entry module> --async`: it names "
                "slime's asynchronous entry (train_async.py), it is no flag; slime has no --async option"),
}

# What the project generates today that it should not: (kind, flag) -> reason. Each is a strict xfail below
# (an XPASS fails: remove the entry once the generation is fixed); the other tests skip exactly these.
KNOWN_ISSUES: dict = {}   # none left: exported recipes name DeepEP with --moe-flex-dispatcher-backend since issue 14


MODEL = "qwen3.6-35b-a3b"
TOP = 10
VARIED = {
    "offload": lambda l: l.offloaded,
    "full offload": lambda l: l.optimizer_offload_fraction == 1,
    "partial offload": lambda l: 0 < l.optimizer_offload_fraction < 1,
    "offload overlap": lambda l: l.overlap_d2h_h2d,
    "pp + vpp": lambda l: l.pp > 1 and l.vpp > 1,
    "cp": lambda l: l.cp > 1,
    "tp + sp": lambda l: l.tp > 1 and l.sequence_parallel,
    "etp": lambda l: l.etp > 1,
    "selective recompute": lambda l: l.recompute_granularity == "selective",
    "no recompute": lambda l: l.recompute_granularity is None,
    "flex": lambda l: l.dispatcher == "flex",
    "alltoall": lambda l: l.dispatcher != "flex",
    "bf16 moments": lambda l: l.exp_avg_dtype != "fp32",
}
RUNNER_LAYOUTS = ("flex", "offload overlap", "pp + vpp", "selective recompute", "cp", "tp + sp", "alltoall")


@dataclass(frozen=True)
class Command:
    kind: str
    name: str
    words: tuple[str, ...]     # the words after the python entry


# ------------------------------------------------------------------------------------------------ parsing
PYTHON = re.compile(r"(?:.*/)?python[0-9.]*")
ARRAY = re.compile(r"\$\{\w+\[[@*]\]\}")          # ${MODEL_ARGS[@]}: slime's script's flags, not expanded here


def after_entry(words: list[str]) -> tuple[str, ...]:
    """The words after `python3 -m MODULE` / `python3 SCRIPT`."""
    for i, word in enumerate(words):
        if PYTHON.fullmatch(word):
            return tuple(words[i + 3:] if words[i + 1:i + 2] == ["-m"] else words[i + 2:])
    raise AssertionError(f"no python entry in {words[:6]}")


def run_words(run: str) -> tuple[str, ...]:
    """A recipe's `run` text (comments, exports, a blank line, then the command) as the command's words."""
    lines = [ln for ln in run.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "export "))]
    text = re.sub(r"<[^<>\n]*>", lambda m: m.group(0).replace(" ", "_"), "\n".join(lines).replace("\\\n", " "))
    return after_entry(shlex.split(text))


def pairs(words) -> list[tuple[str, list[str]]]:
    """(flag, its values) in order; a word before any flag is paired with ''."""
    out: list[tuple[str, list[str]]] = []
    current = None
    for word in words:
        if ARRAY.fullmatch(word):
            current = None
        elif word.startswith("--"):
            flag, eq, value = word.partition("=")
            current = (flag, [value] if eq else [])
            out.append(current)
        elif current is None:
            out.append(("", [word]))
        else:
            current[1].append(word)
    return out


def is_shell(value: str) -> bool:
    return value.startswith("$")


# ------------------------------------------------------------------------------------------------ commands
def reference_commands() -> list[Command]:
    from benchmarks.public_data import reference_cases

    return [Command("recipe", f"{m.source} run", run_words(m.row["run"])) for m in reference_cases()]


def chosen_layouts(scored) -> dict[str, object]:
    """name -> layout: the TOP predicted fastest ('top 1'...), then the fastest with each VARIED feature."""
    ranked = [l for l, _ in sorted(scored, key=lambda lp: -lp[1].tokens_per_s_per_gpu)]
    chosen = {f"top {i + 1}": l for i, l in enumerate(ranked[:TOP])}
    for name, wanted in VARIED.items():
        found = next((l for l in ranked if wanted(l)), None)
        if found is not None:
            chosen[name] = found
    return chosen


def exported_commands(config, layouts: dict, out: Path) -> list[Command]:
    """Each layout's recipe as `tune export` writes it (tuner.export.export_rows), its `run` read back."""
    from tuner.export import export_rows

    names: dict[object, list[str]] = {}
    for name, layout in layouts.items():
        names.setdefault(layout, []).append(name)
    rows = [SimpleNamespace(layout=l, number=i, kind="predicted") for i, l in enumerate(names)]
    paths = export_rows(rows, config, out)
    return [Command("exported", f"{', '.join(n)}: {l.long_label}", run_words(yaml.safe_load(p.read_text())["run"]))
            for (l, n), p in zip(names.items(), paths)]


class _NoClient:
    def list_jobs(self):
        return []


def runner_commands(config, layouts: dict, slime_dir: str) -> list[Command]:
    """The argument list SlimeRunner submits for some layouts; MODEL_ARGS from slime's script, and as a list."""
    from cost_model.nouns.case import Case
    from experiments.runner import TrialSpec
    from experiments.slime.cluster import ClusterConfig
    from experiments.slime.runner import SlimeRunner
    from search_space.megatron_args import model_args

    cluster = ClusterConfig(ray_address="127.0.0.1:1", slime_dir=slime_dir, hf_checkpoint="/ckpt/hf",
                            torch_dist="/ckpt/dist", sft_data="/data/rows.jsonl", profile_dir="/prof")
    runners = {"script": SlimeRunner(cluster, client=_NoClient()),
               "list": SlimeRunner(cluster, client=_NoClient(), model_args=model_args(config.model))}
    out = []
    for name in RUNNER_LAYOUTS:
        layout = layouts[name]
        for how, runner in runners.items():
            argv = runner.command(TrialSpec(Case(config.model, config.gpu, config.workload, layout))).argv
            out.append(Command("runner", f"{name} ({layout.long_label}), MODEL_ARGS from {how}", after_entry(argv)))
    return out


def model_args_commands() -> list[Command]:
    from cost_model.nouns.model_spec import catalog_names, load_model
    from search_space.megatron_args import model_args

    return [Command("model_args", f"model_args({name})", tuple(model_args(load_model(name)))) for name in catalog_names()]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict:
    from cost_model.nouns.hardware import load_gpu
    from cost_model.nouns.model_spec import load_model
    from cost_model.nouns.workload import Workload
    from tuner.study import StudyConfig
    from tuner.study_commands import score_space

    config = StudyConfig(load_model(MODEL), load_gpu("h200"), 8, Workload())
    layouts = chosen_layouts(score_space(config))
    commands = (reference_commands() + exported_commands(config, layouts, tmp_path_factory.mktemp("export"))
                + runner_commands(config, layouts, str(tmp_path_factory.mktemp("slime")))
                + model_args_commands())
    return {"layouts": layouts, "commands": commands}


def of_kind(generated, kind: str) -> list[Command]:
    return [c for c in generated["commands"] if c.kind == kind]


# ------------------------------------------------------------------------------------------------ checks
def unknown_flags(cmd: Command) -> list[str]:
    """Flags neither slime nor Megatron has (ALLOWED ones where allowed, valueless, and KNOWN_ISSUES aside)."""
    out = []
    for flag, values in pairs(cmd.words):
        if flag in OPTIONS or (cmd.kind, flag) in KNOWN_ISSUES:
            continue
        if flag in ALLOWED and cmd.kind in ALLOWED[flag][0]:
            out += [f"{flag} {values} (it takes no value)"] if values else []
        else:
            out.append(flag or f"(a value before any flag: {values[0]})")
    return out


def value_count_problem(flag: str, values: list[str]) -> str | None:
    option = OPTIONS[flag]
    n, nargs = len(values), option["nargs"]
    if not option["takes_value"]:
        return f"{flag} takes no value, given {values}" if n else None
    ok = {None: n == 1, "?": n <= 1, "+": n >= 1, "*": True}.get(nargs, n == nargs)
    return None if ok else f"{flag} takes {nargs if nargs is not None else 1} value(s), given {values}"


def choice_problem(flag: str, values: list[str]) -> str | None:
    choices = OPTIONS[flag]["choices"]
    if choices is None:
        return None
    bad = [v for v in values if not is_shell(v) and v not in {str(c) for c in choices}]
    return f"{flag} {bad} not among {choices}" if bad else None


def problems(generated, kind: str, check) -> list[str]:
    out = []
    for cmd in of_kind(generated, kind):
        for flag, values in pairs(cmd.words):
            if flag in OPTIONS and (cmd.kind, flag) not in KNOWN_ISSUES:
                problem = check(flag, values)
                if problem:
                    out.append(f"{cmd.name}: {problem}")
    return out


# ------------------------------------------------------------------------------------------------ tests
def test_the_table_is_slime_624b824_and_the_megatron_it_pins():
    assert ARGS["slime"]["commit"].startswith("624b824")
    assert ARGS["megatron"]["commit"].startswith("1dcf0da")
    assert ARGS["counts"]["slime"] > 150 and ARGS["counts"]["megatron"] > 600
    assert OPTIONS["--tensor-model-parallel-size"]["source"] == "megatron"
    assert OPTIONS["--debug-train-only"] == {**OPTIONS["--debug-train-only"], "source": "slime", "takes_value": False}
    assert OPTIONS["--moe-token-dispatcher-type"]["choices"] == ["allgather", "alltoall", "flex"]
    assert DEPRECATED["--moe-enable-deepep"].startswith("--moe-flex-dispatcher-backend")
    assert not ARGS["unresolved_add_argument"] and not ARGS["repeated_options"]["megatron"]


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
def test_many_flags_are_checked(generated):
    """The chosen layouts cover the features, so their flags are in the commands checked."""
    assert set(RUNNER_LAYOUTS) <= set(generated["layouts"])
    assert {k for k in KINDS if of_kind(generated, k)} == set(KINDS)
    assert len(of_kind(generated, "recipe")) >= 2 and len(of_kind(generated, "exported")) >= TOP + 5
    seen = {flag for cmd in generated["commands"] for flag, _ in pairs(cmd.words)}
    for flag in ("--optimizer-cpu-offload", "--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d",
                 "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "--sequence-parallel",
                 "--recompute-modules", "--recompute-method", "--moe-token-dispatcher-type", "--exp-avg-dtype",
                 "--custom-megatron-before-train-step-hook-path", "--moe-layer-freq", "--num-experts"):
        assert flag in seen, flag


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
@pytest.mark.parametrize("kind", KINDS)
def test_every_flag_is_one_slime_or_megatron_accepts(generated, kind):
    unknown = [f"{cmd.name}: {flag}" for cmd in of_kind(generated, kind) for flag in unknown_flags(cmd)]
    assert not unknown, "flags neither slime nor Megatron-LM accepts (slime would drop them silently):\n" + \
        "\n".join(unknown)


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
@pytest.mark.parametrize("kind", KINDS)
def test_flags_get_the_number_of_values_they_take(generated, kind):
    bad = problems(generated, kind, value_count_problem)
    assert not bad, "\n".join(bad)


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
@pytest.mark.parametrize("kind", KINDS)
def test_values_are_among_the_choices(generated, kind):
    bad = problems(generated, kind, choice_problem)
    assert not bad, "\n".join(bad)


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
@pytest.mark.parametrize("kind", KINDS)
def test_no_deprecated_option_is_generated(generated, kind):
    bad = [f"{cmd.name}: {flag} (deprecated: use {DEPRECATED[flag]})" for cmd in of_kind(generated, kind)
           for flag, _ in pairs(cmd.words) if flag in DEPRECATED and (kind, flag) not in KNOWN_ISSUES]
    assert not bad, "\n".join(bad)


@pytest.mark.slow   # the `generated` fixture scores the 8-GPU space (about 6-10 s)
def test_flex_layouts_name_deepep_with_the_current_flag(generated):
    """What the exported recipes once got wrong (issue 14): flex layouts name DeepEP with
    --moe-flex-dispatcher-backend deepep, never the deprecated --moe-enable-deepep."""
    flex = [cmd for kind in KINDS for cmd in of_kind(generated, kind)
            if ("--moe-token-dispatcher-type", ["flex"]) in pairs(cmd.words)]
    assert flex, "the generated commands cover the flex dispatcher"
    for cmd in flex:
        flags = dict((f, v) for f, v in pairs(cmd.words))
        assert flags.get("--moe-flex-dispatcher-backend") == ["deepep"] and "--moe-enable-deepep" not in flags, cmd.name


def test_the_parsing_of_a_command():
    run = ('# MODEL_ARGS: source <slime>/scripts/models/x.sh\nexport A=1\n\npython3 -m <slime entry module> --async \\\n'
           '  --actor-num-nodes 1 \\\n  ${MODEL_ARGS[@]} \\\n  --hf-checkpoint "$HF_CKPT" \\\n'
           '  --recompute-modules moe_act layernorm \\\n  --calculate-per-token-loss\n')
    assert pairs(run_words(run)) == [("--async", []), ("--actor-num-nodes", ["1"]), ("--hf-checkpoint", ["$HF_CKPT"]),
                                     ("--recompute-modules", ["moe_act", "layernorm"]),
                                     ("--calculate-per-token-loss", [])]
    assert after_entry(["/usr/bin/python3", "train_async.py", "--x"]) == ("--x",)
    assert value_count_problem("--calculate-per-token-loss", ["1"]) and value_count_problem("--lr", [])
    assert choice_problem("--attention-backend", ["flash"]) is None and choice_problem("--optimizer", ["lion"])
    assert choice_problem("--loss-mask-type", ["$MASK"]) is None
    assert unknown_flags(Command("recipe", "r", ("--async", "--lr", "1", "--bogus"))) == ["--bogus"]
    assert unknown_flags(Command("recipe", "r", ("--async", "1"))) == ["--async ['1'] (it takes no value)"]
    assert unknown_flags(Command("runner", "j", ("stray", "--async", "--lr", "1"))) == [
        "(a value before any flag: stray)", "--async"]
