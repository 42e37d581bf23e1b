"""TEST DOUBLE for slime's training entry (`train.py`): not slime, no model, no GPU.

It takes slime's command line (parse_known_args of the few flags it needs; every other flag is ignored, as
slime's own parser ignores unknown ones), and then behaves like a slime `--debug-train-only` run on a Ray
cluster, printing its lines in slime's exact formats (THUDM/slime @624b824):

- the logger format of `slime/observability/logging_utils.py:21` (`[%(asctime)s] %(filename)s:%(lineno)d -
  %(message)s`, datefmt `%Y-%m-%d %H:%M:%S`);
- `step {accumulated_step_id}: {log_dict}` as `slime/backends/megatron_utils/model.py:918` prints it, with its keys;
- `perf {rollout_id}: {log_dict}` as `slime/observability/train_metric_utils.py:401` (`log_perf_data`) prints it,
  with perf/<timer>_time keys, actor_train_tok_per_s, step_time = train_wait + train, wait_time_ratio;
- `Timer actor_train end (elapsed: {elapsed_time:.1f}s)` as `slime/observability/timer.py:32`.

Like slime it loads `--rollout-function-path` and `--custom-megatron-before-train-step-hook-path` by dotted path
(importlib, `slime/utils/misc.py:load_function`) from PYTHONPATH (the runner's job working directory): the
rollout function in a RolloutManager actor, called once per rollout with `--prompt-data` and a stand-in Sample
class; the hook in a MegatronTrainRayActor actor (so its output carries Ray's `(MegatronTrainRayActor pid=N)`
prefix), called before every step for every simulated rank (`--actor-num-nodes` x `--actor-num-gpus-per-node`)
with simulated CUDA memory figures (the hook module's `_memory_stats` and `_rank` are replaced). Both actors get
a runtime_env of their own, as slime's do. ATTUNE_STANDIN_RAY=0 runs all of it in the driver process instead.

ATTUNE_STANDIN_FAIL=cuda_oom|host_oom|host_oom_kill|nccl_timeout|hang|crash|invalid_config|invalid_args makes it
fail the way real slime does (the real error text and exit status), at step ATTUNE_STANDIN_FAIL_AT (default 2)
for the failures that happen while training:
- cuda_oom: torch.OutOfMemoryError raised in the actor ("CUDA out of memory. Tried to allocate ..."); exit 1.
- host_oom: Ray's memory monitor kills the actor; the driver raises ray.exceptions.OutOfMemoryError; exit 1.
- host_oom_kill: the kernel OOM killer SIGKILLs the driver (exit -9 / 137).
- nccl_timeout: the NCCL watchdog's timeout lines, then SIGABRT (terminate called ... DistBackendError).
- hang: stops printing and sleeps (a collective that never completes, with a long --distributed-timeout-minutes).
- crash: RuntimeError("CUDA error: an illegal memory access was encountered"); exit 1.
- invalid_config: AssertionError in validate_args before training (as Megatron's argument checks raise it); exit 1.
- invalid_args: an argparse error ("error: argument --tensor-model-parallel-size: invalid int value"); exit 2.
ATTUNE_STANDIN_STEP_S sets the simulated step time (default 0.05 s).
"""
from __future__ import annotations

import argparse
import enum
import importlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

logger = logging.getLogger("slime_standin")
MIB = 2 ** 20


def configure_logger():
    # slime/observability/logging_utils.py:configure_logger, prefix ""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(filename)s:%(lineno)d - %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)


def load_function(path):
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


