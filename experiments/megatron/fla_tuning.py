"""fla's Triton kernels tune themselves on their first call in a process: for each key (head counts, head dims, block
sizes, dtypes) Triton compiles and times every config a kernel lists, often 16 to 48, and keeps the fastest. On a
machine where no Gated DeltaNet kernel has run that is minutes, most of a first `tune profile` of a GDN model
(Triton keeps its choices on disk only once made there). The choices fla's autotuner made on a GPU type ship with
attune (fla_autotune_choices/<GPU name>.json beside this file, for the fla and Triton versions they were made
with); seeded into the autotuners before fla's first call, they leave a process to compile the one chosen config
of each key they cover. A key they do not cover, another fla or Triton, or another GPU tunes as before.

Recording: with ATTUNE_FLA_TUNING_RECORD=DIR set, a process that ran fla writes the choices it holds to
DIR/<pid>.json; `python -m experiments.megatron.fla_tuning merge DIR... --out FILE` joins them into a shipped file
(or one under ATTUNE_FLA_CHOICES_DIR, read instead of the shipped folder)."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

RECORD_ENV = "ATTUNE_FLA_TUNING_RECORD"
SHIPPED_DIR = Path(__file__).with_name("fla_autotune_choices")
CHOICES_ENV = "ATTUNE_FLA_CHOICES_DIR"   # a folder of one's own choices, read instead of the shipped ones
CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def choices_dir() -> Path:
    """Where the choices are read from: $ATTUNE_FLA_CHOICES_DIR where set, else the shipped folder."""
    return Path(os.environ[CHOICES_ENV]) if os.environ.get(CHOICES_ENV) else SHIPPED_DIR


def gpu_file_name(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3.json' (as torch.cuda.get_device_name says it)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", gpu_name).strip("_") + ".json"


def autotuners(prefix: str = "fla.") -> dict[str, object]:
    """Every Triton autotuner that the loaded modules under `prefix` hold, by module.attribute; a kernel wrapped
    in triton.heuristics is found through its .fn chain."""
    from triton.runtime.autotuner import Autotuner
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(prefix):
            continue
        for attr, value in list(vars(module).items()):
            for _ in range(4):   # heuristics(autotune(jit)) and the like
                if isinstance(value, Autotuner):
                    found.setdefault(f"{module_name}.{attr}", value)
                    break
                value = getattr(value, "fn", None)
                if value is None:
                    break
    return found


def _config_dict(config) -> dict:
    return {"kwargs": dict(config.kwargs), **{f: getattr(config, f, None) for f in CONFIG_FIELDS}}


def choices(prefix: str = "fla.") -> list[dict]:
    """The config each autotuner holds for each key it has seen (tuned, seeded or read from Triton's disk cache)."""
    return [{"kernel": name, "key": list(key), "config": _config_dict(config)}
            for name, tuner in sorted(autotuners(prefix).items())
            for key, config in tuner.cache.items()]


def versions() -> dict:
    import importlib.metadata as md
    import triton
    try:
        fla = md.version("fla-core")
    except md.PackageNotFoundError:
        import fla as fla_module
        fla = getattr(fla_module, "__version__", "?")
    return {"fla": fla, "triton": triton.__version__}


def seed(gpu_name: str, directory: Path | None = None, prefix: str = "fla.") -> dict:
    """Seed the loaded fla autotuners with the shipped choices for this GPU (or those under $ATTUNE_FLA_CHOICES_DIR);
    what it did, for the trial's notes."""
    path = (directory or choices_dir()) / gpu_file_name(gpu_name)
    if not path.exists():
        return {"seeded": 0, "why": f"no shipped fla tuning for {gpu_name}: fla tunes its kernels here"}
    shipped = json.loads(path.read_text())
    here = versions()
    if {k: shipped.get(k) for k in here} != here:
        return {"seeded": 0, "why": f"{path.name} was tuned with fla {shipped.get('fla')}, Triton "
                                    f"{shipped.get('triton')}; here fla {here['fla']}, Triton {here['triton']}"}
    from triton import Config
    tuners, seeded = autotuners(prefix), 0
    for choice in shipped["choices"]:
        tuner = tuners.get(choice["kernel"])
        key = tuple(choice["key"])
        if tuner is None or key in tuner.cache:
            continue
        c = choice["config"]
        tuner.cache[key] = Config(c["kwargs"], **{f: c[f] for f in CONFIG_FIELDS if c.get(f) is not None})
        seeded += 1
    return {"seeded": seeded, "of": len(shipped["choices"]),
            "from": f"{path.name} (tuned on {shipped.get('gpu')}, {shipped.get('measured')})"}


# What megatron-core's GatedDeltaNet calls from fla (megatron/core/ssm/gated_delta_net/common.py): imported before
# seeding, so their autotuners exist when the seeds are placed.
MEGATRON_FLA_MODULES = ("fla.modules.convolution", "fla.modules.l2norm", "fla.ops.gated_delta_rule")


def seed_for_megatron(gpu_name: str) -> dict:
    """seed() after importing what megatron's GDN layer and the profile's kernel timing call."""
    import importlib
    for name in MEGATRON_FLA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return seed(gpu_name)


def record(prefix: str = "fla.") -> Path | None:
    """With ATTUNE_FLA_TUNING_RECORD=DIR: write this process's choices to DIR/<pid>.json."""
    directory = os.environ.get(RECORD_ENV)
    if not directory:
        return None
    import torch
    path = Path(directory) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), **versions(),
                                "measured": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                                "choices": choices(prefix)}))
    return path


