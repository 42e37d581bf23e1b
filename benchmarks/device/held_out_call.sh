# One device call of the registered, not yet run held-out runner grid for the GPUs this machine has: v38 on 1 H200 (its GDN trials: the gdn stage),
# v48 on 1 H100 (no GDN trials; v41-v47 ran), v39 on 2 H200s, v40 on 2 H100s (their predictions are committed in
# benchmarks/results/runner-grids-*-predicted-before.txt).
#   bash benchmarks/device/held_out_call.sh plain [BUDGET_S]   carry .whl/m .whl/c .whl/f .whl/t1: the trials
#                                                              without Gated DeltaNet layers
#   bash benchmarks/device/held_out_call.sh gdn [BUDGET_S]     after a call carrying .whl/b, then this one carrying
#                                                              .whl/t2 (TileLang's second part): the GDN trials
# Trials already stored under benchmarks/results for the suite are left out: save a call's grids.jsonl there as
# runner-grids-<gpu>-<vNN>-<letter>-<date>.jsonl before the next call (the working tree travels with it) and that call
# runs the rest. ONLY=a,b,... runs just those trials.
# Results go to $OUT/grids.jsonl; the trials that ran are named at the end.
stage=${1:?plain or gdn}; budget=${2:-470}
. benchmarks/device/session_env.sh
names=$(nvidia-smi --query-gpu=name --format=csv,noheader)
name=$(head -1 <<< "$names"); count=$(wc -l <<< "$names")
echo "gpu: $count x $name; $(date -u +%FT%TZ)"
case "$count:$name" in
  1:*H200*) suite=benchmarks/runner_grids_h200_v38_suite.json ;;
  1:*H100*) suite=benchmarks/runner_grids_h100_v48_suite.json ;;   # v41-v47 ran (sixteenth to twenty-second sessions)
  2:*H200*) suite=benchmarks/runner_grids_h200_v39_suite.json ;;
  2:*H100*) suite=benchmarks/runner_grids_h100_v40_suite.json ;;
  *) echo "held_out_call: no registered grid for $count x $name" >&2; exit 3 ;;
esac
only=$(python - "$suite" "$stage" <<'EOF'
import glob, json, sys
from cost_model.nouns.model_spec import load_model
path, stage = sys.argv[1], sys.argv[2]
suite = json.load(open(path))
# the trials an earlier session already ran (this suite's stored results) are not run again
tag = path.split("runner_grids_")[1].removesuffix("_suite.json").replace("_", "-")
ran = {json.loads(line)["trial"] for f in glob.glob(f"benchmarks/results/runner-grids-{tag}-*.jsonl")
       for line in open(f) if line.strip() and json.loads(line).get("status") != "skipped"}
gdn = lambda t: load_model(t["model"]).has_linear_attention and not t.get("replace_gdn")
print(",".join(t["name"] for t in suite["trials"] if gdn(t) == (stage == "gdn") and t["name"] not in ran))
EOF
)
only=${ONLY:-$only}
[ -n "$only" ] || { echo "held_out_call: no $stage trials in $suite" >&2; exit 3; }
extra=(); [ "$stage" = gdn ] && extra=(--timeout-s 330)   # the first GDN trial compiles fla's kernels
python -m experiments.megatron --suite "$suite" --out "$OUT/grids.jsonl" --budget-s "$budget" --only "$only" \
  "${extra[@]}" 2>&1 | grep -v -i warning | tail -n 60
ran=$(python -c "import json,sys; print(','.join(json.loads(l)['trial'] for l in open(sys.argv[1])))" \
  "$OUT/grids.jsonl" 2>/dev/null)
echo "suite: $suite; ran: $ran"
echo "$(date -u +%FT%TZ)"
