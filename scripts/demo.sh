#!/usr/bin/env bash
# The gpuwarden tour: real GPUs when NVML answers, else the simulated 8x A100 box from
# examples/a100x8-shared.json (several inference servers, one GPU with residual memory).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUWARDEN_SIM:-}" ] && ! python3 -c 'import pynvml; pynvml.nvmlInit()' 2>/dev/null \
   && ! gpuwarden status --json >/dev/null 2>&1; then
  export GPUWARDEN_SIM="$PWD/examples/a100x8-shared.json"
  export GPUWARDEN_SIM_STATE="${GPUWARDEN_SIM_STATE:-$(mktemp -d)/sim}"
  echo "No NVIDIA driver here: using the simulated machine $GPUWARDEN_SIM"
fi
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@" || true; }
step gpuwarden status
step gpuwarden leaks --samples 2 --interval 0.2
step gpuwarden doctor
step gpuwarden select --mem 20G --count 2 --same-numa
if [ -n "${GPUWARDEN_SIM:-}" ]; then
  # A simulated job placed by exec: it lands on the best GPU with a 4 GiB cap.
  gpuwarden exec --mem 4G -- python3 -m gpuwarden.sim.job --mem 3G --seconds 3 &
  sleep 1.5
  step gpuwarden status --gpu 3 --gpu 4
  wait
  # The job queue: a private daemon places three jobs by memory, two share one GPU.
  export GPUWARDEN_HOME="$(mktemp -d /tmp/gw-demo.XXXXXX)"
  step gpuwarden daemon start
  for mem in 30G 30G 60G; do
    gpuwarden submit --mem "$mem" --name "demo-$mem" -- python3 -m gpuwarden.sim.job \
      --mem "${mem%G}G" --seconds 3 >/dev/null
  done
  sleep 1.5
  step gpuwarden ps
  step gpuwarden wait 1 2 3
  step gpuwarden ps --all
  sleep 1.5  # the daemon checks, within a pass or two, that each job's memory came back
  step gpuwarden show 1
  gpuwarden daemon stop >/dev/null
  rm -rf "$GPUWARDEN_HOME"
fi