@dataclass
class Sample:
    """Stand-in for slime.utils.types.Sample (the fields the rollout function sets)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str = ""
    tokens: list = field(default_factory=list)
    response_length: int = 0
    reward: float | None = None
    loss_mask: list | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"     # prints as torch.OutOfMemoryError, as torch's does


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="train.py", allow_abbrev=False)
    p.add_argument("--actor-num-nodes", type=int, default=1)
    p.add_argument("--actor-num-gpus-per-node", type=int, default=8)
    p.add_argument("--num-rollout", type=int, required=True)
    p.add_argument("--rollout-batch-size", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--max-tokens-per-gpu", type=int, default=None)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--num-layers", type=int, default=None)        # from MODEL_ARGS
    p.add_argument("--prompt-data", default=None)
    p.add_argument("--rollout-function-path", default=None)
    p.add_argument("--custom-megatron-before-train-step-hook-path", default=None)
    args, _unknown = p.parse_known_args(argv)
    args.n_samples_per_prompt = 1
    return p, args


def validate_args(args):
    # Megatron's validate_args style: a plain assert with a message.
    assert args.num_layers is not None and args.num_layers > 0, "num_layers must be set (MODEL_ARGS)"
    if os.environ.get("ATTUNE_STANDIN_FAIL") == "invalid_config":
        assert 16 % (args.tensor_model_parallel_size * 3) == 0, (
            f"num_attention_heads (16) must be a multiple of tensor_model_parallel_size "
            f"({args.tensor_model_parallel_size * 3})")


class Trainer:
    """What MegatronTrainRayActor does per rollout: the hook before each step, the step and perf lines."""

    def __init__(self, args):
        configure_logger()
        self.args = args
        self.world = args.actor_num_nodes * args.actor_num_gpus_per_node
        self.hook = None
        if args.custom_megatron_before_train_step_hook_path:
            self.hook = load_function(args.custom_megatron_before_train_step_hook_path)
            module = sys.modules[self.hook.__module__]
            self._current = (0, 0)
            module._memory_stats = lambda: self._memory()
            module._rank = lambda: self._current[0]
        self.train_wait_start = time.time()
        self.fail = os.environ.get("ATTUNE_STANDIN_FAIL", "")
        self.fail_at = int(os.environ.get("ATTUNE_STANDIN_FAIL_AT", "2"))
        self.step_s = float(os.environ.get("ATTUNE_STANDIN_STEP_S", "0.05"))

    def _memory(self):
        rank, step = self._current
        allocated = (40 * 1024 + 64 * rank + 8 * step) * MIB
        retries = step * int(os.environ.get("ATTUNE_STANDIN_RETRIES_PER_STEP", "0"))   # a run short of memory
        return allocated, allocated + 2048 * MIB, rank % self.args.actor_num_gpus_per_node, retries

    def train(self, rollout_id: int, seq_lens: list[int]) -> int:
        args = self.args
        t0 = time.time()
        train_wait = t0 - self.train_wait_start
        steps_per_rollout = args.rollout_batch_size // args.global_batch_size
        for step_id in range(steps_per_rollout):
            step = rollout_id * steps_per_rollout + step_id
            if self.hook is not None:
                for rank in range(self.world):
                    self._current = (rank, step)
                    self.hook(args, rollout_id, step_id, None, None, None)
            if step == self.fail_at:
                self._fail_in_training(step)
            time.sleep(self.step_s)
            loss = 2.5 / (1 + 0.1 * step)
            log_dict = {"train/loss": loss, "train/grad_norm": 1.0 / (1 + step), "train/lr-pg_0": 1e-05,
                        "train/global_batch_size": args.global_batch_size, "train/step": step}
            logger.info(f"step {step}: {log_dict}")
        actor_train = time.time() - t0
        logger.info(f"Timer actor_train end (elapsed: {actor_train:.1f}s)")
        train = time.time() - t0
        self.train_wait_start = time.time()
        log_dict = {"perf/train_wait_time": train_wait, "perf/actor_train_time": actor_train, "perf/train_time": train,
                    "perf/actor_train_tflops": float("nan"),
                    "perf/actor_train_tok_per_s": sum(seq_lens) / actor_train}
        total = train_wait + train
        log_dict["perf/step_time"] = total
        log_dict["perf/wait_time_ratio"] = train_wait / total
        logger.info(f"perf {rollout_id}: {log_dict}")
        return rollout_id

    def _fail_in_training(self, step):
        if self.fail == "cuda_oom":
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 7.59 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
                "3.12 GiB is free. Including non-PyTorch memory, this process has 136.68 GiB memory in use. Of the "
                "allocated memory 128.20 GiB is allocated by PyTorch, and 6.03 GiB is reserved by PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
        if self.fail == "crash":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                               "asynchronously reported at some other API call, so the stacktrace below might be "
                               "incorrect.")
        if self.fail == "nccl_timeout":
            stamp = time.strftime("%m%d %H:%M:%S")
            for rank in range(self.world):
                print(f"[rank{rank}]:[E{stamp}.123456789 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
                      f"collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLTOALL_BASE, NumelIn=16777216, "
                      f"NumelOut=16777216, Timeout(ms)=1800000) ran for 1800061 milliseconds before timing out.",
                      file=sys.stderr, flush=True)
            print("terminate called after throwing an instance of 'c10::DistBackendError'\n  what():  [PG ID 0 PG "
                  "GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: [Rank 0] "
                  "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLTOALL_BASE, "
                  "NumelIn=16777216, NumelOut=16777216, Timeout(ms)=1800000) ran for 1800061 milliseconds before "
                  "timing out.", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGABRT)
        if self.fail == "hang":
            time.sleep(3600)


HOST_OOM_TEXT = (
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.1, ID: 2c9e0c3e5f0b) where the task (actor ID: 8f2a, "
    "name=MegatronTrainRayActor.__init__, pid=4321, memory used=1843.20GB) was running was 1943.40GB / 2015.60GB "
    "(0.964180), which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 77ab) because it "
    "was the most recently scheduled task; to see more information about memory usage on this node, use "
    "`ray logs raylet.out -ip 10.0.0.1`. To see the logs of the worker, use `ray logs worker-77ab*out -ip "
    "10.0.0.1.` Top 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n4321\t1843.20\tray::MegatronTrainRayActor.train")


class RolloutManager:
    """What slime's RolloutManager does with --debug-train-only: load the rollout function, call it per rollout."""

    def __init__(self, args):
        configure_logger()
        self.args = args
        self.generate_rollout = load_function(args.rollout_function_path)
        logger.info(f"import {args.rollout_function_path} as generate_rollout function.")

    def generate(self, rollout_id: int) -> list[int]:
        groups = self.generate_rollout(self.args, rollout_id, None, evaluation=False, sample_cls=Sample)
        samples = [s for g in groups for s in g]
        assert len(samples) == self.args.rollout_batch_size
        assert all(len(s.loss_mask) == s.response_length < len(s.tokens) for s in samples)
        return [len(s.tokens) for s in samples]


