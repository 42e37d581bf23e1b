"""Issue 29, part C: hostile storages and studies. A storage that keeps nothing is refused before any work; a
PostgreSQL server that accepts the connection and then says nothing ends the command in one line within a
bound; a storage password is never printed; one malformed trial attribute never gives a traceback in `tune
show`, `tune export` or `tune report` (tuner.trial_record says the rule)."""
from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "2", "--trials", "1", "--no-progress", "--top", "0"]
SECRET = "s3cret-Pw"


def one_line(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("tune: error: "), (code, lines)
    return out + err


# ---------------------------------------------------------------- storages that keep nothing

@pytest.mark.parametrize("storage", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:",
                                     "sqlite+pysqlite://", "SQLite://", "sqlite:///file:m?mode=memory&uri=true",
                                     "sqlite:///s.db?mode=memory&uri=true", "sqlite:///:memory:?cache=shared"])
@pytest.mark.parametrize("command", ["run", "show", "export", "report"])
def test_a_storage_that_keeps_nothing_is_refused_before_any_work(tmp_path, capsys, monkeypatch, no_scoring, storage,
                                                                 command):
    monkeypatch.chdir(tmp_path)
    argv = {"run": RUN, "show": ["show", "--study", "s"], "export": ["export", "--study", "s", "--out", "o"],
            "report": ["report", "--study", "s", "--out", "o"]}[command]
    text = one_line(capsys, main([*argv, "--storage", storage]))
    assert "keeps nothing" in text or "options ('?...')" in text, text
    assert not list(tmp_path.iterdir())            # no file, no cache folder, no output folder


def test_the_default_driver_spelled_out_is_one_sqlite_file(tmp_path, capsys):
    from tuner.storages import storage_url

    assert storage_url("sqlite+pysqlite:///x.db") == storage_url("SQLITE:///x.db") == "sqlite:///x.db"
    assert storage_url("postgres://u@h/db") == "postgresql://u@h/db"


# ---------------------------------------------------------------- servers that never answer

def _message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


class QuietServer:
    """A local TCP server that accepts every connection and never answers (`handshake=False`), or that completes
    PostgreSQL's start-up (no SSL, no password asked, ready for a query) and then never answers a query."""

    def __init__(self, handshake: bool):
        self.handshake = handshake
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.handshake:
                threading.Thread(target=self._start_up, args=(conn,), daemon=True).start()

    def _start_up(self, conn):
        try:
            while True:
                size = struct.unpack("!i", conn.recv(4, socket.MSG_WAITALL))[0]
                code = struct.unpack("!i", conn.recv(size - 4, socket.MSG_WAITALL)[:4])[0]
                if code in (80877103, 80877104):   # SSL or GSS encryption asked: not here
                    conn.sendall(b"N")
                    continue
                break
            reply = _message(b"R", struct.pack("!i", 0))   # authentication ok
            for key, value in (("server_version", "16.0"), ("server_encoding", "UTF8"), ("client_encoding", "UTF8"),
                               ("DateStyle", "ISO, MDY"), ("integer_datetimes", "on"),
                               ("standard_conforming_strings", "on")):
                reply += _message(b"S", f"{key}\0{value}\0".encode())
            conn.sendall(reply + _message(b"K", struct.pack("!ii", 1, 2)) + _message(b"Z", b"I"))
            while conn.recv(65536):   # reads every query, answers none
                pass
        except (OSError, struct.error):
            pass

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


def _tune(argv: list[str], timeout_s: float, patch: str = "") -> tuple[subprocess.CompletedProcess, float]:
    """`tune ARGV` in a subprocess (after `patch`, Python run first); its result and wall time. Past `timeout_s`
    it is killed and the test fails: the command hung."""
    program = f"import sys; {patch + '; ' if patch else ''}from tuner.cli import main; sys.exit(main(sys.argv[1:]))"
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", program, *argv], capture_output=True, text=True,
                              timeout=timeout_s, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"tune {' '.join(argv[:1])} still ran after {timeout_s} s: it hangs on a server that never answers")
    return done, time.monotonic() - started


SHORT_TIMEOUTS = "import tuner.storages as s; s.POSTGRES_CONNECT_TIMEOUT_S = s.POSTGRES_READ_TIMEOUT_S = 3"


