"""Storages and profiles tune must not use: refused in one line with exit 2, and nothing written to them
(a new user's paths: another program's SQLite file, an empty file, a '?' in a file name, a corrupt
database, a study Optuna made without tune, a profile of another GPU, a reader that leaves the pipe)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tuner.cli import main

TARGET = ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2"]   # a space scored in under a second
RUN = [*TARGET, "--trials", "1", "--no-progress", "--top", "0"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_another_programs_sqlite_file_is_neither_read_as_a_storage_nor_written(tmp_path, capsys):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    before = path.read_bytes()
    assert main(["show", "--study", "x", "--storage", str(path)]) == 2
    assert "not an Optuna study storage (tables: users)" in one_line(capsys)
    assert main([*RUN, "--storage", str(path)]) == 2
    assert "not an Optuna study storage" in one_line(capsys)
    assert path.read_bytes() == before


def test_a_schema_another_tuner_is_creating_is_joined_not_refused(tmp_path, capsys):
    """SQLite creates Optuna's tables one by one, each visible at once: a tuner that opens the file between two
    of them sees some of Optuna's tables only (three workers starting on a new file: a clean clone's CI run
    refused one of them). Such a file is Optuna's; a file with any table of another program is still refused."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    path = tmp_path / "partial.db"
    models.BaseModel.metadata.tables["studies"].create(sa.create_engine(f"sqlite:///{path}"))
    assert main([*RUN, "--storage", str(path)]) == 0
    (name,) = optuna.get_all_study_names(storage=f"sqlite:///{path}")
    assert len(optuna.load_study(study_name=name, storage=f"sqlite:///{path}").trials) == 1
    mixed = tmp_path / "mixed.db"
    models.BaseModel.metadata.tables["studies"].create(sa.create_engine(f"sqlite:///{mixed}"))
    with sqlite3.connect(mixed) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    capsys.readouterr()
    assert main([*RUN, "--storage", str(mixed)]) == 2
    assert "not an Optuna study storage (tables: studies, users)" in one_line(capsys)


def test_an_empty_file_is_not_a_study_to_show(tmp_path, capsys):
    path = tmp_path / "e.db"
    path.touch()
    assert main(["show", "--study", "x", "--storage", str(path)]) == 2
    assert "is empty" in one_line(capsys)
    assert path.stat().st_size == 0


def test_storage_names_that_are_not_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--storage", "q?x.db"]) == 2
    assert "'?' or '#'" in one_line(capsys)
    assert main(["show", "--study", "x", "--storage", ""]) == 2
    assert "--storage is empty" in one_line(capsys)
    assert not list(tmp_path.iterdir())


def test_a_corrupt_database_and_a_foreign_study_fail_in_one_line(tmp_path, capsys):
    url = tmp_path / "s.db"
    assert main([*RUN, "--storage", str(url), "--study", "mine"]) == 0
    capsys.readouterr()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="foreign", storage=f"sqlite:///{url}").optimize(lambda t: t.suggest_float("x", 0, 1),
                                                                                   n_trials=1)
    for command in (["show"], ["report", "--out", str(tmp_path / "r")]):
        assert main([*command, "--study", "foreign", "--storage", str(url)]) == 2
        assert "was not created by tune" in one_line(capsys)
    data = bytearray(url.read_bytes())
    for offset in range(4096, len(data), 4096):   # every page after the first: the schema stays readable
        data[offset:offset + 64] = b"\xa5" * 64
    url.write_bytes(bytes(data))
    for command in (["show"], ["export", "--out", str(tmp_path / "x")], ["report", "--out", str(tmp_path / "r2")]):
        assert main([*command, "--study", "mine", "--storage", str(url)]) == 2
        assert "malformed" in one_line(capsys)


KILLED_WRITER = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("CREATE TABLE scratch (x BLOB)")
for _ in range(2000):   # more pages than the cache holds: changed pages reach the file, the journal is hot
    db.execute("INSERT INTO scratch VALUES (?)", (os.urandom(4000),))
