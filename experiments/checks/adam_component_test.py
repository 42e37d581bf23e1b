"""Component test of the precision-aware Adam step: BF16 parameter + 16-bit remainder vs an FP64 Adam.

    tune component-test adam [--model M] [--ep 8] [--json] [--device cuda|cpu] [--seed 0]
                             [--recipe FILE [--recipe-out OUT]]
    PYTHONPATH=<repo root> python -m experiments.checks.adam_component_test [same flags]

What is tested (TE's param-remainder Adam, its arms and the FP64 reference) is emulated in
experiments/checks/adam_arms.py, where the scheme is re-derived from Transformer Engine's source.

Metrics, relative L2 per tensor, worst tensor reported, after 1 and after 3 steps, bound 1e-3:
- update: || (w_k - w_0)_arm - (w_k - w_0)_fp64 || / || (w_k - w_0)_fp64 ||, the change the optimizer
  made to the master since step 0 (each arm against its own w_0). This is the recipe's "worst tensor
  (update) relative L2 error".
- master: || w_k,arm - w_k,fp64 || / || w_k,fp64 ||, the reconstructed master itself.

Why "update" is the change applied to the master and not the Adam direction m_hat/(sqrt(v_hat)+eps)
+ decay * w: that direction barely depends on the master's precision (the master enters only via
decay * w = 0.1 x ~0.02), so a BF16 master computes it to ~1e-6 and would pass. What a BF16 master
loses is the application: at lr 1e-5 the per-step change (~1e-5) is below half a BF16 ulp of a
typical weight (|w| ~ 0.02: ulp 2^-13 ~ 1.2e-4), so most of the update is rounded away (stale
weights). On the applied change both controls fail by orders of magnitude (error ~1) at the recipe's
own hyperparameters (lr 1e-5, betas 0.9/0.98, eps 1e-8, weight decay 0.1); the master metric alone
would not catch them reliably (an error of ~|update|/|w| ~ 5e-4 over a few steps). The main arm's
update error is set by FP32 rounding of the master: ~2^-24 |w| / lr ~ 1e-4 at worst per element,
~5e-5 in L2, well inside 1e-3. The bound is not relaxed for any arm.

Shapes: one MoE layer's routed experts on one EP rank: per local expert fc1 hidden x (2 moe_ffn)
(gate and up, SwiGLU) and fc2 moe_ffn x hidden; num_experts / EP local experts, as many of them as
fit in `max_elements` (default 2^25 elements, a few seconds on a GPU). The step is elementwise, so
the shape only sets how many elements are tested.

Imports: torch, the standard library and cost_model.nouns.model_spec only (it runs on the bare training
image, torch 2.11, no Transformer Engine). Exit codes: 0 the main arm is within the bound (and
bitwise identical to explicit FP32 masters) and both controls fail it; 1 otherwise; 2 no usable GPU
(unless --device cpu) or bad arguments, one line on stderr.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
import time
from dataclasses import dataclass

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.model_spec import ModelError, ModelSpec, load_model

try:  # torch runs the test; parsing its flags (`tune component-test --help`) must not need it
    import torch

    from experiments.checks.adam_arms import ARMS, Hyper, Fp32Math, fp64_reference, run_arms
except ModuleNotFoundError as _e:
    torch, _MISSING = None, _e.name

BOUND = 1e-3
DEFAULT_MODEL = "qwen3.6-35b-a3b"
DEFAULT_EP = 8
MAX_ELEMENTS = 1 << 25
INIT_STD = 0.02        # Megatron's init_method_std / HF initializer_range
GRAD_STD = 1e-3        # per-element FP32 main-grad scale; Adam normalises it (eps 1e-8 is far below)


class ComponentTestError(AttuneError, ValueError):
    """Unusable arguments (unknown model, no MoE layer, EP not dividing the experts, no GPU)."""


def _rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    den = torch.linalg.vector_norm(ref.reshape(-1)).item()
    num = torch.linalg.vector_norm((x - ref).reshape(-1)).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


# ---------------------------------------------------------------------- shapes
def moe_layer_shapes(model: ModelSpec, ep: int = DEFAULT_EP,
                     max_elements: int = MAX_ELEMENTS) -> tuple[list[tuple[str, int, int]], dict]:
    """Per local expert: fc1 hidden x 2*moe_ffn and fc2 moe_ffn x hidden, capped at max_elements."""
    if not model.is_moe or not model.moe_intermediate_size:
        raise ComponentTestError(f"{model.display_name} has no routed experts (not an MoE model)")
    if ep < 1 or model.num_experts % ep:
        raise ComponentTestError(f"EP {ep} does not divide the {model.num_experts} experts of {model.display_name}")
    h, f = model.hidden_size, model.moe_intermediate_size
    local = model.num_experts // ep
    per_expert = h * 2 * f + f * h
    tested = max(1, min(local, max_elements // per_expert))
    shapes = []
    for e in range(tested):
        shapes.append((f"expert{e}.fc1", h, 2 * f))
        shapes.append((f"expert{e}.fc2", f, h))
    info = {
        "model": model.display_name,
        "hidden": h, "experts": model.num_experts, "top_k": model.num_experts_per_tok, "expert_ffn": f,
        "ep": ep, "etp": 1, "local_experts": local, "tested_experts": tested,
        "elements": tested * per_expert,
        "description": (f"one {model.display_name} MoE layer: hidden {h}, {model.num_experts} experts, "
                        f"top-{model.num_experts_per_tok}, expert FFN {f}, EP {ep}, ETP 1: "
                        f"{tested} of its {local} local experts (fc1 {h} x {2 * f}, fc2 {f} x {h} each; "
                        f"{tested * per_expert:,} elements)"),
    }
    return shapes, info


# ---------------------------------------------------------------------- the test
@dataclass(frozen=True)
class TensorSet:
    """The tensors the test runs on: `shapes` (name, rows, cols) when given, else the local experts of one
    of `model_name`'s MoE layers at EP `ep`, capped at `max_elements` (moe_layer_shapes)."""
    model_name: str | ModelSpec = DEFAULT_MODEL
    ep: int = DEFAULT_EP
    max_elements: int = MAX_ELEMENTS
    shapes: list[tuple[str, int, int]] | None = None


