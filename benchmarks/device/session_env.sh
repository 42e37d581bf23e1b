# Sourced on the device machine: wheels carried in .whl/ installed under /tmp/site (kept while the machine is warm).
export PYTHONPATH=/tmp/site:$PWD OMP_NUM_THREADS=4 NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=1 \
  TORCHDYNAMO_DISABLE=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for d in .whl/a .whl/b .whl/m; do
  [ -d "$d" ] && ls "$d"/*.whl >/dev/null 2>&1 && pip install -q --no-index --no-deps --target /tmp/site "$d"/*.whl 2>&1 | tail -1
done
true
# The host's CPU: host-bound costs (kernel launches, CPU Adam) are the host's, not the GPU kind's.
echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
