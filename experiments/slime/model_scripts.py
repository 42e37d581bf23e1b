"""The model scripts (`scripts/models/*.sh`, each defining MODEL_ARGS) that slime ships, as data.

Listed with `git ls-tree -r --name-only HEAD scripts/models` in a clone of THUDM/slime at SLIME_COMMIT
(main on 2026-08-21). The slime runner refuses, before submitting, a model whose script is not in the list
when the cluster's slime checkout is that commit (or its commit is not given): `source` would fail on the
cluster. A checkout at another commit is checked on the cluster instead (the job stops in one line when the
script is missing). `scripts/models/qwen3.5-397B-A17B.sh` is on a pull-request branch only (refs/pull/2051).
"""
from __future__ import annotations

SLIME_REPO = "THUDM/slime"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
SLIME_DATE = "2026-08-21"
SCRIPTS_DIR = "scripts/models"

SLIME_MODEL_SCRIPTS = frozenset(f"{SCRIPTS_DIR}/{name}" for name in (
    "deepseek-v3-20layer.sh", "deepseek-v3-5layer.sh", "deepseek-v3.sh", "glm4-32B.sh", "glm4-9B.sh",
    "glm4.5-106B-A12B.sh", "glm4.5-355B-A32B.sh", "glm4.7-30B-A3B.sh", "glm5-744B-A40B.sh", "glm5.2-744B-A40B.sh",
    "kimi-k2-thinking.sh", "kimi-k2.sh", "llama3.1-8B-Instruct.sh", "llama3.2-3B-Instruct-amd.sh",
    "llama3.2-3B-Instruct.sh", "mimo-7B-rl.sh", "minimax-m2.sh", "moonlight.sh", "qwen2.5-0.5B.sh",
    "qwen2.5-1.5B.sh", "qwen2.5-32B.sh", "qwen2.5-3B.sh", "qwen2.5-7B.sh", "qwen3-0.6B.sh", "qwen3-1.7B.sh",
    "qwen3-14B.sh", "qwen3-235B-A22B.sh", "qwen3-30B-A3B.sh", "qwen3-32B.sh", "qwen3-4B-Instruct-2507.sh",
    "qwen3-4B.sh", "qwen3-8B.sh", "qwen3-next-80B-A3B.sh", "qwen3.5-0.8B.sh", "qwen3.5-27B.sh",
    "qwen3.5-35B-A3B-vl.sh", "qwen3.5-35B-A3B.sh", "qwen3.5-4B.sh", "qwen3.5-9B.sh",
))


def same_commit(commit: str | None) -> bool:
    """Whether `commit` (a full or abbreviated hash; None: not given) is the listed one."""
    return commit is None or (len(commit) >= 7 and SLIME_COMMIT.startswith(commit.lower()))


def listed(script: str) -> bool:
    """Whether slime at SLIME_COMMIT has `script` (relative to the checkout, e.g. 'scripts/models/moonlight.sh')."""
    return script in SLIME_MODEL_SCRIPTS
