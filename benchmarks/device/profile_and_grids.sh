# SUITE=path picks the grid suite (default v2).
# Device call: re-profile qwen3-30b-a3b's runner components at 4 micro-batches (plus an offload build, and one
# of llama3-8b), then as many grid trials as the call's budget leaves. Usage: bash ... [PROFILE=0|1] [ONLY=names]
set -u
S0=$(date +%s)
. benchmarks/device/session_env.sh
if [ "${PROFILE:-1}" = 1 ]; then
  for spec in "qwen3-30b-a3b full_attention+moe 1 -" "qwen3-30b-a3b full_attention+moe 2 -" \
              "qwen3-30b-a3b full_attention+moe 1 --real-vocab" "qwen3-30b-a3b full_attention+moe 2 --offload" \
              "llama3-8b full_attention+dense 2 --offload"; do
    set -- $spec
    extra=$4; rows=1,2,4,8,16; [ "$extra" = - ] && extra=; [ "$extra" = --offload ] && rows=1
    timeout 150 python -m experiments.checks.runner_components --model $1 --kind $2 --layers $3 $extra \
      --microbatches 4 --rows $rows --out $OUT/builds.jsonl >> $OUT/profile.log 2>&1
    echo "build $spec: rc $? at $(( $(date +%s) - S0 )) s"
  done
fi
left=$(( ${BUDGET:-575} - ( $(date +%s) - S0 ) ))
echo "grids with $left s left"
python -m experiments.megatron --suite ${SUITE:-benchmarks/runner_grids_h200_v2_suite.json} --out $OUT/grids.jsonl \
  --budget-s $left ${ONLY:+--only $ONLY} > $OUT/grids.log 2>&1
grep -c '"status":"ok"' $OUT/grids.jsonl; grep -o '"trial":"[^"]*","gpus":1,"expect":"","elapsed_s":[0-9.]*,"status":"[a-z]*"' $OUT/grids.jsonl