@pytest.mark.slow
@pytest.mark.parametrize("handshake", [False, True], ids=["no answer to the connection", "no answer to a query"])
@pytest.mark.parametrize("command", ["run", "show"])
def test_a_server_that_never_answers_ends_the_command_in_one_line(tmp_path, handshake, command):
    server = QuietServer(handshake)
    url = f"postgresql://attune:{SECRET}@127.0.0.1:{server.port}/studies"
    argv = (RUN if command == "run" else ["show", "--study", "s"]) + ["--storage", url]
    try:
        done, _ = _tune(argv, 120, SHORT_TIMEOUTS)   # 3 s timeouts: 120 s only guards a hang on a loaded machine
    finally:
        server.close()
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("tune: error: "), (done.returncode, err)
    assert "no answer from the server in 3 s" in err[0] and "Traceback" not in done.stderr
    assert SECRET not in done.stdout + done.stderr and "attune:***@" in err[0]


@pytest.mark.slow
def test_the_shipped_connect_timeout_ends_a_silent_connection(tmp_path):
    from tuner.storages import POSTGRES_CONNECT_TIMEOUT_S, POSTGRES_READ_TIMEOUT_S

    assert 0 < POSTGRES_CONNECT_TIMEOUT_S <= 20 and 0 < POSTGRES_READ_TIMEOUT_S <= 120
    server = QuietServer(handshake=False)
    try:
        done, took = _tune(["show", "--study", "s", "--storage", f"postgresql://a:{SECRET}@127.0.0.1:{server.port}/d"],
                           POSTGRES_CONNECT_TIMEOUT_S + 30)
    finally:
        server.close()
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"no answer from the server in {POSTGRES_CONNECT_TIMEOUT_S} s while connecting" in done.stderr
    assert SECRET not in done.stderr


# ---------------------------------------------------------------- passwords

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nothing listens there once closed: the connection is refused


@pytest.mark.parametrize("spelling", ["postgresql://attune:{p}@127.0.0.1:{port}/db",
                                      "postgres://attune:{p}@127.0.0.1:{port}/db",
                                      "postgresql+psycopg2://attune:{p}@127.0.0.1:{port}/db",
                                      "postgresql://attune@127.0.0.1:{port}/db?password={p}",
                                      "postgresql://attune:{p}@127.0.0.1:{port}/db?sslmode=disable&password={p}",
                                      "postgresql://attune:a@{p}@127.0.0.1:{port}/db",
                                      "postgresql://attune:{p}/x@127.0.0.1:{port}/db",
                                      "postgresql://attune:{p}@127.0.0.1:notaport/db"])
@pytest.mark.parametrize("command", ["run", "show", "export", "report"])
def test_a_password_is_never_printed(tmp_path, capsys, monkeypatch, spelling, command):
    monkeypatch.chdir(tmp_path)
    url = spelling.format(p=SECRET, port=_closed_port())
    argv = {"run": RUN, "show": ["show", "--study", "s"], "export": ["export", "--study", "s", "--out", "o"],
            "report": ["report", "--study", "s", "--out", "o"]}[command]
    text = one_line(capsys, main([*argv, "--storage", url]))
    assert SECRET not in text and "***" in text, text


def test_shown_masks_every_spelling_of_a_password():
    from tuner.storages import masked, shown

    assert shown("postgresql://attune:s3cret@db:5432/studies") == "postgresql://attune:***@db:5432/studies"
    assert shown("postgresql://u:p@ss/w@db/x?password=p@ss/w&sslmode=require") == \
        "postgresql://u:***@db/x?password=***&sslmode=require"
    assert shown("sqlite:///home/u:x@y.db") == "sqlite:///home/u:x@y.db"   # a file name, not a password
    url = "postgresql://u:p%40ss@db/x"
    assert masked("failed for p@ss and p%40ss at " + url, url) == "failed for *** and *** at postgresql://u:***@db/x"


