# Device call: the trials ONLY (comma-separated names) of SUITE within GRID_S seconds, then the best of them
# repeated once (its repeat noise). Wheels: whatever .whl/ holds is installed under /tmp/site (session_env.sh).
# Usage: SUITE=... ONLY=a,b,c GRID_S=480 [TRIAL_S=300] bash benchmarks/device/grid.sh
# (TRIAL_S: each trial's limit instead of the suite's; a first Gated DeltaNet trial compiles its kernels)
set -u
. benchmarks/device/session_env.sh
[ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --budget-s ${GRID_S:-480} ${ONLY:+--only $ONLY} \
  ${TRIAL_S:+--timeout-s $TRIAL_S} \
  > $OUT/grids.log 2>&1
best=$(python - "$OUT/grids.jsonl" <<'PY'
import json, sys
ok = [json.loads(l) for l in open(sys.argv[1]) if '"status":"ok"' in l.replace(" ", "")]
print(max(ok, key=lambda r: r["tokens_per_s_per_gpu"])["trial"] if ok else "")
PY
)
echo "grid best: $best"
[ -n "$best" ] && python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --only "$best" \
  --budget-s ${REPEAT_S:-70} >> $OUT/grids.log 2>&1
grep -o '"trial":"[^"]*","gpus":1,"expect":"","elapsed_s":[0-9.]*,"status":"[a-z]*"' $OUT/grids.jsonl
