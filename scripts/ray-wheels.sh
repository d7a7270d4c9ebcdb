#!/usr/bin/env bash
# Make .raywhl/: Ray 2.60 with its dashboard and job API for the GPU machine (CPython 3.12,
# x86-64), small enough to carry there (under 60 MiB; scripts/gpu-ray-check.sh installs it).
# Ray's wheel is 79 MB. Dropped: the Java jars and the libraries on top of Ray (RLlib, Tune,
# Train, Data, Serve, LLM, AIR), which nothing that `ray start`, the dashboard, the job API
# or tasks import at start needs; the binaries' symbol tables are stripped. Added: what
# ray[default] needs that that machine's image lacks (its own list is in the device docs).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.raywhl
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -c 'import wheel' 2>/dev/null || python3 -m pip install -q wheel
dl() {
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" "$@"
}
rm -rf "$out"; mkdir -p "$out"
dl "$work" ray==2.60.0
python3 -m wheel unpack -d "$work/u" "$work"/ray-2.60.0-*.whl
r="$work/u/ray-2.60.0"
rm -rf "$r"/ray/{jars,rllib,tune,train,data,serve,llm,air}
find "$r/ray/dashboard" -name '*.js.map' -delete
strip --strip-unneeded "$r/ray/_raylet.so" "$r/ray/core/src/ray/gcs/gcs_server" \
  "$r/ray/core/src/ray/raylet/raylet"
sed -i '/^serve =/d; /^tune =/d' "$r/ray-2.60.0.dist-info/entry_points.txt"
sed -i 's/^Tag: .*/Tag: cp312-cp312-manylinux2014_x86_64/' "$r/ray-2.60.0.dist-info/WHEEL"
python3 -m wheel pack -d "$out" "$r"
dl "$out" aiohttp-cors==0.8.1 annotated-types==0.8.0 cffi==2.1.1 colorful==0.5.8 \
  cryptography==50.0.2 distlib==0.4.4 google-api-core==2.44.0 google-auth==2.63.0 \
  googleapis-common-protos==1.76.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  opencensus==0.11.4 opencensus-context==0.1.3 opentelemetry-api==1.45.2 \
  opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 \
  opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
  platformdirs==4.14.8 proto-plus==1.29.0 py-spy==0.4.3 pyasn1==0.6.5 \
  pyasn1-modules==0.4.2 pycparser==3.12 pydantic==2.14.4 pydantic-core==2.50.5 \
  python-discovery==1.9.6 referencing==0.37.0 rpds-py==2026.9.1 smart-open==9.0.2 \
  typing-inspection==0.4.5 virtualenv==21.15.11
du -sh "$out"