def _tested_shapes(tensors: TensorSet) -> tuple[list[tuple[str, int, int]], dict]:
    """The tensors to test and their description: the model's MoE layer, or the custom shapes given."""
    model_name, shapes, ep, max_elements = tensors.model_name, tensors.shapes, tensors.ep, tensors.max_elements
    if shapes is None:
        try:
            model = model_name if isinstance(model_name, ModelSpec) else load_model(model_name)
        except ModelError as e:
            raise ComponentTestError(str(e)) from None
        return moe_layer_shapes(model, ep, max_elements)
    n = sum(r * c for _, r, c in shapes)
    name = model_name.display_name if isinstance(model_name, ModelSpec) else str(model_name)
    shape_info = {"model": name, "elements": n,
                  "description": "custom shapes: " + ", ".join(f"{s} {r} x {c}" for s, r, c in shapes)
                  + f" ({n:,} elements)"}
    return shapes, shape_info


def _worst_errors(shapes: list[tuple[str, int, int]], dev: torch.device, steps: tuple[int, ...], seed: int,
                  hyper: Hyper) -> tuple[dict, dict]:
    """Every arm on every tensor against FP64 Adam: per arm and recorded step the worst tensor's update and
    master errors (and which tensor); per step whether the main arm's masters are bitwise the FP32 arm's."""
    n_steps = steps[-1]
    math32 = Fp32Math(hyper)
    worst = {arm: {s: {"update": 0.0, "master": 0.0, "update_tensor": None, "master_tensor": None} for s in steps}
             for arm in ARMS}
    bitwise = {s: True for s in steps}
    gen = torch.Generator(device="cpu")
    for index, (tname, rows, cols) in enumerate(shapes):
        gen.manual_seed(seed * 1_000_003 + index)
        w0 = (torch.randn(rows, cols, generator=gen, dtype=torch.float32) * INIT_STD).to(dev)
        grads = [(torch.randn(rows, cols, generator=gen, dtype=torch.float32) * GRAD_STD).to(dev)
                 for _ in range(n_steps)]
        ref = fp64_reference(w0, grads, hyper)
        results = run_arms(w0, grads, math32)
        for s in steps:
            if not torch.equal(results["main"][s].view(torch.int32), results["fp32_master"][s].view(torch.int32)):
                bitwise[s] = False
            ref_update = ref[s] - ref[0]
            for arm, snaps in results.items():
                w_k = snaps[s].to(torch.float64)
                upd = _rel_l2(w_k - snaps[0].to(torch.float64), ref_update)
                mst = _rel_l2(w_k, ref[s])
                cell = worst[arm][s]
                if not upd <= cell["update"]:      # NaN counts as worse
                    cell["update"], cell["update_tensor"] = upd, tname
                if not mst <= cell["master"]:
                    cell["master"], cell["master_tensor"] = mst, tname
        del w0, grads, ref, results
    return worst, bitwise


