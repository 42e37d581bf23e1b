# Device call: a runner grid (SUITE), its best layout repeated, then a `tune --backend megatron` study of the same
# model and workload (STUDY_ARGS), all on one machine. Needs .whl/m (megatron-core) and .whl/c (optuna).
# Usage: SUITE=... STUDY_ARGS="--model ... --layers N ..." GRID_S=300 STUDY_S=200 bash benchmarks/device/grid_and_study.sh
set -u
. benchmarks/device/session_env.sh
pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --budget-s ${GRID_S:-300} > $OUT/grids.log 2>&1
best=$(python - "$OUT/grids.jsonl" <<'PY'
import json, sys
ok = [json.loads(l) for l in open(sys.argv[1]) if '"status":"ok"' in l.replace(" ", "")]
print(max(ok, key=lambda r: r["tokens_per_s_per_gpu"])["trial"] if ok else "")
PY
)
echo "grid best: $best"
[ -n "$best" ] && python -m experiments.megatron --suite "$SUITE" --out $OUT/grids.jsonl --only "$best" --budget-s 80 >> $OUT/grids.log 2>&1
grep -o '"trial":"[^"]*","gpus":1,"expect":"","elapsed_s":[0-9.]*,"status":"[a-z]*"' $OUT/grids.jsonl
mkdir -p $OUT/study
timeout ${STUDY_S:-200} python -m tuner --backend megatron --gpu h200 --gpus 1 $STUDY_ARGS --storage $OUT/study/study.db \
  --out $OUT/study --no-progress > $OUT/study/tune.log 2>&1
echo "tune rc $?"; tail -25 $OUT/study/tune.log
