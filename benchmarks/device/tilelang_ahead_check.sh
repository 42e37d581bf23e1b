# Device call: what compiling fla's TileLang kernel ahead (experiments/megatron/tilelang_ahead.py) saves on a first
# `tune profile` of a Gated DeltaNet model. The profile runs once per entry of RUNS, each after clearing Triton's,
# TileLang's and CUDA's kernel caches (as on a machine where no GDN kernel ran), with the fla autotune choices shipped
# for this GPU seeded where there are any: "on" compiles ahead (the default), "off" does not (ATTUNE_TILELANG_AHEAD=0).
# The imports are read once first, so that no run pays for reading them cold.
# Wheels: the GDN set (benchmarks/device/session_env.sh: m, f, t1, then b, then t2) and .whl/c.
# Usage: [MODEL=qwen3.6-35b-a3b] [RUNS="on off"] [PROFILE_S=330] bash benchmarks/device/tilelang_ahead_check.sh
set -u
. benchmarks/device/session_env.sh
[ -d .whl/c ] && pip install -q --no-index --no-deps --target /tmp/site .whl/c/*.whl 2>&1 | grep -v WARNING | tail -1
M=${MODEL:-qwen3.6-35b-a3b}
python -c "import torch, megatron.core, fla, tilelang, optuna" 2>&1 | grep -v -i warn | tail -2
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); fla choices shipped for it: $(python -c "
import torch; from experiments.megatron.fla_tuning import choices_dir, gpu_file_name
p = choices_dir() / gpu_file_name(torch.cuda.get_device_name(0)); print(p if p.exists() else 'none')")"
for run in ${RUNS:-on off}; do
  rm -rf ~/.triton ~/.tilelang ~/.nv/ComputeCache ~/.cache/tilelang "${TRITON_CACHE_DIR:-/nonexistent}"
  if [ "$run" = off ]; then export ATTUNE_TILELANG_AHEAD=0; else export ATTUNE_TILELANG_AHEAD=1; fi
  log=$OUT/profile-ahead-$run.log
  S0=$(date +%s)
  timeout "${PROFILE_S:-330}" python -m tuner profile --model "$M" --out "$OUT/profile-ahead-$run.yaml" > "$log" 2>&1
  echo "== tune profile rc $? in $(( $(date +%s) - S0 )) s (compile ahead $run, $M, caches cleared)"
  grep -E "^\[profile|wall time" "$log" | grep -v -i warning | tail -24
  echo "TileLang compiles in the profile's own kernel section: $(grep -c 'TileLang begins to compile' "$log")"
  python - "$OUT/profile-ahead-$run.yaml" <<'EOF'
import sys, yaml
try:
    p = yaml.safe_load(open(sys.argv[1]))
except OSError as e:
    sys.exit(f"no profile: {e}")
rc = p.get("runner_components") or {}
print("builds:", rc.get("wall_s"), "s;", ", ".join(f"{'+'.join(b['kind'])} x{b['layers']} {b.get('wall_s')} s"
                                                 for b in rc.get("builds", [])[:3]))
print("notes:", [n for n in p.get("notes", []) if "tilelang_ahead" in str(n)])
EOF
done
