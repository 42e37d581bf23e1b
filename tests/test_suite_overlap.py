"""benchmarks/suite_overlap.py: a suite's trials that repeat stored runs (what v35 did unnoticed) are named before
it is registered as held out."""
import json

from benchmarks.suite_overlap import overlaps


def _suite(path, trials, gpu="h100"):
    path.write_text(json.dumps({"gpu": gpu, "defaults": {"steps": 5, "window": [2, 4]}, "trials": trials}))
    return path


def _trial(name, rows, seq=4096, layers=2, model="qwen3-30b-a3b", **layout):
    return {"name": name, "gpus": 1, "model": model, "seq_len": seq, "global_batch": 24, "layers": layers,
            "layout": {"max_tokens_per_gpu": seq * rows, "rows_per_microbatch": rows, **layout}}


def test_a_repeated_layout_and_a_seen_shape_are_named_and_a_new_shape_is_not(tmp_path):
    old = _suite(tmp_path / "old_suite.json", [_trial("a-r1", 1), _trial("a-r2", 2)])
    results = tmp_path / "old.jsonl"
    results.write_text("\n".join(json.dumps({"trial": n, "status": "failed", "failure_class": "cuda_oom"})
                                 for n in ("a-r1", "a-r2")) + "\n")
    new = _suite(tmp_path / "new_suite.json", [
        _trial("b-r2", 2),                      # the same run under another name
        _trial("b-r4", 4),                      # another layout of a shape that ran
        _trial("b-r2-seq", 2, seq=8192),        # another sequence length: a new shape
        _trial("b-r2-l3", 2, layers=3),         # another layer count: a new shape
    ])
    found = {name: (kind, [s.trial for s in stored]) for name, kind, stored in overlaps(new, [(old, results)])}
    assert found == {"b-r2": ("same run", ["a-r2"]), "b-r4": ("same shape", ["a-r1", "a-r2"])}
    # on another GPU type nothing ran
    other_gpu = _suite(tmp_path / "h200_suite.json", [_trial("c-r2", 2)], gpu="h200")
    assert overlaps(other_gpu, [(old, results)]) == []
    # a suite's own results, once it has run, are no repeat of it
    assert overlaps(old, [(old, results)]) == []
