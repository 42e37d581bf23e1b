"""A `tune` process (the script for `python -c`) whose predicted runner holds its n-th trial: it prints BLOCKING,
then runs `hold` (Python lines; os, sys and time imported), then prices the trial as usual. For tests that stop a
tuner mid-trial (a kill, a reader that leaves)."""


def blocking_tuner(call: int, hold: list[str]) -> str:
    return "\n".join([
        "import os, sys, time",
        "import experiments.predicted_runner as pr",
        'calls = {"n": 0}',
        "real = pr.PredictedRunner.run",
        "def run(self, spec):",
        '    calls["n"] += 1',
        f'    if calls["n"] == {call}:',
        '        print("BLOCKING", flush=True)',
        *(f"        {line}" for line in hold),
        "    return real(self, spec)",
        "pr.PredictedRunner.run = run",
        "from tuner.cli import main",
        "sys.exit(main(sys.argv[1:]))",
    ]) + "\n"
