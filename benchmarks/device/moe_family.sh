# Device call: how an MoE layer's time per micro-batch on the runner's stack moves with its experts' count and top-k,
# the layer shape behind the held-out MoE grids that rank below Spearman 0.9 (a layer timed as another model's with
# far fewer or more experts: Qwen1.5-MoE's 60 as Qwen3.6's 256, Phi-3.5-MoE's 16 and the synthetic 32 as Mixtral's 8).
# Five synthetic Mixtral-style layers at hidden 2048 (benchmarks/models/moe-family-*: E 8, 32, 128 at top-4 and
# width 1536; top-2 and top-8 at E 32 with 6,144 active expert width a token), each built at 1 and 2 layers over
# 4k-64k tokens a micro-batch (the builds `tune profile` runs), one process a model. No trial is run.
# Then on this machine: python benchmarks/layer_transfer.py BUILDS.jsonl prices each member from the others (leave
# one model out) as tune prices an unprofiled model.
# Wheels: .whl/m and .whl/c. Usage: [MODELS="e8-k4 e32-k4"] DEADLINE_S=560 bash benchmarks/device/moe_family.sh
set -u
. benchmarks/device/session_env.sh
export PYTHONUNBUFFERED=1
S0=$(date +%s)
K=full_attention+moe
PLAN="[[\"$K\",1,\"\"],[\"$K\",2,\"\"]]"
for m in ${MODELS:-e8-k4 e128-k4 e32-k4 e32-k2 e32-k8}; do
  LEFT=$(( ${DEADLINE_S:-560} - ($(date +%s) - S0) ))
  [ $LEFT -gt 60 ] || { echo "moe_family: no time left for $m"; break; }
  timeout $LEFT python -m experiments.checks.runner_components --model benchmarks/models/moe-family-$m/config.json \
    --plan "$PLAN" --out $OUT/builds.jsonl >> $OUT/builds.log 2>&1
  echo "$m: rc $? at $(( $(date +%s) - S0 )) s, $(wc -l < $OUT/builds.jsonl 2>/dev/null || echo 0) builds recorded"
done
grep -E "fb [0-9.]+ ms" $OUT/builds.log | tail -10
