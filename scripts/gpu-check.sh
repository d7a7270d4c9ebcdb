#!/usr/bin/env bash
# Run on a machine with a real NVIDIA GPU (no venv: the machine's python3 with torch and
# nvidia-ml-py). Runs the gpu-marked tests and records what the real driver shows.
# Writes logs to ${OUT:-/tmp/gpuwarden-gpu-check}.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpuwarden-gpu-check}"; mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Optional packages carried as wheels in .whl/ (torchao, bitsandbytes for the 8-bit load
# tests): installed beside the machine's own, never into it.
if compgen -G ".whl/*.whl" >/dev/null; then
  extra=/tmp/gpuwarden-extra
  python3 -m pip install -q --no-deps --target "$extra" .whl/*.whl && PYTHONPATH="$PYTHONPATH:$extra"
fi
gw() { python3 -m gpuwarden "$@"; }
{
  echo "== $(date -u +%FT%TZ) $(uname -r)"; nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total,compute_mode,persistence_mode --format=csv
  python3 -c 'import torch, pynvml; print("torch", torch.__version__, "nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "?")'
  echo "== status (idle)"; COLUMNS=100 gw status; gw status --json
  echo "== leaks (idle)"; gw leaks --json
  echo "== doctor (idle)"; COLUMNS=100 gw doctor; echo "doctor exit $?"
  echo "== select"; gw select --mem 20G; gw select --mem 200G; echo "exit $?"
} 2>&1 | tee "$out/observe.log"
python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -v -rA 2>&1 | tee "$out/gpu-tests.log"
exit "${PIPESTATUS[0]}"
