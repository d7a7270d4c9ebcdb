#!/usr/bin/env bash
# The GPU half of the benchmarks, on a machine with a real NVIDIA GPU and torch (no venv:
# the machine's python3). Peers and optional packages come as wheels in .whl/ (gpusched,
# gq-local, nvitop; see bench/RESULTS.md), installed beside the machine's own.
# Writes bench results to ${OUT:-/tmp/gpuwarden-gpu-bench}/peers.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpuwarden-gpu-bench}"; mkdir -p "$out"
extra=/tmp/gpuwarden-extra
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-deps --target "$extra" .whl/*.whl
fi
export PYTHONPATH="$PWD/src:$extra" PYTHONUNBUFFERED=1
python3 bench/bench_peers.py --json "$out/peers.json" "$@"
