"""The what-if commands: `tune predict` (the cost model's answer for one layout, or a batch of them) and
`tune trial` (one measured trial of one layout, outside any study)."""
from __future__ import annotations

import io
import json
import shlex
import sys
from pathlib import Path

from cost_model.nouns.errors import AttuneError
from cost_model.nouns.hardware import GpuSpec
from cost_model.nouns.layout import Layout
from cost_model.nouns.layout_codec import parse_pairs
from cost_model.nouns.model_spec import ModelSpec
from cost_model.predict import Prediction
from cost_model.nouns.user_file import parse_json, read_user_text
from tuner.backends import check_set_up, make_runner, measured_window, megatron_refused, megatron_unsupported
from cost_model.step_time import runner_host_to_gpu
from tuner.intervals import CROSSING_RATIO, at_crossing, host_launch_extra_sd, is_shipped, runner_priced
from tuner.options import CliError, check_profile_gpu, flags_set, profile, writing_user_file
from tuner.predict_request import (CASE_KEYS, MAX_BATCH_REQUESTS, MAX_REQUEST_CHARS, answer, interval_for,
                                   leads_with_median, resolve, result_dict)


def request_from_args(args) -> dict:
    """The flags as one request (tuner.predict_request), so flags and a batch line are answered alike."""
    if getattr(args, "recipe", None):
        # what a recipe gives instead (its stack: the training image it was run on)
        extra = [f for f in flags_set(args, CASE_KEYS + ("stack",), "predict") if f != "--model"]
        if extra:   # the recipe gives them; silently answering the recipe would ignore what was asked
            raise CliError(f"--recipe gives the model, GPUs, workload and layout; drop {', '.join(extra)} "
                           f"(or leave out --recipe; --model PATH names the config.json a recipe was exported from)")
        return {"recipe": args.recipe, "model": args.model, "usd_per_gpu_hour": args.usd_per_gpu_hour,
                "stack_fix": args.stack_fix}
    if not (args.model and args.gpu):
        raise CliError("give --recipe FILE, or --model, --gpu and --layout KEY=VALUE ...")
    return {"model": args.model, "gpu": args.gpu, "gpus": args.gpus, "seq_len": args.seq_len,
            "global_batch": args.global_batch, "precision": args.precision, "routing": args.routing,
            "framework": args.framework, "cuda_graphs": getattr(args, "cuda_graphs", "none"),
            "peft": getattr(args, "peft", "none"), "images_per_row": getattr(args, "images_per_row", 0),
            "image_size": getattr(args, "image_size", 448),
            "usd_per_gpu_hour": args.usd_per_gpu_hour, "stack_fix": args.stack_fix,
            "stack": getattr(args, "stack", "image"), "layout": parse_pairs(args.layout)}


def cmd_predict(args) -> int:
    hardware = profile(args)
    if args.batch:
        extra = flags_set(args, CASE_KEYS + ("stack", "recipe", "explain", "recipe_out"), "predict")
        if extra:
            raise CliError(f"--batch takes each request from its lines; drop {', '.join(extra)}")
        return predict_batch(args.batch, hardware)
    case = resolve(request_from_args(args), notes := [])
    check_profile_gpu(hardware, case.gpu)
    prediction = answer(case, hardware)
    _say(notes)   # after the layout's rules: an invalid layout is one error line alone
    interval = interval_for(case, hardware, prediction)
    if not (args.recipe or args.layout or prediction.fits):
        gpus = f" --gpus {args.gpus}" if args.gpus else ""
        _say([f"no --layout given, so this is the default layout ({case.layout.label}); `tune --model "
              f"{shlex.quote(args.model)} --gpu {shlex.quote(args.gpu)}{gpus}` searches every layout for one that fits"])
    if args.recipe_out:
        _write_recipe(args.recipe_out, case, prediction, interval)
    if args.json:
        print(json.dumps(result_dict(case, prediction, interval)))
    elif args.explain:
        print(explain(case.model, case.gpu, case.layout, prediction, interval, is_shipped(hardware, case.gpu)))
    else:
        print(summary_line(case.model, case.gpu, case.layout, prediction, interval))
    return 0


