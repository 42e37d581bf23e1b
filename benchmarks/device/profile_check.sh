# Device call: does `tune profile --model M` finish within 3 minutes now that its builds share one process, and do
# shared-process builds time the same as one process a build? First the A/B (held memory after each build and what
# holds it), then the whole profile, timed. Wheels: .whl/m and .whl/c (and the fla set for a GDN model).
# Usage: MODEL=qwen3-30b-a3b AB=1 bash benchmarks/device/profile_check.sh
set -u
. benchmarks/device/session_env.sh
[ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
M=${MODEL:-qwen3-30b-a3b}
# a config.json path is named by its folder (benchmarks/models/NAME/config.json -> NAME): one file under $OUT
N=$(basename "$(dirname "$M")"); case "$M" in *.json) ;; *) N=$M ;; esac
if [ "${AB:-1}" = 1 ]; then
  timeout ${AB_S:-300} python benchmarks/device/profile_process_ab.py --model "$M" --out $OUT/ab.jsonl > $OUT/ab.log 2>&1
  echo "A/B rc $?"; tail -15 $OUT/ab.log
fi
S0=$(date +%s)
timeout ${PROFILE_S:-280} python -m tuner profile --model "$M" --out $OUT/profile-$N.yaml > $OUT/profile.log 2>&1
echo "tune profile rc $? in $(( $(date +%s) - S0 )) s"; tail -12 $OUT/profile.log
