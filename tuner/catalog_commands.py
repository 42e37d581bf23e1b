"""The catalog and hardware commands: `tune models`, `tune gpus` and `tune profile`."""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

from cost_model.nouns.hardware import all_gpus, load_gpu
from cost_model.nouns.model_spec import catalog_names, load_model
from tuner.options import writing_user_file


def cmd_models(args) -> int:
    rows = []
    for name in getattr(args, "model", None) or catalog_names():
        m = load_model(name)   # a config.json that does not load: ModelError, one line
        pc = m.params
        rows.append({"name": m.name, "display_name": m.display_name, "model_type": m.model_type,
                     "layers": m.num_hidden_layers, "hidden": m.hidden_size, "experts": m.num_experts,
                     "top_k": m.num_experts_per_tok, "total_params": pc.total, "active_params": pc.active,
                     "active_non_embedding": pc.active_non_embedding, "hf_repo": m.hf_repo})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<20}{'model':<22}{'layers':>7}{'hidden':>8}{'experts':>9}{'top-k':>6}"
          f"{'total':>10}{'active':>9}{'active-emb':>11}")
    for r in rows:
        print(f"{r['name']:<20}{r['display_name']:<22}{r['layers']:>7}{r['hidden']:>8}{r['experts']:>9}"
              f"{r['top_k']:>6}{r['total_params'] / 1e9:>9.2f}B{r['active_params'] / 1e9:>8.2f}B"
              f"{r['active_non_embedding'] / 1e9:>10.2f}B")
    source = "the files given" if getattr(args, "model", None) else "catalog: cost_model/catalog/models"
    print(f"parameter counts derived from each architecture ({source})")
    return 0


def cmd_gpus(args) -> int:
    from dataclasses import asdict

    from cost_model.profile import shipped_profile

    gpus = all_gpus()
    if args.json:
        rows = []
        for g in gpus:
            profile = shipped_profile(g.name)
            rows.append(asdict(g) | {"profile": profile.summary() if profile else None,
                                     "rates": "profile" if profile else "datasheet x constants.yaml efficiencies"})
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<7}{'bf16 TF':>9}{'fp8 TF':>9}{'HBM GB':>8}{'TB/s':>6}{'NVL dom':>8}{'NVL GB/s':>9}"
          f"{'net GB/s':>9}{'PCIe':>6}{'host GiB':>9}{'GPUs/node':>10}{'$/GPU-h':>8}  instance")
    for g in gpus:
        print(f"{g.name:<7}{g.bf16_tflops:>9,.0f}{g.fp8_tflops:>9,.0f}{g.memory_gb:>8,.0f}{g.hbm_tb_s:>6.2f}"
              f"{g.nvlink_domain:>8}{g.nvlink_gb_s:>9,.0f}{g.internode_gb_s:>9,.0f}{g.pcie_gb_s:>6,.0f}"
              f"{g.host_memory_gib_per_node:>9,.0f}{g.gpus_per_node:>10}{g.usd_per_gpu_hour:>8.2f}  {g.instance}")
    for g in gpus:
        profile = shipped_profile(g.name)
        if profile:
            f = profile.summary()
            print(f"{g.name}: {f['provenance']} profile ({f['device']}, {f['date']}): bf16 GEMM 8192^3 "
                  f"{f['gemm_bf16_8192_tflops']:,.0f} TFLOP/s, HBM copy {f['hbm_copy_tb_s']} TB/s, "
                  f"all-to-all {f.get('all_to_all_busbw_gb_s_at_256MB', '-')} GB/s at 256 MiB, H2D {f['h2d_gb_s']} GB/s"
                  + (f"; megatron runner's components: {f['runner_components']}" if f.get("runner_components") else ""))
        else:
            print(f"{g.name}: no profile; datasheet peaks x the efficiency curves of constants.yaml")
    print("catalog figures from datasheets and cloud price lists; `tune gpus --json` gives the source of each")
    return 0


def cmd_profile(args) -> int:
    from experiments.checks.hardware_profile import check_profile_target, report_written, run_profile

    if args.out:   # before minutes of measuring
        check_profile_target(args.out)
    if args.derive:
        return _derive(args)

    model = load_model(args.model) if args.model else None
    builds = model is not None and not args.quick and _has_megatron()
    batches = (1,)   # the profile's kernel section runs fla's GDN kernel at batch 1; its builds at their rows
    if builds:
        from experiments.checks.runner_components import gdn_kernel_batches, start_builds_ahead
        batches = tuple(sorted({1, *gdn_kernel_batches(model)}))
    with tempfile.TemporaryDirectory() as tmp:
        ahead = []
        # the builds' process imports while the profile's timed sections run (it touches no GPU until its plan)
        start = (lambda: ahead.append(start_builds_ahead(args.model, Path(tmp) / "builds.jsonl"))) if builds else None
        try:
            # NoGpuError without torch or a GPU
            profile = run_profile(model, quick=args.quick, gpu_shared=start, kernel_batches=batches)
            if model is not None and not args.quick:
                _runner_components(profile, args.model, ahead[0] if ahead else None)
        finally:
            for a in ahead:
                a.close()
    with writing_user_file(args.out or "the profile file"):
        if args.json:
            with contextlib.redirect_stdout(sys.stderr):   # stdout holds the JSON object alone
                path = report_written(profile, args.out)
            print(json.dumps({"profile": str(path), "gpu_type": profile.get("gpu_type"),
                              "device": profile.get("device"), "count": profile.get("count"),
                              "sections": sorted(k for k, v in profile.items() if isinstance(v, (list, dict)))}))
        else:
            report_written(profile, args.out)
    return 0


def _has_megatron() -> bool:
    import importlib.util
    return importlib.util.find_spec("megatron") is not None


def _runner_components(profile: dict, model: str, ahead=None) -> None:
    """The megatron runner's step components for `model` (experiments.checks.runner_components), which price
    `--backend megatron` trials; needs megatron-core (make setup-test installs it). `ahead`: its builds' process,
    started during the profile."""
    if not _has_megatron():
        profile.setdefault("notes", []).append("runner_components not measured: megatron-core is not installed "
                                               "(pip install megatron-core, or make setup-test)")
        print("runner components not measured: install megatron-core (make setup-test) to price the megatron "
              "runner from them", file=sys.stderr)
        return
    from experiments.checks.runner_components import measure_models
    profile["runner_components"] = measure_models([model], log=lambda s: print(s, file=sys.stderr), ahead=ahead)


def _derive(args) -> int:
    """A profile for another GPU type, derived from the shipped measured one."""
    from cost_model.derive_profile import derive_profile
    from cost_model.profile import ProfileError, shipped_profile
    from experiments.checks.hardware_profile import write_profile

    source, target = load_gpu(args.source), load_gpu(args.derive)
    measured = shipped_profile(source.name)
    if measured is None:
        raise ProfileError(f"no shipped profile for {source.name} to derive from")
    shipped_target = shipped_profile(target.name)
    calibrated = ((shipped_target.raw.get("runner_components") or {}).get("derived")
                  if shipped_target is not None and shipped_target.provenance == "derived" else None)
    derived = derive_profile(measured.raw, source, target, calibrated)
    out = Path(args.out or f"profile-{target.name}.yaml")
    with writing_user_file(out):   # write_profile refuses a path a profile may not replace
        write_profile(derived, out)
    if args.json:
        print(json.dumps({"profile": str(out), "gpu_type": target.name, "derived_from": source.name}))
    else:
        print(f"derived profile for {target.display_name} written to {out}")
    return 0