def _arm_verdicts(worst: dict, steps: tuple[int, ...], bound: float) -> dict:
    """Per arm: its label and role, each step's worst errors against the bound, and the verdict over all steps."""
    arms = {}
    for arm, (label, role) in ARMS.items():
        per_step = {}
        for s in steps:
            cell = worst[arm][s]
            within = cell["update"] <= bound and cell["master"] <= bound
            per_step[str(s)] = {**cell, "within_bound": within}
        within_all = all(v["within_bound"] for v in per_step.values())
        fails_all = all(not v["within_bound"] for v in per_step.values())
        arms[arm] = {"label": label, "role": role, "steps": per_step,
                     "within_bound": within_all, "fails_bound_at_every_step": fails_all}
    return arms


def run(tensors: TensorSet = TensorSet(), device: str = "cuda", steps: tuple[int, ...] = (1, 3), seed: int = 0, *,
        hyper: Hyper | None = None, bound: float = BOUND) -> dict:
    """Run every arm on every tensor; errors are the worst tensor's, per recorded step."""
    if torch is None:
        raise ComponentTestError(f"the component test needs the Python package '{_MISSING}', which is not "
                                 f"installed (pip install 'attune-llm[megatron]' brings torch)")
    hyper = hyper if hyper is not None else Hyper()
    steps = tuple(sorted(set(int(s) for s in steps)))
    if not steps or steps[0] < 1:
        raise ComponentTestError(f"steps must be positive integers, got {steps}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ComponentTestError("no CUDA GPU visible (torch.cuda.is_available() is False); "
                                 "run on the training image's GPU, or pass --device cpu for a test run")
    dev = torch.device(device)
    shapes, shape_info = _tested_shapes(tensors)
    t0 = time.perf_counter()
    worst, bitwise = _worst_errors(shapes, dev, steps, seed, hyper)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0

    arms = _arm_verdicts(worst, steps, bound)
    main_ok = arms["main"]["within_bound"] and all(bitwise.values())
    controls_fail = arms["drop_remainder"]["fails_bound_at_every_step"] and \
        arms["bf16_master"]["fails_bound_at_every_step"]
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "test": "precision-aware Adam: FP32 master as BF16 param + int16 remainder vs FP64 Adam",
        "shape": shape_info["description"],
        "shape_info": shape_info,
        "tensors": [{"name": n, "rows": r, "cols": c} for n, r, c in shapes],
        "device": str(dev),
        "gpu": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "date": _dt.date.today().isoformat(),
        "seed": seed,
        "hyperparameters": hyper.to_dict(),
        "init_std": INIT_STD,
        "grad_std": GRAD_STD,
        "steps": list(steps),
        "bound": bound,
        "metrics": {
            "update": "worst tensor relative L2 error of (w_k - w_0) against FP64 Adam",
            "master": "worst tensor relative L2 error of the reconstructed FP32 master w_k against FP64 Adam",
        },
        "arms": arms,
        "bitwise_identical_to_fp32_master": {str(s): v for s, v in bitwise.items()},
        "main_passed": main_ok,
        "controls_failed": controls_fail,
        "passed": bool(main_ok and controls_fail),
        "seconds": round(seconds, 3),
    }


