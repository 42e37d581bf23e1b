"""The cluster description of the slime backend: `tune --backend slime --cluster FILE`.

A YAML mapping; every key is optional in the file, and the command-line flags override it (--ray-address,
--slime-dir, --hf-checkpoint, --torch-dist, --sft-data, --profile-dir, --entry-module):

    ray_address: http://head:8265          # the Ray Jobs API (dashboard) address
    slime_dir: /root/slime                 # the slime checkout on the cluster (train_async.py, scripts/models)
    hf_checkpoint: /data/Qwen3.6-35B-A3B   # $HF_CKPT of the recipe (--hf-checkpoint)
    torch_dist: /data/Qwen3.6-35B-A3B_torch_dist   # $TORCH_DIST (--ref-load)
    sft_data: /data/rows.jsonl             # $SFT_DATA: pre-tokenized rows (--prompt-data)
    profile_dir: /data/profiles            # $PROFILE_DIR (--tensorboard-dir)
    log_dir: studies/slime-logs            # optional, on this machine: each job's full log is saved there
    python: python3                        # optional: the cluster's Python (default python3)
    entry_module: train_async.py           # optional: slime's entry (default train_async.py, the recipe's --async)
    slime_commit: 624b824                  # optional: the checkout's commit (model scripts are checked against it)
    env:                                   # optional: more environment for the job (Ray's runtime_env env_vars)
      WANDB_MODE: offline

The cluster paths must be absolute (they are read on the cluster, never here). Every problem is one line
naming the file and the field (`ClusterError`, an AttuneError: exit code 2).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field


from cost_model.nouns.errors import AttuneError
from cost_model.nouns.names import shown, shown_name
from cost_model.nouns.user_file import parse_yaml, read_user_text
from tuner.storages import shown as shown_url

# The recipe's cluster paths: field -> (its recipe variable, the slime flag it feeds).
PATHS = {
    "hf_checkpoint": ("$HF_CKPT", "--hf-checkpoint"),
    "torch_dist": ("$TORCH_DIST", "--ref-load"),
    "sft_data": ("$SFT_DATA", "--prompt-data"),
    "profile_dir": ("$PROFILE_DIR", "--tensorboard-dir"),
}
_STRINGS = ("ray_address", "slime_dir", *PATHS, "log_dir", "python", "entry_module", "slime_commit")
_ABSOLUTE = ("slime_dir", *PATHS)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ClusterError(AttuneError):
    """A cluster file or a cluster field the slime backend cannot run with."""


@dataclass(frozen=True)
class ClusterConfig:
    """Where and how the slime backend runs its jobs (see the module docstring)."""

    ray_address: str | None = None
    slime_dir: str | None = None
    hf_checkpoint: str | None = None
    torch_dist: str | None = None
    sft_data: str | None = None
    profile_dir: str | None = None
    log_dir: str | None = None
    python: str | None = None
    entry_module: str | None = None
    slime_commit: str | None = None
    env: dict = field(default_factory=dict)
    source: str = "the flags"          # where it came from, for messages

    def __post_init__(self):
        for name in _STRINGS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ClusterError(f"{self.source}: {name} must be a non-empty string, got {shown(value)}")
        for name in _ABSOLUTE:
            value = getattr(self, name)
            if value is not None and not value.startswith("/"):
                raise ClusterError(f"{self.source}: {name} must be an absolute path on the cluster, got {shown(value)}")
        if self.slime_commit is not None and not re.fullmatch(r"[0-9a-fA-F]{7,40}", self.slime_commit):
            raise ClusterError(f"{self.source}: slime_commit must be a git commit hash (7 to 40 hex digits), "
                               f"got {self.slime_commit!r}")
        object.__setattr__(self, "env", _check_env(self.env, self.source))
        if self.ray_address is not None:
            jobs_api_address(self.ray_address, "--ray-address" if self.source == "the flags"
                             else f"{self.source}: ray_address")

    def with_overrides(self, **values) -> "ClusterConfig":
        """The config with each field given a value that is not None (the command-line flags)."""
        given = {k: v for k, v in values.items() if v is not None}
        if isinstance(given.get("ray_address"), str):
            jobs_api_address(given["ray_address"], "--ray-address")   # the flag's own line, not the file's
        if not given:
            return self
        return dataclasses.replace(self, source=f"{self.source} and the flags" if self.source != "the flags"
                                   else self.source, **given)

    def missing_paths(self) -> list[str]:
        """The cluster path fields that have no value."""
        return [name for name in PATHS if not getattr(self, name)]

    def check_paths(self) -> None:
        """ClusterError naming every missing cluster path, with the flag that sets it."""
        missing = self.missing_paths()
        if missing:
            raise ClusterError(missing_paths_message(missing))


def jobs_api_address(address: str, where: str = "--ray-address") -> str:
    """The slime backend's Ray address as its Jobs API client takes it: the dashboard's http(s)://HEAD:8265, a bare
    HEAD:PORT given http://. ClusterError (one line, before any connection, a password shown as ***) for one it
    cannot submit to: Ray's client address (ray://HEAD:10001, what --backend predict scores on, which the Jobs API
    client would try for half a minute), `local` (predict's Ray started in this process), no host, a bad port."""
    import urllib.parse

    text = address.strip()
    said = f"{where} {shown_url(text)[:200]}"
    jobs = "the slime backend submits through Ray's Jobs API, the dashboard's http://HEAD:8265"
    if text.lower() in ("local", "auto"):
        raise ClusterError(f"{said}: {jobs}; 'local' is --backend predict's Ray, started in this process; for a "
                           f"Ray head on this machine give http://127.0.0.1:8265")
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError as e:   # an unclosed IPv6 bracket ("http://[::1")
        raise ClusterError(f"{said}: not a URL ({e}); {jobs}") from None
    if parts.scheme.lower() == "ray":
        suggestion = f"http://{_host_in_url(host)}:8265" if host else "http://HEAD:8265"
        raise ClusterError(f"{said}: {jobs}, not Ray's client address ray://HEAD:10001 (--backend predict's); "
                           f"give {suggestion}")
    if parts.scheme.lower() not in ("http", "https"):
        raise ClusterError(f"{said}: {jobs}; expected http://HEAD:8265 or https://HEAD:PORT")
    if not host:
        raise ClusterError(f"{said}: names no host; {jobs}: give it as http://HEAD:8265")
    try:
        parts.port
    except ValueError:
        raise ClusterError(f"{said}: the port must be a number in 0..65535; {jobs}") from None
    return urllib.parse.urlunsplit(parts._replace(scheme=parts.scheme.lower()))   # Ray knows http, not HTTP


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def missing_paths_message(missing: list[str]) -> str:
    """One line naming the missing cluster path fields, what each is in the recipe, and how to set it."""
    what = ", ".join(f"{n} ({PATHS[n][0]}, slime's {PATHS[n][1]}; or --{n.replace('_', '-')})" for n in missing)
    return (f"the slime backend needs the cluster path{'s' if len(missing) > 1 else ''} {what}: set "
            f"{'them' if len(missing) > 1 else 'it'} in the --cluster file")


def load_cluster(path: str) -> ClusterConfig:
    """The --cluster FILE as a ClusterConfig; ClusterError (one line) for anything wrong with it."""
    where = f"--cluster {path}"
    text = read_user_text(path, ClusterError, "cluster file")
    data = parse_yaml(text, where, ClusterError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: must be a YAML mapping of cluster fields, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(ClusterConfig)} - {"source"}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ClusterError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(known))})")
    values = dict(data)
    if values.get("slime_commit") is not None and not isinstance(values["slime_commit"], str):
        values["slime_commit"] = str(values["slime_commit"])     # an all-digit hash reads as a number
    if values.get("env") is None:
        values["env"] = {}
    return ClusterConfig(source=where, **values)


def _check_env(env, where: str) -> dict:
    """The env mapping as {name: string}: names are shell names, values scalars without shell syntax
    (Ray's runtime_env passes them as they are; nothing evaluates a `$(...)` there)."""
    if not isinstance(env, dict):
        raise ClusterError(f"{where}: env must be a mapping of variable names to values, got {type(env).__name__}")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ClusterError(f"{where}: env: {shown_name(name)} is not an environment variable name")
        if isinstance(value, bool):
            value = "1" if value else "0"
        if not isinstance(value, (str, int, float)):
            raise ClusterError(f"{where}: env.{name} must be a string or a number, got {type(value).__name__}")
        value = str(value)
        if "$(" in value or "`" in value:
            raise ClusterError(f"{where}: env.{name} is a shell command ($(...) or backquotes); give its value: Ray passes "
                               f"env values as they are")
        out[name] = value
    return out


__all__ = ["ClusterConfig", "ClusterError", "PATHS", "load_cluster", "missing_paths_message"]