@pytest.mark.slow
def test_a_real_postgresql_study_never_prints_its_password(tmp_path):
    """postgresql:// (the README's spelling) reaches the server with the installed driver, and the password
    appears in no line of `tune`, `show`, `export` or `report` nor in any file they write."""
    sys.path.insert(0, str(Path(__file__).parent))
    import postgres_server

    reason = postgres_server.why_not()
    if reason:
        pytest.skip(reason)
    server = postgres_server.Server()
    url = server.start().replace("postgresql+psycopg2://attune@", f"postgresql://attune:{SECRET}@")
    try:
        commands = [[*RUN[:-1], "1", "--study", "s", "--out", str(tmp_path / "r")],
                    ["show", "--study", "s"], ["show", "--study", "s", "--format", "csv"],
                    ["export", "--study", "s", "--out", str(tmp_path / "x")],
                    ["report", "--study", "s", "--out", str(tmp_path / "h")]]
        for argv in commands:
            done, _ = _tune([*argv, "--storage", url], 300)
            assert done.returncode == 0, done.stderr
            assert SECRET not in done.stdout + done.stderr
        assert "attune:***@127.0.0.1" in _tune([*RUN, "--study", "s", "--storage", url], 300)[0].stderr
    finally:
        server.stop()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]


# ---------------------------------------------------------------- one malformed trial attribute

MEASURED_DETAILS = {"model_run": {"name": "qwen3-30b-a3b", "layers": 48}, "notes": [], "window": [5, 19],
                    "runner": "slime", "optimizer": "adam", "steps_run": 20, "global_batch_rows": 128, "seq_len": 8192}
DELETE = object()
# (attribute path, stored value, whether the trial is left out of the ranking); "measured:" makes the trial a
# measured one first (export then reads its runner's details).
CORRUPTIONS = [
    ("layout", "garbage", True), ("layout", {"world_size": "8", "tp": 1}, True), ("layout.tp", "x", True),
    ("layout", DELETE, True), ("result", "not a record", True), ("result", [1, 2], True), ("result.kind", 7, True),
    ("result.kind", "bogus", True), ("result.status", 3, True), ("result.source", {"x": 1}, True),
    ("result.tokens_per_s_per_gpu", "fast", False), ("result.tokens_per_s_per_gpu", DELETE, False),
    ("result.peak_memory_gib", "x", False), ("result.mfu", {"a": 1}, False), ("result.step_time_s", True, False),
    ("result.usd_per_million_tokens", [1], False),
    ("measured:result.details", "garbage", True), ("measured:result.details.model_run", "x", True),
    ("measured:result.details.window", "x", True), ("measured:result.details.notes", 5, True),
    ("measured:result.failure_class", 5, True), ("measured:result.step_times_s", 5, False),
    ("measured:result.tokens_per_s_per_gpu", "x", False), ("measured:result.gpu_hours", "x", False),
    ("prediction", "garbage", False), ("prediction.interval", "x", False), ("prediction.interval.low", "x", False),
    ("prediction.interval.quantiles", [[1], "x"], False), ("prediction.breakdown", "x", False),
    ("prediction.breakdown.compute_mlp", "x", False), ("prediction.tokens_per_s_per_gpu", "x", False),
    ("prediction.fit_verdict", 5, False), ("prediction.fit_probability", "x", False),
    ("prediction.gpu_memory_gib", "x", False), ("hypothesis_weights", "x", False),
    ("hypothesis_weights.per_token flex 1", "x", False), ("label", 5, False), ("rationale", {"x": 1}, False),
    ("prune_reason", 5, False), ("learnt", 5, False),
]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A 3-trial predicted study 's' in base.db (made once)."""
    folder = tmp_path_factory.mktemp("base")
    code = main([*RUN, "--trials", "3", "--storage", str(folder / "base.db"), "--study", "s"])
    assert code == 0
    return folder / "base.db"


def with_corruption(attrs: dict, path: str, value) -> dict:
    """A copy of a trial's attributes whose attribute `path` is `value` ("measured:": made a measured trial first)."""
    import copy

    attrs = copy.deepcopy(attrs)
    if path.startswith("measured:"):
        path = path.removeprefix("measured:")
        attrs["result"].update(kind="measured", source="test runner", gpu_hours=0.5, details=dict(MEASURED_DETAILS))
        attrs["backend"] = "slime"
    *parents, last = path.split(".")
    node = attrs
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return attrs