def _e(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3e}" if math.isfinite(x) else str(x)


def format_result(result: dict) -> str:
    hp = result["hyperparameters"]
    out = [
        f"{result['test']}",
        f"shape: {result['shape']}",
        f"device: {result['device']}" + (f" ({result['gpu']})" if result["gpu"] else "")
        + f", torch {result['torch']}, seed {result['seed']}, {result['seconds']:.1f} s",
        f"hyperparameters: lr {hp['lr']:g}, betas {hp['beta1']:g}/{hp['beta2']:g}, eps {hp['eps']:g}, "
        f"weight decay {hp['weight_decay']:g} (decoupled); init std {result['init_std']:g}, grad std {result['grad_std']:g}",
        f"bound: worst tensor relative L2 error <= {result['bound']:.1e} on the update (w_k - w_0) and on the "
        f"reconstructed master w_k, against FP64 Adam",
        "",
    ]
    rows = [("arm", "role", "step", "update err", "master err", "verdict")]
    for arm in result["arms"].values():
        for s, cell in arm["steps"].items():
            if arm["role"] == "control":
                verdict = "fails bound (expected)" if not cell["within_bound"] else "WITHIN bound (control not detected)"
            elif arm["role"] == "variant":
                verdict = ("within bound" if cell["within_bound"] else "exceeds bound") + " (informational)"
            else:
                verdict = "within bound" if cell["within_bound"] else "EXCEEDS bound"
            rows.append((arm["label"], arm["role"], s, _e(cell["update"]), _e(cell["master"]), verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out.append("")
    bw = result["bitwise_identical_to_fp32_master"]
    out.append("reconstructed FP32 masters bitwise identical to explicit FP32 masters: "
               + ", ".join(f"step {s} {'yes' if v else 'NO'}" for s, v in bw.items()))
    if result["passed"]:
        out.append("result: PASS (main arm within the bound and bitwise equal to FP32 masters; both controls fail)")
    else:
        why = []
        if not result["main_passed"]:
            why.append("main arm exceeds the bound or differs from explicit FP32 masters")
        if not result["controls_failed"]:
            why.append("a negative control stays within the bound (the test cannot detect it)")
        out.append("result: FAIL (" + "; ".join(why) + ")")
    return "\n".join(out)


def recipe_component_block(result: dict, gpu_name: str | None = None) -> dict:
    """The recipe's correctness.component_tests entry for this run."""
    arms = result["arms"]
    steps = result["steps"]
    first, last = str(steps[0]), str(steps[-1])
    main = arms["main"]["steps"]
    words = {1: "one step", 2: "two steps", 3: "three steps"}

    def after(s: str) -> str:
        return words.get(int(s), f"{s} steps")

    bw = all(result["bitwise_identical_to_fp32_master"].values())
    controls = "; ".join(
        f"{arms[k]['label'].removeprefix('control: ')}: update error {_e(arms[k]['steps'][last]['update'])}"
        for k in ("drop_remainder", "bf16_master"))
    detail = (
        f"worst tensor (update) relative L2 error {_e(main[first]['update'])} after {after(first)} and "
        f"{_e(main[last]['update'])} after {after(last)} against a bound of {result['bound']:.1e} at the recipe's "
        f"hyperparameters (reconstructed master {_e(main[last]['master'])}); reconstructed FP32 masters "
        f"{'bitwise identical' if bw else 'NOT bitwise identical'} to an arm with explicit FP32 masters; the "
        f"negative controls {'fail' if result['controls_failed'] else 'do NOT all fail'} "
        f"({controls} after {after(last)})")
    return {
        "test": ("precision-aware Adam (TE FusedAdam store_param_remainders scheme, FP32 masters stored as BF16 "
                 "parameter plus int16 remainder) against an FP64 reference"),
        "shape": result["shape"],
        "gpu": gpu_name if gpu_name is not None else result.get("gpu"),
        "date": result["date"],
        "result": "pass" if result["passed"] else "fail",
        "detail": detail,
        "note": (f"TE's param-remainder Adam kernel emulated elementwise in PyTorch {result['torch']} on "
                 f"{result['device']} (split/merge and FP32 math as transformer_engine/common/multi_tensor/adam.cu); "
                 f"the optimizer step is elementwise, so the result holds for every model on the image"),
    }


def _int_in(low: int, high: int):
    """An argparse type: an integer in [low, high] (EP 0 would divide by zero; a seed must fit torch's)."""
    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 30 else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low:,} to {high:,}, got {text[:40]!r}")
        return value
    parse.__name__ = "integer"
    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tune component-test adam",
        description="Precision-aware Adam (BF16 param + int16 remainder) against FP64 Adam, with negative controls. "
                    "Exit 0 pass, 1 fail, 2 unusable (no GPU, bad model).")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"catalog name or config.json (default {DEFAULT_MODEL})")
    p.add_argument("--ep", type=_int_in(1, 4096), default=DEFAULT_EP, help=f"expert-parallel size (default {DEFAULT_EP})")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cuda (default); cpu only for test runs")
    p.add_argument("--seed", type=_int_in(0, 2 ** 63 - 1), default=0)
    p.add_argument("--max-elements", type=_int_in(1, 1 << 31), default=MAX_ELEMENTS,
                   help=f"cap on the elements tested, at least one whole expert (default {MAX_ELEMENTS:,})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--recipe", help="record the result in this recipe's correctness.component_tests (checked "
                                    "before the test runs; rewritten in place unless --recipe-out is given)")
    p.add_argument("--recipe-out", help="with --recipe: write the updated recipe here instead")
    return p


