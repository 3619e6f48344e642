# Sourced by the scripts/gpu-check-issue-*.sh scripts: $OUT, FlashMLA from .whl/ (see
# ../shared/GPU.md), the checkout on PYTHONPATH, and the GPU recorded in $OUT/gpu.txt.
set -uo pipefail
OUT=${OUT:-/tmp/mlamem-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
