# Device call: own-layer runner-component builds for the models in SPECS (one "model kind layers extra rows" per
# line; extra is - for none, --real-vocab or --offload), appended to $OUT/builds.jsonl, then the grid SUITE (if set)
# with the time left of BUDGET seconds. Needs .whl/m (megatron-core); GDN models also .whl/t, .whl/f and .whl/b (tilelang; fla and its FFI; z3), carried over back-to-back calls (64 MiB a call).
# Usage: SPECS="$(cat specs.txt)" BUDGET=570 [SUITE=... [ONLY=a,b]] bash benchmarks/device/profile_layers.sh
set -u
S0=$(date +%s)
. benchmarks/device/session_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
while read -r model kind layers extra rows; do
  [ -z "$model" ] && continue
  [ "$extra" = - ] && extra=
  timeout 170 python -m experiments.checks.runner_components --model "$model" --kind "$kind" --layers "$layers" \
    $extra --microbatches 4 --rows "$rows" --out $OUT/builds.jsonl >> $OUT/profile.log 2>&1
  echo "build $model $kind x$layers $extra: rc $? at $(( $(date +%s) - S0 )) s"
done <<< "$SPECS"
if [ -n "${SUITE:-}" ]; then
  [ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
  left=$(( ${BUDGET:-570} - ( $(date +%s) - S0 ) ))
  echo "grid with $left s left"
  python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --budget-s $left ${ONLY:+--only $ONLY} > $OUT/grids.log 2>&1
  grep -o '"trial":"[^"]*","gpus":1,"expect":"","elapsed_s":[0-9.]*,"status":"[a-z]*"' $OUT/grids.jsonl
fi
grep -h "fb " $OUT/profile.log | tail -5
