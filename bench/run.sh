#!/usr/bin/env bash
# Run the benchmarks and regenerate bench/RESULTS.md (never edit that file by hand).
#
#   bench/run.sh                      # the CPU part: status, holder scan, daemon, metrics,
#                                     # trace, views
#   bench/run.sh daemon               # only the job daemon vs task-spooler (about 6 minutes)
#   bench/run.sh trace                # only the trace replay against other policies (~20 s)
#   bench/run.sh views                # only top's CPU and the web page's latency (~2 minutes)
#   bench/run.sh status holders       # any subset of: status holders daemon metrics trace
#   BENCH_STATUS_ARGS="--runs 5 --cli-runs 3" BENCH_HOLDERS_ARGS="--procs 500" bench/run.sh
#   BENCH_DAEMON_ARGS="--rounds 20 --jobs 50 --queued 2000 --submitters 20" bench/run.sh daemon
#   PYTHON=python3 bench/run.sh mixed # on a GPU machine with torch only: real jobs, ~4 minutes
#   scripts/gpu-bench.sh              # on a GPU machine: real peers (writes peers.json; copy it
#                                     # to bench/results/ and rerun any part to render it)
#
# Each benchmark writes its figures to bench/results/<name>.json; RESULTS.md is always
# rendered from all the files, so a benchmark left out of this run keeps the figures of
# its last run (the Commands block of RESULTS.md says which, and when).
#
# PYTHON selects the interpreter (default: the repository's .venv). The holder benchmark
# needs psmisc (fuser); the daemon benchmark needs task-spooler (Debian: apt-get install
# task-spooler, binary tsp).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
py="${PYTHON:-$repo/.venv/bin/python}"
read -r -a status_args <<< "${BENCH_STATUS_ARGS:-}"
read -r -a holders_args <<< "${BENCH_HOLDERS_ARGS:-}"
read -r -a daemon_args <<< "${BENCH_DAEMON_ARGS:-}"
read -r -a mixed_args <<< "${BENCH_MIXED_ARGS:-}"
read -r -a metrics_args <<< "${BENCH_METRICS_ARGS:-}"
read -r -a trace_args <<< "${BENCH_TRACE_ARGS:-}"
read -r -a peers_args <<< "${BENCH_PEERS_ARGS:-}"
read -r -a views_args <<< "${BENCH_VIEWS_ARGS:-}"

all=(status holders daemon mixed metrics trace peers views)
selected=("$@")
# mixed and peers need a GPU machine: name them there (scripts/gpu-bench.sh runs peers)
[ ${#selected[@]} -eq 0 ] && selected=(status holders daemon metrics trace views)
for name in "${selected[@]}"; do
    case "$name" in
        status|holders|daemon|mixed|metrics|trace|peers|views) ;;
        *) echo "usage: bench/run.sh [status] [holders] [daemon] [mixed] [metrics] [trace] [peers] [views]" >&2
           exit 2 ;;
    esac
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpuwarden-bench.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cd "$repo"
mkdir -p bench/results

# When a result file was written: a file as committed carries its commit's time (a fresh
# clone's files all bear the checkout's), one changed since, its own.
stamp() {
    if git ls-files --error-unmatch "$1" >/dev/null 2>&1 && git diff --quiet HEAD -- "$1"; then
        TZ=UTC git log -1 --format=%cd --date=format-local:'%Y-%m-%d %H:%M UTC' -- "$1"
    else
        date -u -r "$1" '+%Y-%m-%d %H:%M UTC'
    fi
}

commands=(--command "bench/run.sh ${*:-}  # which ran, with ${py#"$repo"/}:")
report_args=()
for name in "${all[@]}"; do
    case "$name" in
        status) cmd=(bench/bench_status.py "${status_args[@]}") ;;
        holders) cmd=(bench/bench_holders.py "${holders_args[@]}") ;;
        daemon) cmd=(bench/bench_daemon.py "${daemon_args[@]}") ;;
        mixed) cmd=(bench/bench_mixed.py "${mixed_args[@]}") ;;
        metrics) cmd=(bench/bench_metrics.py "${metrics_args[@]}") ;;
        trace) cmd=(bench/bench_trace.py "${trace_args[@]}") ;;
        peers) cmd=(bench/bench_peers.py "${peers_args[@]}") ;;
        views) cmd=(bench/bench_views.py "${views_args[@]}") ;;
    esac
    out="bench/results/$name.json"
    if [[ " ${selected[*]} " == *" $name "* ]]; then
        echo "== ${cmd[*]}" >&2
        # Into a temporary file first: a failed run leaves the last good figures alone.
        "$py" "${cmd[@]}" --json "$tmp/$name.json"
        mv "$tmp/$name.json" "$out"
        commands+=(--command "python ${cmd[*]} --json $out")
    elif [ -f "$out" ] && { [ "$name" = mixed ] || [ "$name" = peers ]; }; then
        commands+=(--command "# $out from the GPU machine ($(stamp "$out"); mixed: PYTHON=python3 bench/run.sh mixed, peers: scripts/gpu-bench.sh)")
    elif [ -f "$out" ]; then
        commands+=(--command "# $out kept from an earlier run ($(stamp "$out"))")
    else
        continue
    fi
    report_args+=("--$name" "$out")
done

commands+=(--command "python bench/report.py ${report_args[*]}")
"$py" bench/report.py "${report_args[@]}" "${commands[@]}" -o bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