def merge(records: list[dict], source: str) -> dict:
    """One shipped file from recorded processes of one GPU, fla and Triton; a key seen twice keeps its first."""
    heads = {(r["gpu"], r["fla"], r["triton"]) for r in records}
    if len(heads) != 1:
        raise ValueError(f"records from more than one GPU or version: {sorted(heads)}")
    gpu, fla, triton = heads.pop()
    merged: dict[tuple, dict] = {}
    for r in records:
        for c in r["choices"]:
            merged.setdefault((c["kernel"], json.dumps(c["key"])), c)
    return {"about": "fla autotune choices, seeded by experiments/megatron/fla_tuning.py", "source": source,
            "gpu": gpu, "fla": fla, "triton": triton, "measured": max(r["measured"] for r in records),
            "choices": [merged[k] for k in sorted(merged)]}


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m experiments.megatron.fla_tuning")
    parser.add_argument("verb", choices=["merge"])
    parser.add_argument("dirs", nargs="+", help="folders of recorded <pid>.json files")
    parser.add_argument("--out", required=True)
    parser.add_argument("--source", default="", help="what ran to make the choices")
    args = parser.parse_args(argv)
    try:
        records = [json.loads(p.read_text()) for d in args.dirs for p in sorted(Path(d).glob("*.json"))]
        if not records:
            raise ValueError(f"no recorded choices under {', '.join(args.dirs)}")
        shipped = merge(records, args.source)
    except (ValueError, KeyError, TypeError) as e:   # json's decode error is a ValueError
        print(f"fla_tuning: {f'a record lacks the field {e}' if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(shipped, indent=1) + "\n")
    print(f"{args.out}: {len(shipped['choices'])} choices of {len({c['kernel'] for c in shipped['choices']})} "
          f"kernels from {len(records)} processes ({shipped['gpu']}, fla {shipped['fla']}, Triton {shipped['triton']})")
    if Path(args.out).name != gpu_file_name(shipped["gpu"]):
        print(f"fla_tuning: seeded only as {choices_dir() / gpu_file_name(shipped['gpu'])} (or "
              f"<{CHOICES_ENV}>/{gpu_file_name(shipped['gpu'])})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
