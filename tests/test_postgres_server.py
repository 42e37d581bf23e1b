"""The throwaway PostgreSQL server of the multi-worker tests does not outlive a test run stopped hard (issue 30:
a stopped suite left its server running)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import postgres_server

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_server_whose_test_run_was_killed_is_stopped_and_removed():
    reason = postgres_server.why_not()
    if reason:
        pytest.skip(reason)
    starter = ("import sys; sys.path.insert(0, sys.argv[1]); import postgres_server, time\n"
               "s = postgres_server.Server(); url = s.start(); print(s.port, s.dir, flush=True); time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", starter, str(HERE)], stdout=subprocess.PIPE, text=True)
    port, folder = p.stdout.readline().split()
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5):
        pass   # the server answers
    os.kill(p.pid, signal.SIGKILL)   # no teardown runs
    p.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (Path(folder).exists() or _answers(int(port))):
        time.sleep(0.5)
    assert not _answers(int(port)) and not Path(folder).exists()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
