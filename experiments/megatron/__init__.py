"""The `megatron` trial runner: N real training steps of a layout with megatron-core on local GPUs.

One process per GPU (torch.multiprocessing spawn, or a Ray placement group with one actor per GPU
when `ray` is importable and asked for; both run the same worker), NCCL (NVLS off),
`parallel_state.initialize_model_parallel(tp, pp, vpp, cp, ep, etp)`, a GPTModel built from the
catalog ModelSpec through TransformerConfig, megatron's DDP + distributed optimizer (Adam,
lr 1e-5), fixed seeds, synthetic (or given) token rows. Step times are measured with
torch.cuda.synchronize + perf_counter; failures are classified (cuda_oom, host_oom, nccl_timeout,
hang, crash, invalid_config) and are results, not exceptions.

What runs is recorded, never silently changed: the model actually trained (model_run.trial_model: the
first `layers` layers, given or the most predicted to fit; Gated DeltaNet as megatron-core's GatedDeltaNet
(gdn.py) or full attention when `replace_gdn` asks; no MTP layers; predictions for comparison must use this
model); the workers' environment (the recipe's PYTORCH_CUDA_ALLOC_CONF unless the user set one,
details["env"]); memory per rank (memory.py: the result's peak is the device-level one, an OOM's figures in
details["oom_per_rank"]); the initial weights (each rank's own, or with `cpu_init` one model for every layout,
same_weights.py, which convergence arms need); the backend and kernels that ran (torch_native.py,
details["kernels"]), the optimizer built, and a global batch scaled down to the trial's time budget.

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