RECORDED_DEVICES = ("cuda",)   # where a result may enter a recipe's correctness block


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "adam":
        argv = argv[1:]
    args = _parser().parse_args(argv)   # before torch is needed; under `tune`, a bad flag is one line
    from recipes.recipe import RecipeError, load_recipe

    try:
        if args.recipe_out and not args.recipe:
            raise ComponentTestError("--recipe-out needs --recipe")
        if args.recipe and args.device not in RECORDED_DEVICES:
            # a recipe's component tests are evidence about its GPU image; a CPU run tests the test
            raise ComponentTestError(f"--device {args.device} runs are test runs and are not recorded in a recipe "
                                     f"(drop --recipe, or run on cuda)")
        recipe = load_recipe(args.recipe).data if args.recipe else None  # a bad recipe fails before the test
        if args.max_elements < 1:
            raise ComponentTestError(f"--max-elements must be positive, got {args.max_elements}")
        result = run(TensorSet(args.model, ep=args.ep, max_elements=args.max_elements), args.device, seed=args.seed)
    except (ComponentTestError, RecipeError) as e:
        print(f"tune: error: {e.one_line()}", file=sys.stderr)   # a path may hold a newline or an escape
        return 2
    if recipe is not None:
        from recipes.correctness import record_component_test
        from recipes.recipe import write_recipe

        record_component_test(recipe, recipe_component_block(result))
        # the recipe it read, with this result added (a failed test may demote it): written where asked
        path = write_recipe(recipe, args.recipe_out or args.recipe, guard=False)
        print(f"recorded in {path}: component test {'pass' if result['passed'] else 'fail'}; "
              f"correctness {recipe['correctness']['result']}, status {recipe['status']}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_result(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