def copied_study(base: Path, folder: Path):
    """A copy of the base study in `folder`: its file and the study."""
    import shutil

    import optuna

    db = folder / "s.db"
    shutil.copy(base, db)
    return db, optuna.load_study(study_name="s", storage=f"sqlite:///{db}")


def add_corrupted(study, path: str, value) -> int:
    """One more complete trial, the best by far, a copy of the first whose attribute `path` is `value`; its number."""
    import optuna
    from optuna.trial import TrialState

    attrs = with_corruption(study.trials[0].user_attrs, path, value)
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=99_999.0, user_attrs=attrs))
    return len(study.trials) - 1


def corrupted(base: Path, folder: Path, path: str, value) -> tuple[Path, int]:
    """A copy of the study with one corrupted trial (`add_corrupted`); the copy and that trial's number."""
    db, study = copied_study(base, folder)
    return db, add_corrupted(study, path, value)


def _command(command: str, folder: Path) -> list[str]:
    return {"show": ["show"], "show csv": ["show", "--format", "csv"],
            "export": ["export", "--out", str(folder / "recipes")],
            "report": ["report", "--out", str(folder / "report")]}[command]


# `show csv` reads as `show` does: its cases run in the full suite only (show, export: in both); `report` draws six
# figures (about 1.5 s a study): every corruption is a trial of one study it reports once (the test below)
@pytest.mark.parametrize("command", ["show", pytest.param("show csv", marks=pytest.mark.slow), "export"])
@pytest.mark.parametrize("path,value,left_out", CORRUPTIONS,
                         ids=[f"{p}={'deleted' if v is DELETE else repr(v)[:12]}" for p, v, _ in CORRUPTIONS])
