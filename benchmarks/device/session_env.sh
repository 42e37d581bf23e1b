# Sourced on the device machine: wheels carried in .whl/ installed under /tmp/site (kept while the machine is warm).
export PYTHONPATH=/tmp/site:$PWD OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=1 \
  TORCHDYNAMO_DISABLE=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# Every carried wheel folder but .whl/c (optuna's, installed by the scripts that need it); a folder installed
# once is not installed again while the machine stays warm.
for d in .whl/*/; do
  d=${d%/}; [ "$d" = .whl/c ] && continue
  mark=/tmp/site/.installed-$(basename "$d")-$(ls "$d" | md5sum | cut -c1-8)
  [ -e "$mark" ] && continue
  ls "$d"/*.whl >/dev/null 2>&1 || continue
  pip install -q --no-index --no-deps --target /tmp/site "$d"/*.whl > /tmp/pip-$(basename "$d").log 2>&1 \
    && touch "$mark" || tail -1 /tmp/pip-$(basename "$d").log
done
true
# The host's CPU: host-bound costs (kernel launches, CPU Adam) are the host's, not the GPU kind's.
echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
