"""A `tune` worker whose trials take `ATTUNE_TEST_TRIAL_S` seconds (the cost model answers, then it
sleeps), optionally claiming to run on another host (`ATTUNE_TEST_HOST`): the multi-worker tests kill
it at chosen moments. Run as `python tests/slow_worker.py TUNE-ARGS...`."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tuner.study as study  # noqa: E402
import tuner.study_commands as study_commands  # noqa: E402
from experiments.predicted_runner import PredictedRunner  # noqa: E402
from tuner.cli import main  # noqa: E402


class SlowRunner(PredictedRunner):
    def run(self, spec):
        print(f"running {spec.case.layout.key()}", file=sys.stderr, flush=True)
        time.sleep(float(os.environ.get("ATTUNE_TEST_TRIAL_S", "60")))
        return super().run(spec)


study_commands.make_runner = lambda args, profile=None: SlowRunner(profile=profile)
if os.environ.get("ATTUNE_TEST_GRACE_S"):   # the tests that wait for a trial to go stale wait less
    import tuner.trial_claims as trial_claims

    trial_claims.GRACE_PERIOD_S = float(os.environ["ATTUNE_TEST_GRACE_S"])
    trial_claims.HEARTBEAT_INTERVAL_S = trial_claims.GRACE_PERIOD_S / 4   # the shipped ratio (5 s of 20 s)
if os.environ.get("ATTUNE_TEST_HOST"):
    study._owner = lambda: {"host": os.environ["ATTUNE_TEST_HOST"], "pid": os.getpid()}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
