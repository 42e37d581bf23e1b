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
# A wheel too large for one call with the working tree (TileLang, 49.5 MB against 64 MiB) travels in parts, one a
# call: `split -n 2 -d W.whl` into .whl/t1/W.whl.part00 and .whl/t2/W.whl.part01. Each part is kept under
# /tmp/wheel-parts; once every part of a wheel is there it is joined and installed.
mkdir -p /tmp/wheel-parts
for part in .whl/*/*.whl.part[0-9][0-9]; do
  [ -e "$part" ] && cp -n "$part" /tmp/wheel-parts/
done
for first in /tmp/wheel-parts/*.whl.part00; do
  [ -e "$first" ] || continue
  wheel=${first%.part00}; name=$(basename "$wheel")
  [ -e "/tmp/site/.installed-$name" ] && continue
  n=$(ls "$wheel".part* | wc -l); last=$(ls "$wheel".part* | sort | tail -1)
  [ "$last" = "$wheel.part$(printf %02d $((n - 1)))" ] || continue   # a later part has not come yet
  [ "$n" -ge 2 ] || continue
  mkdir -p /tmp/wheel-joined && cat $(ls "$wheel".part* | sort) > "/tmp/wheel-joined/$name"
  pip install -q --no-index --no-deps --target /tmp/site "/tmp/wheel-joined/$name" > "/tmp/pip-$name.log" 2>&1 \
    && touch "/tmp/site/.installed-$name" || tail -1 "/tmp/pip-$name.log"
done
true
# The host's CPU: host-bound costs (kernel launches, CPU Adam) are the host's, not the GPU kind's.
echo "host: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
