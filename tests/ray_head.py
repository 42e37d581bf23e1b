"""A local Ray head with the Jobs API for the end-to-end tests: `ray start --head --block` in its own process group,
a private temp dir, the dashboard on 127.0.0.1, token authentication with a token made here.

Its ports lie below the kernel's ephemeral range (tests/free_ports.py): one of the head's agents failing to bind a
port taken meanwhile would take the whole head down (`--block` stops every process when one exits). The head is proven with a job that runs before any test uses it; a head that dies while coming up is
started once more, its log's end printed; a head that dies later is reported at teardown with its log's end."""
from __future__ import annotations

import glob
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from free_ports import free_port_block

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
NAMED_PORTS = ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
               "runtime-env-agent-port", "ray-client-server-port", "metrics-export-port", "node-manager-port",
               "object-manager-port")
WORKER_PORTS = 200             # its own block, apart from Ray's default 10002-19999 that other clusters here use
UP_WITHIN_S = 180
LOGS_READ = ("ray-start.log", "session_latest/logs/raylet.out", "session_latest/logs/gcs_server.out",
             "session_latest/logs/dashboard.log", "session_latest/logs/dashboard_agent.log")


@dataclass
class RayHead:
    """One `ray start --head --block` process; `address` is its dashboard (the Jobs API)."""
    temp_dir: str
    env: dict
    rng: random.Random = field(default_factory=random.Random)
    proc: subprocess.Popen | None = None
    address: str = ""
    client: object = None

    def start(self) -> None:
        from ray.job_submission import JobSubmissionClient
        block = free_port_block(len(NAMED_PORTS) + WORKER_PORTS, self.rng)
        ports, workers = block[:len(NAMED_PORTS)], (block[len(NAMED_PORTS)], block[-1])
        flags = [x for name, p in zip(NAMED_PORTS, ports) for x in (f"--{name}", str(p))]
        cmd = [RAY, "start", "--head", "--block", "--num-cpus", "2", "--num-gpus", "0", *flags,
               "--min-worker-port", str(workers[0]), "--max-worker-port", str(workers[1]),
               "--dashboard-host", "127.0.0.1", "--include-dashboard", "true",
               "--object-store-memory", str(200 * 2 ** 20), "--temp-dir", self.temp_dir, "--disable-usage-stats"]
        with open(os.path.join(self.temp_dir, "ray-start.log"), "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=self.env)
        self.address = f"http://127.0.0.1:{ports[1]}"
        start, last_error = time.monotonic(), None
        while time.monotonic() - start < UP_WITHIN_S and self.proc.poll() is None:
            try:
                self.client = JobSubmissionClient(self.address)
                self.client.list_jobs()
                return
            except Exception as e:  # not up yet
                self.client, last_error = None, e
                time.sleep(0.5)
        raise RuntimeError(f"the Ray head's Jobs API did not come up at {self.address} within {UP_WITHIN_S} s "
                           f"(ray start exit {self.proc.poll()}, last error {last_error})")

    def prove(self) -> float:
        """Run one trivial job to its end (the job agent comes up after the dashboard); returns its seconds."""
        from experiments.slime.runner import submit_when_agent_up
        t = time.monotonic()
        job, _, _ = submit_when_agent_up(self.client, UP_WITHIN_S, 0.5,
                                         entrypoint=shlex.join([sys.executable, "-c", "pass"]))
        while time.monotonic() - t < UP_WITHIN_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Ray head exited ({self.proc.poll()}) while its first job ran")
            status = self.client.get_job_status(job).value
            if status == "SUCCEEDED":
                return time.monotonic() - t
            if status in ("FAILED", "STOPPED"):
                raise RuntimeError(f"the Ray head's first job ended {status}: {self.client.get_job_logs(job)[-500:]}")
            time.sleep(0.25)
        raise RuntimeError(f"the Ray head's first job did not end within {UP_WITHIN_S} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)         # ray start --block stops the processes it started
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        try:                                              # stragglers of its own process group, if any
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, chars: int = 1500) -> str:
        parts = []
        for name in LOGS_READ:
            for path in glob.glob(os.path.join(self.temp_dir, name)):
                with open(path, errors="replace") as f:
                    parts.append(f"--- {name}:\n{f.read()[-chars:]}")
        return "\n".join(parts) or f"(no Ray log under {self.temp_dir})"


def start_proven_head(env: dict, tries: int = 2) -> RayHead:
    """A head that ran its first job; one that fails while coming up is stopped and started again, once (what
    happened to it is printed)."""
    said = []
    for attempt in range(1, tries + 1):
        head = RayHead(tempfile.mkdtemp(prefix="rt", dir="/tmp"), env)
        try:
            head.start()
            took = head.prove()
            print(f"\nray head up at {head.address}, first job in {took:.1f} s (try {attempt})")
            return head
        except Exception as e:
            said.append(f"try {attempt}: {e}\n{head.log_tail()}")
            head.stop()
            shutil.rmtree(head.temp_dir, ignore_errors=True)
            print(f"\nray head failed to come up: {said[-1]}")
    raise RuntimeError("the Ray head did not come up:\n" + "\n".join(said))
