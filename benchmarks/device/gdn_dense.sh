# Device call: a Gated DeltaNet + dense MLP layer kind (Qwen3.5's dense models) measured for the shipped profile,
# then held-out trials of a registered suite that reuse its compiled kernels. The builds: MODEL's GDN+dense layer
# at 1 and 2 layers (rows 1-8 of 4096 tokens) and its host floor (1 and 4 layers at the host-floor shape, the
# model's GDN heads kept, so the TileLang kernels compiled for one serve the other and the trials at those token
# counts). Wheels: .whl/m, .whl/f and .whl/b, then .whl/t, carried over back-to-back calls (64 MiB a call).
# Usage: MODEL=qwen3.5-27b [SUITE=... ONLY=a,b TRIAL_S=150] DEADLINE_S=560 bash benchmarks/device/gdn_dense.sh
set -u
. benchmarks/device/session_env.sh
export PYTHONUNBUFFERED=1
S0=$(date +%s)
M=${MODEL:-qwen3.5-27b}
K=linear_attention+dense
PLAN="[[\"$K\",1,\"\"],[\"$K\",2,\"\"],[\"$K\",1,\"--host-floor\"],[\"$K\",4,\"--host-floor\"]]"
timeout ${BUILDS_S:-360} python -m experiments.checks.runner_components --model "$M" --plan "$PLAN" \
  --out $OUT/builds.jsonl > $OUT/builds.log 2>&1
echo "builds rc $? in $(( $(date +%s) - S0 )) s: $(wc -l < $OUT/builds.jsonl 2>/dev/null || echo 0) recorded"
grep -E "fb [0-9.]+ ms" $OUT/builds.log | tail -4
LEFT=$(( ${DEADLINE_S:-560} - ($(date +%s) - S0) ))
if [ -n "${ONLY:-}" ] && [ $LEFT -gt 60 ]; then
  [ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
  python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --budget-s $LEFT --only "$ONLY" \
    ${TRIAL_S:+--timeout-s $TRIAL_S} > $OUT/grids.log 2>&1
  grep -o '"trial":"[^"]*","gpus":1,"expect":"","elapsed_s":[0-9.]*,"status":"[a-z]*"' $OUT/grids.jsonl
fi