def main(argv=None):
    configure_logger()
    parser, args = parse_args(argv)
    fail = os.environ.get("ATTUNE_STANDIN_FAIL", "")
    if fail == "invalid_args":
        parser.error("argument --tensor-model-parallel-size: invalid int value: 'two'")
    validate_args(args)
    logger.info(f"slime stand-in: world {args.actor_num_nodes * args.actor_num_gpus_per_node}, "
                f"{args.num_rollout} rollouts, cwd {os.getcwd()}")
    use_ray = os.environ.get("ATTUNE_STANDIN_RAY", "1") != "0"
    if use_ray:
        import ray
        ray.init(logging_level=logging.WARNING)
        # as slime/ray/placement_group.py:233 and actor_group.py:109 create them: a runtime_env of their own
        # (env_vars only), so the job's working_dir must be inherited for the shipped modules to import
        options = {"num_cpus": 0, "runtime_env": {"env_vars": {"NCCL_CUMEM_ENABLE": "0"}}}
        manager = ray.remote(RolloutManager).options(**options).remote(args)
        actor = ray.remote(type("MegatronTrainRayActor", (Trainer,), {})).options(**options).remote(args)
        generate = lambda r: ray.get(manager.generate.remote(r))  # noqa: E731
        train = lambda r, lens: ray.get(actor.train.remote(r, lens))  # noqa: E731
    else:
        manager, actor = RolloutManager(args), Trainer(args)
        generate, train = manager.generate, actor.train
    fail_at = int(os.environ.get("ATTUNE_STANDIN_FAIL_AT", "2"))
    for rollout_id in range(args.num_rollout):
        seq_lens = generate(rollout_id)
        if fail == "host_oom" and rollout_id == fail_at:
            print("Traceback (most recent call last):\n  File \"train.py\", line 57, in train\n    "
                  "ray.get(actor_model.async_train(rollout_id, rollout_data_ref))\n" + HOST_OOM_TEXT,
                  file=sys.stderr, flush=True)
            sys.exit(1)
        if fail == "host_oom_kill" and rollout_id == fail_at:
            os.kill(os.getpid(), signal.SIGKILL)
        train(rollout_id, seq_lens)


if __name__ == "__main__":
    main()
