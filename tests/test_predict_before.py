"""benchmarks/predict_before.py: the predictions registered for a runner suite before it runs."""
import json

from benchmarks.predict_before import main


def test_a_layout_the_runner_refuses_is_named_not_predicted(tmp_path, capsys):
    suite = {"gpu": "h100", "defaults": {"steps": 5}, "trials": [
        {"name": "ok-r4", "gpus": 1, "model": "llama3-8b", "seq_len": 4096, "global_batch": 48, "layers": 2,
         "layout": {"max_tokens_per_gpu": 16384, "rows_per_microbatch": 4}},
        {"name": "bad-r5", "gpus": 1, "model": "llama3-8b", "seq_len": 4096, "global_batch": 48, "layers": 2,
         "layout": {"max_tokens_per_gpu": 20480, "rows_per_microbatch": 5}}]}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    assert main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# on 1 x H100 (the suite's gpu), from its shipped profile"
    ok = next(line for line in lines if line.startswith("ok-r4"))
    assert float(ok.split()[1]) > 0 and ok.rstrip().endswith(("fits", "borderline", "does not fit"))
    bad = next(line for line in lines if line.startswith("bad-r5"))
    assert "refused" in bad and "not divisible by DP 1 x 5 rows per micro-batch" in bad