os._exit(9)             # killed mid-transaction (SIGKILL, a crash, a power cut)
"""


@pytest.mark.slow
def test_a_study_whose_writer_was_killed_mid_transaction_resumes(tmp_path, capsys):
    """SQLite rolls a hot journal back when the file is next opened read-write; the check that a file is a study
    reads it read-only, which cannot, and once refused such a study with 'attempt to write a readonly database'."""
    url = tmp_path / "s.db"
    assert main([*RUN, "--storage", str(url), "--study", "s"]) == 0
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(url)], check=False, timeout=120)
    assert Path(f"{url}-journal").stat().st_size > 0
    capsys.readouterr()
    assert main(["show", "--study", "s", "--storage", str(url)]) == 0
    assert main([*RUN, "--storage", str(url), "--study", "s"]) == 0, capsys.readouterr().err
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{url}").trials) == 2
    with sqlite3.connect(url) as db:
        assert not db.execute("SELECT name FROM sqlite_master WHERE name = 'scratch'").fetchall()


def test_a_profile_of_another_gpu_is_refused(tmp_path, capsys):
    derived = tmp_path / "b200.yaml"
    assert main(["profile", "--derive", "b200", "--out", str(derived)]) == 0
    capsys.readouterr()
    assert main(["predict", *TARGET, "--profile", str(derived)]) == 2
    assert "a profile of b200" in one_line(capsys)
    assert main([*RUN, "--profile", str(derived), "--storage", str(tmp_path / "s.db")]) == 2
    assert "a profile of b200" in one_line(capsys)
    assert not (tmp_path / "s.db").exists()
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "8", "--profile", str(derived)]) == 0


def test_a_reader_that_leaves_the_pipe_gets_no_traceback():
    tune = [sys.executable, "-c", "import sys; from tuner.cli import main; sys.exit(main())", "models"]
    producer = subprocess.Popen(tune, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=Path(__file__).resolve().parents[1])
    producer.stdout.close()      # the reader is gone before tune writes (as `| head -0` would be)
    err = producer.stderr.read().decode()
    producer.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.slow
def test_two_config_folders_of_one_name_are_two_studies(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
    for folder, layers in (("m1", 32), ("x/m1", 16)):
        Path(folder).mkdir(parents=True)
        Path(folder, "config.json").write_text(json.dumps(dict(config, num_hidden_layers=layers)))
    args = ["--gpu", "h100", "--gpus", "4", "--trials", "1", "--no-progress", "--top", "0", "--storage", "s.db"]
    assert main(["--model", "m1", *args]) == 0
    capsys.readouterr()
    assert main(["--model", "x/m1", *args]) == 2
    assert "architecture:" in one_line(capsys)
    assert main(["--model", "m1", *args]) == 0   # the same config resumes its study


@pytest.mark.parametrize("value", ["sqlite://", "sqlite:///:memory:", "sqlite:///"])
def test_an_in_memory_storage_is_refused_before_anything_runs(value):
    from tuner.study import StudyError, storage_url

    with pytest.raises(StudyError, match="keeps nothing once tune exits"):
        storage_url(value)


@pytest.mark.slow
def test_a_postgresql_password_is_never_printed(tmp_path, monkeypatch):
    import socket

    import tuner.storages
    from tuner.study import StudyError, open_storage, shown

    # the shipped 15 s connect timeout is test_hostile_storage's (slow) test; here the message is what counts
    monkeypatch.setattr(tuner.storages, "POSTGRES_CONNECT_TIMEOUT_S", 2)

    assert shown("postgresql://attune:s3cret@db:5432/studies") == "postgresql://attune:***@db:5432/studies"
    # a server that accepts the connection and never answers: one line within the connect timeout, no password
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        with pytest.raises(StudyError) as err:
            open_storage(f"postgresql://attune:s3cret@127.0.0.1:{port}/studies")
    finally:
        server.close()
    assert "s3cret" not in str(err.value) and "***" in str(err.value)


SMALL_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
               "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 32,
               "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}


def tuned_small_llama(tmp_path, monkeypatch) -> list[str]:
    """A one-trial predicted study 's' in s.db of the model in ./m1/config.json; the tune arguments."""
    import json

    monkeypatch.chdir(tmp_path)
    Path("m1").mkdir()
    Path("m1", "config.json").write_text(json.dumps(SMALL_LLAMA))
    args = ["--model", "m1", "--gpu", "h100", "--gpus", "4", "--trials", "1", "--no-progress", "--top", "0",
            "--storage", "s.db", "--study", "s"]
    assert main(args) == 0
    return args


@pytest.mark.slow
def test_export_refuses_a_config_changed_after_tuning(tmp_path, capsys, monkeypatch):
    import json

    tuned_small_llama(tmp_path, monkeypatch)
    assert main(["export", "--study", "s", "--storage", "s.db", "--out", "r1"]) == 0
    capsys.readouterr()
    Path("m1", "config.json").write_text(json.dumps(dict(SMALL_LLAMA, num_hidden_layers=4)))   # edited after tuning
    assert main(["export", "--study", "s", "--storage", "s.db", "--out", "r2"]) == 2
    assert "another model's" in one_line(capsys) and not Path("r2").exists()


@pytest.mark.slow
def test_export_from_another_folder_finds_the_config_json_the_study_was_tuned_on(tmp_path, capsys, monkeypatch):
    """`tune --model ./m1` records where m1 is; `tune export` run from another folder reads it there (and the
    digest check still holds it to the architecture tuned)."""
    tuned_small_llama(tmp_path, monkeypatch)
    capsys.readouterr()
    Path("elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["export", "--study", "s", "--storage", str(tmp_path / "s.db"), "--out", "r1"]) == 0
    assert list(Path("r1").rglob("*.yaml"))
    capsys.readouterr()
    (tmp_path / "m1" / "config.json").unlink()   # the recorded folder stays, its config.json is gone
    assert main(["export", "--study", "s", "--storage", str(tmp_path / "s.db"), "--out", "r2"]) == 2
    assert "the file it recorded does not load now" in one_line(capsys) and not Path("r2").exists()


@pytest.mark.slow
def test_export_of_a_config_json_study_elsewhere_takes_its_file(tmp_path, capsys, monkeypatch):
    tuned_small_llama(tmp_path, monkeypatch)
    capsys.readouterr()
    Path("m1").rename("moved")    # the study is exported from where its config.json folder is not
    assert main(["export", "--study", "s", "--storage", "s.db", "--out", "r1"]) == 2
    assert "pass that file with --model PATH" in one_line(capsys) and not Path("r1").exists()
    assert main(["export", "--study", "s", "--storage", "s.db", "--out", "r1", "--model", "moved/config.json"]) == 0
    assert list(Path("r1").rglob("*.yaml"))


@pytest.mark.slow
def test_a_trial_the_user_enqueued_runs_first(tmp_path, capsys, monkeypatch):
    from cost_model.nouns.layout import Layout
    from cost_model.nouns.layout_codec import to_optuna_params

    args = tuned_small_llama(tmp_path, monkeypatch)
    mine = Layout(4, tp=2, pp=2, max_tokens_per_gpu=8192)   # the user's current recipe, as a seed
    study = optuna.load_study(study_name="s", storage="sqlite:///s.db")
    study.enqueue_trial(to_optuna_params(mine))
    capsys.readouterr()
    assert main(args) == 0
    assert "interrupted" not in capsys.readouterr().err
    trials = optuna.load_study(study_name="s", storage="sqlite:///s.db").trials
    seeded = trials[1]
    assert seeded.state == optuna.trial.TrialState.COMPLETE and seeded.user_attrs["layout_key"] == mine.key()
    assert "enqueued by the user" in seeded.user_attrs["rationale"]


@pytest.mark.parametrize("url", ["journal:///tmp/j.log", "mysql://u:secret@host/x"])
def test_a_storage_scheme_tune_has_no_driver_for_is_named_not_a_library_plugin(url, tmp_path, capsys):
    assert main([*RUN, "--storage", url]) == 2
    line = one_line(capsys)
    assert "its scheme is not supported" in line and "postgresql://" in line and "secret" not in line, line


def test_a_profile_replaces_only_a_new_name_or_an_earlier_profile(tmp_path, capsys):
    """`tune profile --derive --out /dev/full` (as root) had replaced the device with a YAML file; a FIFO, a link
    or someone's config.json went the same way."""
    import os

    fifo, link, other, ok = tmp_path / "p.fifo", tmp_path / "l.yaml", tmp_path / "config.json", tmp_path / "p.yaml"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "target.yaml")
    other.write_text('{"model_type": "llama"}')
    for path, why in ((fifo, "is not a regular file"), (link, "is a symbolic link"),
                      (other, "is not a profile tune can read")):
        assert main(["profile", "--derive", "b200", "--out", str(path)]) == 2
        assert f"{path} {why}: not replaced" in one_line(capsys)
    assert fifo.is_fifo() and link.is_symlink() and not (tmp_path / "target.yaml").exists()
    assert other.read_text() == '{"model_type": "llama"}'
    assert main(["profile", "--derive", "b200", "--out", str(ok)]) == 0
    assert main(["profile", "--derive", "b200", "--out", str(ok)]) == 0   # an earlier profile is replaced


