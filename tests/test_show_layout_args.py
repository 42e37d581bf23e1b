"""tune show's rows can be priced again: `layout_args` is the layout as `tune predict --layout` takes it."""
import json

from tuner.cli import main


def test_a_shown_rows_layout_args_predict_its_figure(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    target = ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2"]
    assert main([*target, "--trials", "2", "--storage", url, "--out", str(tmp_path / "o"), "--no-progress",
                 "--top", "0"]) == 0
    capsys.readouterr()
    assert main(["show", "--storage", url, "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    rows = shown["trials"] if isinstance(shown, dict) else shown
    row = next(r for r in rows if r["state"] == "complete")
    assert "max_tokens_per_gpu=" in row["layout_args"] and "rows_per_microbatch=" in row["layout_args"]
    assert main(["predict", *target, "--json", "--layout", *row["layout_args"].split()]) == 0
    again = json.loads(capsys.readouterr().out)
    assert round(again["headline_tokens_per_s_per_gpu"]) == round(row["tokens_per_s_per_gpu"])
    assert again["label"] == row["label"].split(" | mt")[0] or row["label"].startswith(again["label"].split(" |")[0])