def _write_recipe(out: str, case, prediction: Prediction, interval) -> None:
    """--recipe-out: the layout's recipe, led by the figure the line printed; where that is the hypotheses' median,
    with their interval (result.predicted_interval) as `tune export` writes it."""
    from recipes.recipe import build_recipe, write_recipe
    from tuner.export import interval_block
    from tuner.interval import Interval

    recipe = build_recipe(case.model, case.gpu, case.workload, case.layout, prediction,
                          headline=headline(interval, prediction)[0])
    if leads_with_median(interval, prediction):
        recipe["result"]["predicted_interval"] = interval_block(Interval.of_hypotheses(interval))
    with writing_user_file(out):
        write_recipe(recipe, Path(out))


def _say(notes: list[str]) -> None:
    """What the answer's reader must know (a recipe's model not checked), on stderr: stdout stays the answer."""
    from cost_model.nouns.names import printable

    for note in notes:
        print(f"tune: note: {printable(note)}", file=sys.stderr)


def predict_batch(path: str, hardware) -> int:
    """One JSON object a line for one JSON request a line, in order: the result, or {"line": N, "error": ...}
    in place of a request that cannot be answered; a bad line never ends the batch. Exit 0 when every request
    got a result, 1 when any got an error object (the file that cannot be read at all: CliError, exit 2)."""
    stream = _stdin() if path == "-" else io.StringIO(read_user_text(path, CliError, "request file"))
    failed = asked = 0
    with stream:
        for number, line in _request_lines(stream):
            asked += 1
            if asked > MAX_BATCH_REQUESTS:   # a bound on the work, said in place of the first request left out
                out = _error(number, f"more than {MAX_BATCH_REQUESTS:,} requests in one batch; this line and the "
                                     f"rest are not read (split the file)")
            elif line is ENDLESS:
                out = _error(number, f"more than {MAX_BATCH_LINES:,} lines in one batch; this line and the rest are "
                                     f"not read (an endless stream of blank lines?)")
            elif line is BINARY:
                out = _error(number, f"not text (a NUL byte in an over-long line, or no line end within "
                                     f"{MAX_DROPPED_CHARS:,} characters); this line and the rest are not read")
            elif line is None:
                out = _error(number, f"longer than {MAX_REQUEST_CHARS:,} characters")
            else:
                out = _answer_line(line, number, hardware)
            failed += "error" in out
            print(json.dumps(out), flush=True)
            if asked > MAX_BATCH_REQUESTS or line is ENDLESS:
                break
    if not asked:   # exit 0 (no request got an error), but an empty answer must not pass for a batch answered
        print(f"tune: note: {'stdin' if path == '-' else 'the request file'} held no requests (empty or blank lines "
              f"only): nothing was predicted", file=sys.stderr)
    return 1 if failed else 0


def _stdin():
    """stdin as UTF-8 text whose undecodable bytes become U+FFFD: such a line gets an error object, the
    batch goes on (a strict decoder would end it with a traceback)."""
    buffer = getattr(sys.stdin, "buffer", None)
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="replace") if buffer is not None else sys.stdin


BINARY = object()   # _request_lines: the input is not text; nothing after it is read
ENDLESS = object()  # _request_lines: too many lines, blank ones included; nothing after it is read
# blank lines are skipped but still read: `yes ''` would otherwise be read silently forever
MAX_BATCH_LINES = 1_000_000
MAX_DROPPED_CHARS = 64 * 2 ** 20


def _request_lines(stream):
    """(line number, text) of each non-blank line; text None for a line over MAX_REQUEST_CHARS characters,
    of which no more than that is ever held (the rest is read and dropped); BINARY, and nothing after it, for an
    over-long line that holds a NUL or has no end within MAX_DROPPED_CHARS."""
    number = 0
    while True:
        line = stream.readline(MAX_REQUEST_CHARS + 1)
        if not line:
            return
        number += 1
        if number > MAX_BATCH_LINES:
            yield number, ENDLESS
            return
        if len(line) > MAX_REQUEST_CHARS and not line.endswith("\n"):
            rest, dropped = line, len(line)
            while rest and not rest.endswith("\n"):
                rest = stream.readline(MAX_REQUEST_CHARS + 1)
                dropped += len(rest)
                # an endless line (/dev/zero) or a long binary one is not a request file: stop reading it
                if "\x00" in rest or dropped > MAX_DROPPED_CHARS:
                    yield number, BINARY
                    return
            yield number, None
        elif line.strip():
            yield number, line


