# Device call: a `tune --backend megatron` study (STUDY_ARGS) on this machine's GPU within STUDY_S seconds.
# Needs optuna: .whl/c carried now or installed under /tmp/site by an earlier call on the same warm machine.
set -u
. benchmarks/device/session_env.sh
[ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
mkdir -p $OUT/study
timeout ${STUDY_S:-400} python -m tuner --backend megatron --gpu h200 --gpus 1 $STUDY_ARGS --storage $OUT/study/study.db \
  --out $OUT/study --no-progress > $OUT/study/tune.log 2>&1
echo "tune rc $?"; tail -30 $OUT/study/tune.log
