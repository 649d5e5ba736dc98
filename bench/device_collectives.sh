#!/usr/bin/env bash
# One device call: build the extension, then the cluster collectives benchmark (8 hosts, 5 Gbit/s
# by default) with results tarred into $OUT (the device tool's return folder). Usage on the
# device: bash bench/device_collectives.sh [mccl.bench args...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
RES=bench/results/device-$(date +%Y%m%d-%H%M%S)
HOSTS=${HOSTS:-8} RATE=${RATE:-5gbit} PY=python3 OUT=$RES STAGES=${STAGES:-collectives} \
  IPROUTE_DIR=$PWD/.tools/iproute bash bench/run_cluster_bench.sh "$@"
tar czf "${OUT:-/tmp}/results.tgz" "$RES"