def _error(number: int, message: str) -> dict:
    return {"line": number, "error": f"line {number}: {message}"}


def _answer_line(line: str, number: int, hardware) -> dict:
    """One request's answer, or an error object naming the line: a bad line never ends the batch."""
    try:
        case = resolve(parse_json(line, f"line {number}", CliError), notes := [])
        check_profile_gpu(hardware, case.gpu)   # one GPU's --profile priced as another's would answer wrongly
        p = answer(case, hardware)
        out = {"line": number, **result_dict(case, p, interval_for(case, hardware, p))}
        return {**out, "notes": notes} if notes else out
    except AttuneError as e:
        text = e.one_line()
        return _error(number, text[len(f"line {number}: "):] if text.startswith(f"line {number}: ") else text)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError, ZeroDivisionError) as e:
        # a value no check above caught: still one answer for this line, and the batch goes on
        # the exception's text may quote the line: its kind alone is said
        return _error(number, f"invalid request ({type(e).__name__})")


def interval_text(iv, p: Prediction) -> str:
    if iv is None:
        return ""
    basis = (f"posterior median, 90%, {len(iv.by_hypothesis)} hypotheses" if leads_with_median(iv, p) else
             "90%, the runner's measured error and the derivation's" if _derived(p) else
             "90%, the runner's measured error")
    return f"[{iv.low:,.0f}-{iv.high:,.0f}] ({basis})"


def headline(iv, p: Prediction) -> tuple[float, float, float, float]:
    """(tokens/s/GPU, step seconds, MFU, $/1M tokens) a prediction leads with: at the posterior median over the
    hypotheses where the interval spans them (what `tune`'s table shows for the same layout; `Prediction.figures_at`),
    else the prediction's own."""
    tokens = iv.median if leads_with_median(iv, p) else p.tokens_per_s_per_gpu
    return (tokens, *p.figures_at(tokens))


def _breakdown_note(iv, p: Prediction) -> str:
    """Where the headline is the posterior median: that the step time, MFU and breakdown are the shipped model's
    single prediction, and its tokens/s/GPU."""
    if not leads_with_median(iv, p):
        return ""
    return (f"; the breakdown (--explain) is the shipped model's own prediction, one of the hypotheses: "
            f"{p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {p.step_time_s:.2f} s")


def _derived(p: Prediction):
    """The runner components' `Derivation` where they were derived from another GPU type's, else None."""
    ctx = p.context
    return ctx.runner.derived if ctx is not None and ctx.runner is not None else None


def fit_text(p: Prediction, no: str = "DOES NOT FIT") -> str:
    """"fits", or the verdict and why: "DOES NOT FIT: ..." or "borderline (61%): predicted ... GiB ..."."""
    if p.fits:
        return "fits"
    return f"{p.fit_label if p.may_fit else no}: " + "; ".join(r.removeprefix("borderline: ") for r in p.reasons)


def summary_line(model: ModelSpec, gpu: GpuSpec, layout: Layout, p: Prediction, interval=None) -> str:
    fits = fit_text(p)
    tokens, step, mfu, _ = headline(interval, p)
    return (f"{model.display_name} on {layout.world_size} x {gpu.display_name}, {layout.long_label}: predicted "
            f"{tokens:,.0f} {interval_text(interval, p)} tokens/s/GPU, step {step:.2f} s, MFU {mfu:.1%}, "
            f"peak {p.peak_memory_gib:.1f} GiB, {fits} ({p.source}{_breakdown_note(interval, p)}"
            f"{'' if leads_with_median(interval, p) else '; --explain for the breakdown'})")


