#!/usr/bin/env bash
# The GPU half of the benchmarks: gpuwarden, gpusched and gflow side by side on real torch
# jobs (bench/bench_peers.py; issue 17), on a machine with a real NVIDIA GPU and torch (no
# venv: the machine's python3, 3.12). Everything it needs beside the source tree comes in
# .whl/ (git-ignored), installed into a private folder; nothing is fetched there.
#
# Fetch the carried files once, on a machine with PyPI and Debian's archive (repo root):
#
#   p="--only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#      --platform manylinux1_x86_64"
#   python3 -m pip download --no-deps $p -d .whl gpusched==0.4.0 runqd==0.4.18 nvitop==1.7.2
#   apt-get update && mkdir -p .whl/debs && (cd .whl/debs && \
#       apt-get download tmux libevent-core-2.1-7 libutempter0)      # Debian 12: tmux 3.3a
#
# (gpusched and nvitop are pure Python; runqd is gflow's Rust binaries as a wheel; gflow
# needs tmux, which needs libevent. torch, nvidia-ml-py, psutil, click, rich are there.)
#
# Run. Each set's lower bound is 38-48 s and a tool takes 1.5-2.5x that, so the whole of it
# (3 sets x 3 tools, run set by set, tool after tool) takes 9-11 minutes: --budget (540 s
# by default) cuts or skips the runs that would pass it, so that one 10-minute command ends
# in time. For every figure, split it in two calls and join them:
#
#   scripts/gpu-bench.sh                         # sets a,b,c x gpuwarden,gpusched,gflow
#   scripts/gpu-bench.sh --sets a,b              # about 6 minutes ...
#   scripts/gpu-bench.sh --sets c                # ... and about 4 (keep each peers.json)
#   scripts/gpu-bench.sh --sets a --tools gpuwarden,gflow      # any part
#   scripts/gpu-bench.sh --time-scale 0.3 --status-runs 0      # a quick smoke run
#   scripts/gpu-bench.sh --gw-args "--retries 1"               # options for gpuwarden submit
#   GPUWARDEN_REV=abc1234 scripts/gpu-bench.sh   # name the tree's commit yourself where the
#       machine's copy of .git is older than the tree it runs (it then says "<old>-dirty")
#   GPUWARDEN_SRC=.gwsrc/src GPUWARDEN_REV=abc1234 scripts/gpu-bench.sh   # a given commit
#       (here: mkdir .gwsrc; git archive abc1234 src | tar -x -C .gwsrc; echo /.gwsrc/ \
#       >> .git/info/exclude; name .gwsrc in the device call's carry beside .whl)
#
# Writes to ${OUT:-/tmp/gpuwarden-gpu-bench}: peers.json (figures), peers.log (progress and
# the summary table) and peers-work.tar.gz (every job's result files and logs, the tools'
# state). Copy peers.json to bench/results/ (join split runs first: python3
# bench/bench_peers.py --merge A.json B.json --json bench/results/peers.json), then
# bench/run.sh (any part) renders it into bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpuwarden-gpu-bench}"; mkdir -p "$out"
site=/tmp/gpuwarden-site; tools=/tmp/gpuwarden-tools
rm -rf "$site" "$tools"; mkdir -p "$site" "$tools"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl
fi
for deb in .whl/debs/*.deb; do
  [ -e "$deb" ] && dpkg -x "$deb" "$tools"
done
[ -d "$site/bin" ] && chmod +x "$site"/bin/*
export PATH="$site/bin:$tools/usr/bin:$PATH"
export LD_LIBRARY_PATH="$tools/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# gpuwarden from this tree's src/, or from GPUWARDEN_SRC (e.g. a `git archive` of one
# commit, carried; GPUWARDEN_REV names it in peers.json)
gw_src="$(cd "${GPUWARDEN_SRC:-src}" && pwd)"
python3 -m compileall -q "$gw_src"
export PYTHONPATH="$gw_src:$site" PYTHONUNBUFFERED=1
echo "tmux: $(tmux -V 2>&1); gflowd: $(gflowd --version 2>&1 | head -1); $(nvidia-smi \
  --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)" | tee "$out/peers.log"
rc=0
python3 bench/bench_peers.py --json "$out/peers.json" --keep "$out/work" "$@" 2>&1 \
  | tee -a "$out/peers.log" || rc=$?
if [ -d "$out/work" ]; then
  tar czf "$out/peers-work.tar.gz" -C "$out" work && rm -rf "$out/work"
fi
exit "$rc"
