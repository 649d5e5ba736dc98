#!/usr/bin/env bash
# The cluster benchmark in one command (as root): bring an emulated cluster up, measure goodput,
# run the collectives (mccl and gloo side by side), the overlap and the throughput benchmarks in
# it, keep every table, JSON and plot, and tear the cluster down on every exit path.
#
#   bench/run_cluster_bench.sh                               # 4 hosts at 2 Gbit/s (the 2-core machine)
#   HOSTS=8 RATE=5gbit bench/run_cluster_bench.sh            # the 16-core machine
#   STAGES=collectives bench/run_cluster_bench.sh -e 64M     # one stage; extra args go to it
#
# Environment: HOSTS (4), RATE (2gbit), ID (cluster id, b0), PY (python with torch and mccl;
# default: .venv/bin/python if present, else python3), OUT (results folder, default
# bench/results/<date>-<HOSTS>x<RATE>), STAGES ("collectives overlap throughput"),
# OVERLAP_ARGS / THROUGHPUT_ARGS (extra options for those stages), IPROUTE_DIR (bundled ip/tc,
# see bench/bundle_iproute.sh; found in .tools/iproute by itself).
set -euo pipefail
cd "$(dirname "$0")/.."

HOSTS=${HOSTS:-4}
RATE=${RATE:-2gbit}
ID=${ID:-b0}
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OUT:-bench/results/$(date +%Y%m%d-%H%M)-${HOSTS}x${RATE}}
STAGES=${STAGES:-collectives overlap throughput}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
iproute=()
[ -n "${IPROUTE_DIR:-}" ] && iproute=(--iproute-dir "$IPROUTE_DIR")

if [ "$(id -u)" != 0 ]; then
  echo "run_cluster_bench.sh: needs root (network namespaces, veth links, tc qdiscs)" >&2
  exit 2
fi

cluster() { "$PY" -m mccl.cluster "${iproute[@]}" "$@"; }
cleanup() { cluster down --id "$ID" || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

mkdir -p "$OUT"
cluster down --id "$ID" >/dev/null   # whatever a crashed earlier run left
cluster up --id "$ID" --hosts "$HOSTS" --rate "$RATE" | tee "$OUT/cluster.txt"
cluster goodput --id "$ID" --seconds 10 | tee -a "$OUT/cluster.txt"
{ echo "# $(date -Is) $(uname -srm), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
  env | grep -E '^MCCL_' || true; } >> "$OUT/cluster.txt"

for stage in $STAGES; do
  case $stage in
    collectives)
      "$PY" -m mccl.bench --cluster "$ID" --backends mccl,gloo --goodput measure \
        --json "$OUT/collectives.json" --plot "$OUT/collectives.png" "$@" 2>&1 | tee "$OUT/collectives.txt" ;;
    overlap)
      # shellcheck disable=SC2086
      "$PY" -m mccl.bench overlap --cluster "$ID" --backends mccl,gloo ${OVERLAP_ARGS:-} \
        --json "$OUT/overlap.json" --plot "$OUT/overlap.png" 2>&1 | tee "$OUT/overlap.txt" ;;
    throughput)
      # shellcheck disable=SC2086
      "$PY" -m mccl.bench throughput --cluster "$ID" --backends mccl,gloo ${THROUGHPUT_ARGS:-} \
        --json "$OUT/throughput.json" --plot "$OUT/throughput.png" 2>&1 | tee "$OUT/throughput.txt" ;;
    *) echo "run_cluster_bench.sh: unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
echo "results in $OUT"
