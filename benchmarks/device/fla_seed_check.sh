# Device call: how much of a first `tune profile` of a Gated DeltaNet model is fla's autotuning, and what the shipped
# autotune choices (experiments/megatron/fla_tuning.py) save. Each stage first clears Triton's, TileLang's and CUDA's
# kernel caches, so the profile runs as on a machine where no GDN kernel ran.
#   STAGE=record: the profile as today (no choices shipped for this GPU), recording every process's choices; merged
#                 into experiments/megatron/fla_autotune_choices/<GPU>.json on the device tree and $OUT.
#   STAGE=seeded: the same profile again with those choices seeded (recording too: a key the file lacks shows).
# Wheels: .whl/c and the GDN set (m, f, t1, then b, then t2: benchmarks/device/session_env.sh).
# Usage: STAGE=record [MODEL=qwen3.6-35b-a3b] [PROFILE_S=420] bash benchmarks/device/fla_seed_check.sh
set -u
. benchmarks/device/session_env.sh
[ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
M=${MODEL:-qwen3.6-35b-a3b}; STAGE=${STAGE:?record or seeded}
rm -rf ~/.triton ~/.tilelang ~/.nv/ComputeCache ~/.cache/tilelang "${TRITON_CACHE_DIR:-/nonexistent}"
export ATTUNE_FLA_TUNING_RECORD=/tmp/fla-rec-$STAGE
rm -rf "$ATTUNE_FLA_TUNING_RECORD"
shipped=experiments/megatron/fla_autotune_choices/$(python -c "
import torch; from experiments.megatron.fla_tuning import gpu_file_name; print(gpu_file_name(torch.cuda.get_device_name(0)))")
# the device tree is copied afresh each call: the recorded choices wait under /tmp while the machine stays warm
[ "$STAGE" = seeded ] && [ -e "/tmp/fla-seeds/$(basename "$shipped")" ] && mkdir -p "$(dirname "$shipped")" \
  && cp "/tmp/fla-seeds/$(basename "$shipped")" "$shipped"
echo "stage $STAGE; shipped choices for this GPU: $( [ -e "$shipped" ] && echo "$shipped" || echo none)"
S0=$(date +%s)
timeout ${PROFILE_S:-420} python -m tuner profile --model "$M" --out $OUT/profile-$STAGE.yaml > $OUT/profile-$STAGE.log 2>&1
echo "tune profile rc $? in $(( $(date +%s) - S0 )) s (stage $STAGE, $M)"
grep -E "^\[profile|wall time|builds|GDN|linear" $OUT/profile-$STAGE.log | grep -v -i warning | tail -25
python -m experiments.megatron.fla_tuning merge "$ATTUNE_FLA_TUNING_RECORD" --out $OUT/fla-choices-$STAGE.json \
  --source "tune profile --model $M, stage $STAGE of benchmarks/device/fla_seed_check.sh, $(date -u +%FT%TZ)"
if [ "$STAGE" = record ] && [ -e $OUT/fla-choices-$STAGE.json ]; then
  mkdir -p "$(dirname "$shipped")" /tmp/fla-seeds && cp $OUT/fla-choices-$STAGE.json "$shipped" \
    && cp "$shipped" /tmp/fla-seeds/ && echo "seeds now at $shipped"
fi
python - "$OUT/profile-$STAGE.yaml" <<'EOF'
import sys, yaml
try:
    p = yaml.safe_load(open(sys.argv[1]))
except OSError as e:
    sys.exit(f"no profile: {e}")
la = p.get("linear_attention", {}) if isinstance(p, dict) else {}
print("linear_attention tuning:", la.get("tuning"), "| fwd_bwd ms:", [pt.get("fwd_bwd_ms") for pt in la.get("points", [])])
EOF
