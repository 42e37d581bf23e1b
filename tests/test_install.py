"""After the install this test runs in, `tune`, `attune` and `python -m tuner` are attune's command.

Ray's wheel ships a `tune` script too (Ray Tune), and whichever package pip installs last owns bin/tune:
the Makefile re-installs attune's scripts after every install that may bring Ray in. A missing script
fails here (it is never skipped): the install did not put it where the venv's Python looks.
"""
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.prefix) / "bin"
ATTUNE_HELP = "Find the fastest training layout"
COMMANDS = {"tune": [str(BIN / "tune")], "attune": [str(BIN / "attune")], "python -m tuner": [sys.executable, "-m",
                                                                                               "tuner"]}


@pytest.mark.parametrize("name", COMMANDS)
def test_command_is_attunes(name, tmp_path):
    command = COMMANDS[name]
    assert Path(command[0]).is_file(), (f"{command[0]} is missing: install the project into this environment "
                                        f"(make setup, or pip install -e .)")
    # Run from an empty folder: the installed package must answer, not a checkout on the working directory.
    proc = subprocess.run([*command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and ATTUNE_HELP in out and out.startswith("usage: tune "), (
        f"`{name} --help` is not attune's (Ray Tune's `tune` installed after attune?); re-assert attune's scripts "
        f"with: pip install --no-deps --force-reinstall -e .\n{out[:2000]}")