def interval_lines(iv, p: Prediction, shipped: bool = True) -> list[str]:
    """The interval, what drives its spread, and each hypothesis's figure. `shipped`: the prediction is from the GPU
    type's shipped profile, which never measured the user's host."""
    if iv is None:
        return []
    if runner_priced(p):   # interval_for: the runner stack's own prediction and measured error
        host = (f", the error of runs whose host time to issue a micro-batch is {CROSSING_RATIO} or more of its GPU "
                f"time (this one's {runner_host_to_gpu(p.context):.2f}: the host's speed counts)"
                if at_crossing(p) else "")
        launch = host_launch_extra_sd(p) if shipped else 0.0
        if launch >= 0.005:
            host += (f"; with {launch:.3f} of it for the host issuing the kernels, which the shipped profile never "
                     f"measured (runner_host_launch_error_sd: hosts' spread; `tune profile` on the training host "
                     f"measures its own)")
        derivation = _derived(p)
        derived = (f" and by their derivation from another GPU type's (Derivation.error_sd "
                   f"{derivation.error_sd:.3f})" if derivation else "")
        return ["", f"interval: {iv.low:,.0f}-{iv.high:,.0f} tokens/s/GPU (90%): the megatron runner's prediction "
                    f"from its {'derived' if derived else 'measured'} components, widened by its measured prediction "
                    f"error on runner runs{derived} (log sd {iv.error_sd:.3f}{host}; "
                    f"tuner.intervals.runner_stack_sd), the band a study of that runner prints"]
    lines = ["", f"interval: {iv.low:,.0f}-{iv.high:,.0f} tokens/s/GPU (90%): the hypotheses span "
                 f"{iv.spread_low:,.0f}-{iv.spread_high:,.0f} (weighted 5-95%, median {iv.median:,.0f}), widened by the "
                 f"model's residual error (log sd {iv.error_sd:.3f})",
             "  the spread comes from (weighted mean per group): " + "; ".join(iv.drivers() or ["nothing: they agree"]),
             f"  {'hypothesis':<30}{'weight':>7}{'tokens/s/GPU':>14}"]
    lines += [f"  {n:<30}{w:7.2f}{v:14,.0f}" for n, w, v in sorted(iv.by_hypothesis, key=lambda x: -x[2])]
    return lines


def explain(model: ModelSpec, gpu: GpuSpec, layout: Layout, p: Prediction, interval=None,
            shipped: bool = True) -> str:
    """Where the time and the memory go, as two tables; the interval across hypotheses (`shipped`: from the GPU
    type's shipped profile)."""
    tokens, step, mfu, usd = headline(interval, p)
    lines = [f"{model.display_name} on {layout.world_size} x {gpu.display_name}: {layout.long_label}",
             f"every figure is predicted ({p.source})",
             f"fits: {'yes' if p.fits else fit_text(p, 'NO')}",
             f"tokens/s/GPU {tokens:,.0f} {interval_text(interval, p)}   step {step:.2f} s   "
             f"MFU {mfu:.1%}   $/1M tokens {usd:.3f}"
             + (f"\nthe breakdown below is the shipped model's own prediction, one of the hypotheses: "
                f"{p.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, step {p.step_time_s:.2f} s, MFU {p.mfu:.1%}"
                if leads_with_median(interval, p) else ""),
             microbatch_line(p),
             "",
             f"{'step time':<28}{'seconds':>9}{'share':>8}  where it comes from"]
    sources = p.term_sources   # where each term comes from: measured, modelled or fitted
    for k, v in sorted(p.breakdown.items(), key=lambda kv: -kv[1]):
        if v > 0:
            lines.append(f"  {k:<26}{v:9.2f}{v / p.step_time_s:8.1%}  {sources.get(k, '')}".rstrip())
    for k, source in sources.items():   # a term priced elsewhere (the runner's layers, by the fitted terms)
        if not p.breakdown.get(k, 0.0) > 0:
            lines.append(f"  {k:<26}{'-':>9}{'':8}  {source}")
    lines.append(f"  {'total':<26}{p.step_time_s:9.2f}{1:8.1%}")
    lines += ["", *memory_lines(p)]
    lines.append(f"  {'host memory per node':<26}{p.host_memory_gib_per_node:9.0f}   of "
                 f"{p.host_memory_capacity_gib:.0f}")
    lines += interval_lines(interval, p, shipped)
    return "\n".join(lines)