def test_a_profile_whose_aliases_stand_for_billions_of_values_is_refused_at_once(tmp_path, capsys):
    """A YAML alias bomb read fine (aliases share one object) until the main job's digest of the profile walked it
    out: a MemoryError after a minute. Shared values are counted once per container, the total bounded."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("gpu_type: h200\nlaughs: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &{'b' * (i + 1)} [" + ", ".join([f"*{'b' * i if i else 'a'}"] * 10) + "]\n" for i in range(9)))
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--layout", "ep=8", "--profile",
                 str(bomb)]) == 2
    assert "aliases stand for more than 10,000,000 values" in one_line(capsys)
    shared = tmp_path / "shared.yaml"   # an alias or two is no bomb: read as written out
    from cost_model.nouns.user_file import parse_yaml
    assert parse_yaml("a: &a [1, 2]\nb: *a\n", str(shared), ValueError) == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("edit, words", [
    (("builds", 0, "points", 0, "fwd_bwd_s", -0.023), "builds[0].points[0].fwd_bwd_s must be seconds above 0"),
    (("builds", 0, "points", 0, "fwd_bwd_s", 23333), "builds[0].points[0].fwd_bwd_s must be seconds above 0"),
    (("builds", 0, "points", 0, "fwd_bwd_s", "slow"), "fwd_bwd_s must be seconds above 0 and at most 3600, got 'slow'"),
    (("builds", 0, "points", 0, "optimizer_s", -70), "builds[0].points[0].optimizer_s must be seconds at least 0"),
    (("builds", 0, "layers", 0), "builds[0].layers must be a whole number of at least 1"),
    (("builds", 0, "params", -226504704), "builds[0].params must be a whole number of at least 1"),
    (("microbatches", 0), "runner_components.microbatches must be a whole number of at least 1"),
    (("seq_len", "fourk"), "runner_components.seq_len must be a whole number of at least 1"),
    (("cpu_adam_ranks", 0, "params_per_s_per_rank", -1), "cpu_adam_ranks[0].params_per_s_per_rank must be a positive"),
])
def test_a_runner_component_no_measurement_could_hold_is_named(tmp_path, capsys, edit, words):
    """Only the hardware sections' rates were checked: a negative or absurd build time changed the runner stack's
    prediction silently, a zero count ended in a ZeroDivisionError's text."""
    import yaml

    from cost_model.profile import shipped_profile

    data = shipped_profile("h200").raw
    data = yaml.safe_load(yaml.safe_dump(data))   # a copy to edit
    *path, key, value = edit
    node = data["runner_components"]
    for step in path:
        node = node[step]
    node[key] = value
    profile = tmp_path / "edited.yaml"
    profile.write_text(yaml.safe_dump(data))
    assert main(["predict", "--model", "llama3-8b", "--gpu", "h200", "--gpus", "1", "--stack", "megatron-runner",
                 "--layout", "max_tokens_per_gpu=8192", "--profile", str(profile)]) == 2
    assert words in one_line(capsys)


def test_a_profile_of_another_provenance_than_measured_or_derived_is_refused(tmp_path, capsys):
    text = (Path(__file__).resolve().parents[1] / "cost_model" / "data" / "profiles" / "h200.yaml").read_text()
    profile = tmp_path / "p.yaml"
    profile.write_text(text.replace("provenance: measured", "provenance: trust-me", 1))
    assert main(["predict", "--model", "llama3-8b", "--gpu", "h200", "--layout", "tp=8", "--profile",
                 str(profile)]) == 2
    assert "provenance must be measured or derived, got 'trust-me'" in one_line(capsys)
