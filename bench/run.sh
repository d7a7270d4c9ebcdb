#!/usr/bin/env bash
# Run every benchmark and regenerate bench/RESULTS.md (never edit that file by hand).
#
#   bench/run.sh                      # the full run: 8x200 status, 2x5,000-process scan
#   BENCH_STATUS_ARGS="--runs 5 --cli-runs 3" BENCH_HOLDERS_ARGS="--procs 500" bench/run.sh
#
# PYTHON selects the interpreter (default: the repository's .venv). Needs psmisc (fuser).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
py="${PYTHON:-$repo/.venv/bin/python}"
read -r -a status_args <<< "${BENCH_STATUS_ARGS:-}"
read -r -a holders_args <<< "${BENCH_HOLDERS_ARGS:-}"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpuwarden-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$repo"

status_cmd=(bench/bench_status.py "${status_args[@]}")
holders_cmd=(bench/bench_holders.py "${holders_args[@]}")

echo "== ${status_cmd[*]}" >&2
"$py" "${status_cmd[@]}" --json "$tmp/status.json"
echo "== ${holders_cmd[*]}" >&2
"$py" "${holders_cmd[@]}" --json "$tmp/holders.json"

"$py" bench/report.py --status "$tmp/status.json" --holders "$tmp/holders.json" \
    --command "bench/run.sh   # which ran, with ${py#"$repo"/}:" \
    --command "python ${status_cmd[*]} --json status.json" \
    --command "python ${holders_cmd[*]} --json holders.json" \
    --command "python bench/report.py --status status.json --holders holders.json" \
    -o bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
