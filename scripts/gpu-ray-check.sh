#!/usr/bin/env bash
# Run on a machine with a real NVIDIA GPU: the gpu-marked Ray tests (tests/gpu/test_ray_gpu.py).
# Ray comes as wheels in .raywhl/ (scripts/ray-wheels.sh makes them), installed beside the
# machine's own packages, never into them. Writes its log to ${OUT:-/tmp/gpuwarden-gpu-ray}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpuwarden-gpu-ray}"; mkdir -p "$out"
site=/tmp/gpuwarden-ray
if ! compgen -G ".raywhl/*.whl" >/dev/null; then
  echo "no wheels in .raywhl/: run scripts/ray-wheels.sh first" >&2; exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .raywhl/*.whl || exit 1
export PYTHONPATH="$PWD/src:$site" PATH="$site/bin:$PATH" PYTHONUNBUFFERED=1
python3 -m pip list 2>/dev/null | grep -iE "^(protobuf|typing.extensions|aiohttp|packaging|requests|filelock|torch) " \
  | tee "$out/versions.txt"
python3 -m pytest -m gpu tests/gpu/test_ray_gpu.py -p no:cacheprovider -v -rA -s 2>&1 \
  | tee "$out/gpu-ray-tests.log"
exit "${PIPESTATUS[0]}"
