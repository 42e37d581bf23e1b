"""The `megatron` trial runner: N real training steps of a layout with megatron-core on local GPUs.

One process per GPU (torch.multiprocessing spawn, or a Ray placement group with one actor per GPU
when `ray` is importable and asked for; both run the same worker), NCCL (NVLS off),
`parallel_state.initialize_model_parallel(tp, pp, vpp, cp, ep, etp)`, a GPTModel built from the
catalog ModelSpec through TransformerConfig, megatron's DDP + distributed optimizer (Adam,
lr 1e-5), fixed seeds, synthetic (or given) token rows. Step times are measured with
torch.cuda.synchronize + perf_counter; failures are classified (cuda_oom, host_oom, nccl_timeout,
hang, crash, invalid_config) and are results, not exceptions.

What runs is recorded, never silently changed:
- the model actually trained (`model_run.trial_model`): truncated to `layers` layers (explicit, or
  the largest count the cost model predicts to fit the local GPUs); for Qwen3.5/3.6/Next its Gated
  DeltaNet layers are megatron-core's GatedDeltaNet in the model's own layer pattern (gdn.py: fla's
  chunk_gated_delta_rule, with its TileLang backend on Hopper, or megatron's torch gated delta rule
  without fla; details["kernels"]["linear_attention"] says which ran), or full attention when
  `replace_gdn` asks for it; MTP layers are not built. Predictions for comparison must use this model.
- the environment: the workers run with the recipe's allocator setting (PYTORCH_CUDA_ALLOC_CONF from
  recipes.slime_command.slime_env; a user-set value wins), recorded in details["env"];
- memory per rank (memory.py): the allocator's peaks and the device-level peak (largest `total - free`
  after each step); the result's peak_memory_gib is the device-level one (details["peak_memory_basis"]);
  a CUDA OOM's message figures are parsed into details["oom_per_rank"];
- the initial weights: by default each rank draws its own (megatron's GPU initialisation); with
  `cpu_init` every layout starts from the same full model (dense weights drawn whole and sliced, as
  megatron's CPU initialisation does; experts drawn by global expert index, see
  same_weights.init_experts_cpu; Gated DeltaNet weights drawn whole and sliced per in_proj/conv1d
  section, see same_weights.init_gdn_cpu; the generator reseeded per global layer, so PP and VPP
  splits agree, see same_weights.seeded_layer), which convergence arms need;
- the backend (te / torch-native / local, see torch_native.py) and the kernels that ran; the
  optimizer actually built (precision-aware needs TE's FusedAdam); a global batch scaled down to fit
  the trial's time budget.

Modules: runner (MegatronRunner: plan, launch, summary), model_run (the model a trial trains),
config (TransformerConfig arguments), train_loop (one rank's training), memory (its memory figures),
worker (one rank's process and its reports), launch (the process launchers and the monitor),
torch_native (the backend), gdn (Gated DeltaNet layers), same_weights, failures, data, suite, cli.

Standalone (GPU machine):
    python -m experiments.megatron --model qwen3.6-35b-a3b --gpus 2 --layers 4 \
        --layout tp=1 ep=2 --steps 8 --seq-len 4096 --global-batch 16 --json
    python -m experiments.megatron --suite benchmarks/megatron_h200_suite.json --out results.jsonl
    python -m experiments.megatron --suite benchmarks/gdn_h200_suite.json --out gdn.jsonl  # real GDN layers

Nothing heavy is imported at package or runner import (no torch, megatron, ray or optuna): the parent
imports torch only to count GPUs and to spawn; megatron is imported in the workers.
"""
