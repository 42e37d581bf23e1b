"""Append measured runner builds (experiments.checks.runner_components --kind records, one JSON per line) to a
profile's runner_components section, as a named run.

A later build of a layer kind and depth replaces an earlier one where the cost model reads them
(cost_model.runner_components: the latest build of each kind and depth; a layer's marginal cost from its 1-layer
build and its deepest), so a re-timed kind is re-timed by appending, and the earlier builds stay on record.

Usage: python benchmarks/append_runner_builds.py PROFILE.yaml BUILDS.jsonl RUN "what ran, where"
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from experiments.checks.runner_components import section_from_builds  # noqa: E402


def build_yaml(build: dict, run: str) -> str:
    """One build in the profile's own style: block fields, one flow line per point."""
    head = {k: v for k, v in build.items() if k != "points"}
    head["run"] = run
    lines = []
    for i, (k, v) in enumerate(head.items()):
        lines.append(("  - " if i == 0 else "    ") + f"{k}: {json.dumps(v)}")   # JSON is YAML
    lines.append("    points:")
    for p in build["points"]:
        p = {k: float(f"{v:.5g}") if isinstance(v, float) else v for k, v in p.items()}   # the profile's precision
        lines.append("    - " + yaml.safe_dump(p, default_flow_style=True, sort_keys=False, width=10_000).strip())
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    profile, builds_path, run, note = Path(argv[0]), Path(argv[1]), argv[2], argv[3]
    records = [json.loads(line) for line in builds_path.read_text().splitlines() if line.strip()]
    section = section_from_builds(records, {})
    text = profile.read_text()
    if not text.rstrip().splitlines()[-1].startswith("    - {tokens"):
        print(f"{profile}: runner_components.builds is not the file's last block; append by hand", file=sys.stderr)
        return 1
    data = yaml.safe_load(text)["runner_components"]
    old = data["source"]
    add = "".join(build_yaml(b, run) for b in section["builds"])
    text = text.rstrip("\n") + "\n" + add
    # the run named in the section's source, so the profile says what each build is
    quoted = yaml.safe_dump({"source": f"{old}; {run}: {note}"}, width=140).strip()
    start = text.index("\n  source: ", text.index("\nrunner_components:")) + 1
    end = text.index("\n  cpu_adam_ranks:", start) + 1
    text = text[:start] + "\n".join("  " + line for line in quoted.splitlines()) + "\n" + text[end:]
    yaml.safe_load(text)   # still a profile
    profile.write_text(text)
    print(f"{profile}: {len(section['builds'])} builds appended as {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
