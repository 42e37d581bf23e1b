"""What lets the megatron runner's CUDA-minded code run on CPU tensors in the tests: patches, a tiny
Qwen3.6-like model with Gated DeltaNet layers, a 1-rank gloo process group, and a CPU Adam standing in
for megatron's DistributedOptimizer (which only wraps CUDA tensors)."""
from __future__ import annotations

import contextlib
import dataclasses
import warnings
from unittest import mock

import torch

VOCAB = 256


def cpu_patches(tracker, *, factories: bool = False):
    """Tensors megatron asks to be on 'cuda' made on the CPU, CUDA synchronisation a no-op, the CUDA
    RNG tracker's fork a no-op; `factories` also redirects torch.tensor/empty/ones/full (the
    optimizer and the training loop's own CUDA tensors)."""
    def on_cpu(fn):
        def make(*a, **k):
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return fn(*a, **k)
        return make

    stack = contextlib.ExitStack()
    names = ("zeros", "tensor", "empty", "ones", "full") if factories else ("zeros",)
    for name in names:
        stack.enter_context(mock.patch.object(torch, name, on_cpu(getattr(torch, name))))
    stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self))
    stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: "cpu"))
    stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
    stack.enter_context(mock.patch.object(tracker, "fork", lambda *a, **k: contextlib.nullcontext()))
    return stack


def tiny_qwen36_gdn(layers: int = 4):
    """Qwen3.6's first `layers` layers (3 Gated DeltaNet + 1 full attention per 4, all MoE) at toy
    width: 2 q/k and 4 value GDN heads (Qwen3.6's 1:2 ratio), 4 experts top-2 with a gated shared expert."""
    from cost_model.nouns.model_spec import load_model
    from experiments.megatron.model_run import trial_model

    return dataclasses.replace(trial_model(load_model("qwen3.6-35b-a3b"), layers), hidden_size=64,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                               num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                               vocab_size=VOCAB, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=8, linear_value_head_dim=8)


@contextlib.contextmanager
def one_rank(factories: bool = False):
    """A 1-rank gloo process group and megatron's parallel state (TP 1), CUDA calls made CPU-safe
    (see cpu_patches), torch.compile off as in the runner's workers (TORCHDYNAMO_DISABLE=1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    def fresh():  # megatron's process-wide MoE state (each trial on the GPU is a fresh process)
        destroy_moe_metrics_tracker()  # sized by the first model's layer count
        MoEAuxLossAutoScaler.main_loss_backward_scale = None  # shaped by the first schedule that ran

    fresh()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
        with warnings.catch_warnings(), cpu_patches(tensor_parallel.get_cuda_rng_tracker(), factories=factories), \
                mock.patch.object(torch._dynamo.config, "disable", True):
            warnings.simplefilter("ignore")
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        fresh()


class CpuAdam:
    """The optimizer interface the training loop uses (scale_loss, zero_grad, step -> (ok, grad norm,
    zeros)) over fp32 master copies of the parameters, gradients from DDP's main_grad, clip 1.0."""

    def __init__(self, chunks, lr: float):
        self.params = [p for c in chunks for p in c.parameters()]
        self.master = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.opt = torch.optim.Adam(self.master, lr=lr, betas=(0.9, 0.95))

    def scale_loss(self, loss):
        return loss

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        for m, p in zip(self.master, self.params):
            m.grad = p.main_grad.float().clone()
        norm = torch.nn.utils.clip_grad_norm_(self.master, 1.0)
        self.opt.step()
        with torch.no_grad():
            for m, p in zip(self.master, self.params):
                p.copy_(m)
        return True, float(norm), 0
