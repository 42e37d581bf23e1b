"""A throwaway PostgreSQL server for the multi-worker study tests (Debian's `postgresql` package).

`start()` installs nothing: it looks for initdb/pg_ctl (PATH, /usr/lib/postgresql/*/bin), initialises a
cluster in a temporary folder owned by an unprivileged user (PostgreSQL refuses to run as root), starts
it on a free local port and returns its URL; `why_not()` says in one line why that cannot be done here.
Install the server with `apt-get install -y postgresql` and the driver with the test extra (psycopg2).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from free_ports import free_port_block


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def _user() -> str | None:
    if os.geteuid() != 0:
        return None   # run as ourselves
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return "missing"


def why_not() -> str | None:
    if _bin("initdb") is None or _bin("pg_ctl") is None:
        return "PostgreSQL server not installed (apt-get install -y postgresql)"
    if _user() == "missing":
        return "running as root and there is no 'postgres' user to run the server as"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "the psycopg2 driver is not installed (pip install psycopg2-binary)"
    return None


class Server:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="attune-pg-"))
        self.port = free_port_block(1)[0]
        self.user = _user()

    def _run(self, *argv: str) -> None:
        cmd = list(argv) if self.user is None else ["runuser", "-u", self.user, "--", *argv]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> str:
        data = self.dir / "data"
        if self.user is not None:
            shutil.chown(self.dir, self.user)
        self._run(_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "attune")
        self._run(_bin("pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200", "start")
        self._reap_when_gone(os.getpid())
        self._run(_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "attune", "attune")
        return f"postgresql+psycopg2://attune@127.0.0.1:{self.port}/attune"

    def _reap_when_gone(self, pid: int) -> None:
        """A test run stopped hard (SIGKILL, a closed terminal) runs no teardown: a detached watcher stops the server
        and removes its folder once the process that started it is gone (after `stop`, it finds nothing to do)."""
        stop = [_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"]
        if self.user is not None:
            stop = ["runuser", "-u", self.user, "--", *stop]
        watch = ("import os, shutil, subprocess, sys, time\n"
                 "while os.path.exists(f'/proc/{sys.argv[1]}'): time.sleep(0.5)\n"
                 "subprocess.run(sys.argv[3:], capture_output=True, timeout=120)\n"
                 "shutil.rmtree(sys.argv[2], ignore_errors=True)\n")
        subprocess.Popen([sys.executable, "-c", watch, str(pid), str(self.dir), *stop], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