def test_one_malformed_attribute_is_one_warning_naming_the_trial(tuned, tmp_path, capsys, command, path, value,
                                                                left_out):
    db, number = corrupted(tuned, tmp_path, path, value)
    code = main([*_command(command, tmp_path), "--study", "s", "--storage", str(db)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    attribute = path.removeprefix("measured:")
    assert code == 0 and len(lines) == 1, (code, lines)
    named = lines[0].removeprefix(f"tune: warning: trial {number}: {attribute}")   # or a field inside it
    assert named != lines[0] and named[:1] in (" ", ".", "["), lines[0]
    assert lines[0].endswith("left out of the ranking") == left_out, lines[0]
    if command == "show" and left_out:
        assert "99,999" not in out and f"  {number}  " not in out   # not ranked
    elif command == "show":
        assert "99,999" in out                                   # ranked, the malformed figure shown as '-'
    if command == "show csv":
        assert f"\n{number},complete," in out                    # its record stays, with what could be read
    if command == "export":
        assert out.strip() and all(Path(p).is_file() for p in out.split())
        recipes = "".join(Path(p).read_text() for p in out.split() if p.endswith(".yaml"))
        assert ("99999" in recipes) == (not left_out and attribute.startswith("result") and "measured:" in path)


@pytest.mark.slow
def test_a_report_names_each_malformed_trial_once(tuned, tmp_path, capsys):
    """Every corruption above as a trial of one study: `report` warns once per malformed trial, naming it and the
    attribute, leaves out of the ranking what it cannot rank, and lists every trial on its page."""
    db, study = copied_study(tuned, tmp_path)
    expected = {add_corrupted(study, path, value): (path.removeprefix("measured:"), left_out)
                for path, value, left_out in CORRUPTIONS}
    code = main([*_command("report", tmp_path), "--study", "s", "--storage", str(db)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 0 and len(lines) == len(CORRUPTIONS), lines
    page = (tmp_path / "report" / "index.html").read_text()
    for number, (attribute, left_out) in expected.items():
        mine = [line for line in lines if line.startswith(f"tune: warning: trial {number}: ")]
        assert len(mine) == 1, (number, lines)
        named = mine[0].removeprefix(f"tune: warning: trial {number}: {attribute}")
        assert named != mine[0] and named[:1] in (" ", ".", "["), mine[0]
        assert mine[0].endswith("left out of the ranking") == left_out, mine[0]
        assert f'<td class="num">{number}</td>' in page


@pytest.mark.parametrize("table,key", [("trial_user_attributes", "result"), ("trial_user_attributes", "layout"),
                                       ("trial_system_attributes", None), ("trial_params", None)])
@pytest.mark.parametrize("command", ["show", "export", "report"])
def test_an_attribute_that_is_not_json_is_one_line_naming_the_trial(tuned, tmp_path, capsys, table, key, command):
    import sqlite3

    db, number = corrupted(tuned, tmp_path, "learnt", "fine")
    with sqlite3.connect(db) as c:
        column = "distribution_json" if table == "trial_params" else "value_json"
        name = "param_name" if table == "trial_params" else "key"
        if table == "trial_params":   # the trial made by hand has no parameters: the first tuned one has
            number = 0
        trial_id = c.execute("SELECT trial_id FROM trials WHERE number = ?", (number,)).fetchone()[0]
        if key is None:
            if table == "trial_system_attributes":
                c.execute(f"INSERT INTO {table} (trial_id, key, value_json) VALUES (?, 'fixed_params', '{{x')",
                          (trial_id,))
                key = "fixed_params"
            else:
                key = c.execute(f"SELECT {name} FROM {table} WHERE trial_id = ?", (trial_id,)).fetchone()[0]
        c.execute(f"UPDATE {table} SET {column} = '{{not json' WHERE trial_id = ? AND {name} = ?", (trial_id, key))
    before = db.read_bytes()
    text = one_line(capsys, main([*_command(command, tmp_path), "--study", "s", "--storage", str(db)]))
    assert f"trial {number}'s" in text and f" {key} is not JSON" in text and "Traceback" not in text
    assert db.read_bytes() == before


@pytest.mark.parametrize("command", ["show", "show csv", "export", pytest.param("report", marks=pytest.mark.slow)])
def test_an_objective_stored_as_text_is_one_warning_and_not_ranked(tuned, tmp_path, capsys, command):
    import sqlite3

    db, number = corrupted(tuned, tmp_path, "learnt", "fine")
    with sqlite3.connect(db) as c:
        c.execute("UPDATE trial_values SET value = 'fast' WHERE trial_id = "
                  "(SELECT trial_id FROM trials WHERE number = ?)", (number,))
    code = main([*_command(command, tmp_path), "--study", "s", "--storage", str(db)])
    out, err = capsys.readouterr()
    assert code == 0 and err.strip().splitlines() == [
        f"tune: warning: trial {number}: value is not a number; read as missing; the trial is left out of the ranking"]
    assert "99,999" not in out and "fast" not in out


STUDY_CONFIG_CORRUPTIONS = [("workload", "x"), ("workload", {"seq_len": 8192, "bogus": 1}), ("stack", [1]),
                            ("gpus", "x"), ("gpus", 0), ("usd_per_gpu_hour", "q")]


@pytest.mark.parametrize("field,value", STUDY_CONFIG_CORRUPTIONS,
                         ids=[f"{f}={str(v)[:10]}" for f, v in STUDY_CONFIG_CORRUPTIONS])
def test_a_malformed_study_config_is_one_line_naming_the_field_and_nothing_exported(tuned, tmp_path, capsys, field,
                                                                                   value):
    import shutil

    import optuna

    db = tmp_path / "s.db"
    shutil.copy(tuned, db)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    study.set_user_attr("config", {**study.user_attrs["config"], field: value})
    code = main(["export", "--study", "s", "--storage", str(db), "--out", str(tmp_path / "recipes")])
    line = one_line(capsys, code)
    assert "study 's'" in line and (field in line or "stored config" in line), line
    assert not (tmp_path / "recipes").exists()


@pytest.mark.slow
@pytest.mark.parametrize("path,value", [("result", "x"), ("result.kind", 5), ("result.tokens_per_s_per_gpu", "x"),
                                        ("layout", "garbage")], ids=["result", "kind", "figure", "layout"])
def test_a_study_with_a_malformed_trial_resumes_with_one_warning_naming_it(tuned, tmp_path, capsys, path, value):
    db, number = corrupted(tuned, tmp_path, path, value)
    code = main([*RUN, "--storage", str(db), "--study", "s"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err[-400:]
    assert any(line.startswith(f"tune: warning: trial {number}: ") for line in err.splitlines()), err[-400:]