MEMORY_ROWS = (("weights", "weights"), ("grads", "grads"), ("optimizer", "optimizer"),
               ("activations", "activations"), ("loss_path", "loss path (logits)"),
               ("optimizer_step", "optimizer step temporary"), ("allocated", "= allocator peak"),
               ("allocator_reserve", "allocator reserve"), ("cuda_context", "CUDA context, workspaces"),
               ("nccl", "NCCL communicators"), ("deepep", "DeepEP buffers"), ("outside_pytorch", "= outside PyTorch"),
               ("total", "= total (decides the fit)"), ("allocator_cache", "allocator cache if room"),
               ("device_peak", "= expected device peak"))


def memory_lines(p: Prediction) -> list[str]:
    """The device-level peak of the most-loaded GPU by part, and where the non-model parts come from."""
    mem = p.memory.as_dict()
    lines = [f"{'memory per GPU (device level)':<32}{'GiB':>9}{'share':>8}"]
    for key, label in MEMORY_ROWS:
        if mem.get(key) or key in ("allocated", "outside_pytorch", "total"):
            lines.append(f"  {label:<30}{mem[key]:9.1f}{mem[key] / mem['total']:8.1%}")
    lines.append(f"  {'usable (most-loaded GPU)':<30}{p.gpu_memory_gib:9.1f}   "
                 f"{p.fit_label}")
    for part, source in sorted(p.memory.sources.items()):
        lines.append(f"    {part}: {source}")
    return lines


def microbatch_line(p: Prediction) -> str:
    """The step's micro-batches; where slime's schedule makes them uneven, the mean the time sees and the largest the
    memory does (cost_model.predict.microbatches)."""
    n = p.num_microbatches
    line = f"{n} micro-batch{'es' if n != 1 else ''} of {p.tokens_per_microbatch:,.0f} tokens per GPU per step"
    largest = p.context.largest_tokens if p.context is not None else 0.0
    if largest and abs(largest - p.tokens_per_microbatch) > 0.5:
        line += (f" on the busiest rank, on average (slime's schedule deals uneven bins; the largest, "
                 f"{largest:,.0f} tokens, sets the memory peak)")
    return line


def cmd_trial(args) -> int:
    from experiments.runner import TrialSpec

    dry_run = getattr(args, "dry_run", False)
    if dry_run and args.backend != "slime":
        raise CliError("--dry-run prints the Ray job of --backend slime; the other backends submit no job")
    check_set_up(args)   # an option the runner does not set up: the final reason, before the workload's own rules
    case = resolve(request_from_args(args), notes := [])
    answer(case)  # the layout's rules, before any GPU is touched
    _say(notes)
    if args.backend == "megatron":   # what the runner refuses (model, precision, layout): before any GPU is looked for
        reason = megatron_unsupported(case.model, case.workload, case.layout)
        if reason:
            raise megatron_refused(reason)
    hardware = profile(args)
    check_profile_gpu(hardware, case.gpu)
    runner = make_runner(args, hardware)
    spec = TrialSpec(case, steps=args.steps, window=measured_window(args.steps))
    if dry_run:  # the job as submit_job would get it; no Ray connection, nothing submitted
        request = runner.job_request(spec)
        p = runner.predict(case, hardware)
        if not p.fits:   # a job a user may submit as printed: say first that it is not expected to fit
            note = f"predicted {p.fit_label} ({p.peak_memory_gib:.1f} of {p.gpu_memory_gib:.1f} GiB): " \
                   f"{'; '.join(p.reasons)}"
            request["notes"].append(note)
            print(f"tune: warning: {case.layout.label}: {note}", file=sys.stderr)
        print(json.dumps(request, indent=2))
        return 0
    result = runner.run(spec)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"{case.layout.long_label}: {result.summary()}")
    return 0 if result.status == "ok" else 1
