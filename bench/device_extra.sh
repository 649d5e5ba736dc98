#!/usr/bin/env bash
# One device call (8 hosts, 5 Gbit/s): broadcast and all-to-all tables, the skewed 256 MiB
# all-reduce memory test, socket-buffer settings, then the overlap and throughput benchmarks.
# Everything lands in one tarball in $OUT. Stages: STAGES="tables skew bufsize overlap throughput";
# OVERLAP_ARGS: extra options for the overlap stage (e.g. --compute-ms 100).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
RES=bench/results/device-extra-$(date +%Y%m%d-%H%M%S); mkdir -p "$RES"
export PYTHONPATH=$PWD/python IPROUTE_DIR=$PWD/.tools/iproute PY=python3
cl() { python3 -m mccl.cluster --iproute-dir "$IPROUTE_DIR" "$@"; }
trap 'cl down --id x0 >/dev/null 2>&1; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
cl down --id x0 >/dev/null 2>&1
cl up --id x0 --hosts 8 --rate 5gbit > "$RES/cluster.txt"
cl goodput --id x0 --seconds 5 | tee -a "$RES/cluster.txt"
GP=$(grep -o '[0-9.]* Gbit/s' "$RES/cluster.txt" | head -1 | cut -d' ' -f1)gbit
B="python3 -m mccl.bench"
for st in ${STAGES:-tables skew bufsize overlap throughput}; do
  echo "=== $st $(date +%T)"
  case $st in
    tables) $B --cluster x0 --backends mccl,gloo --goodput $GP --ops broadcast,all_to_all -b 1K -e 256M -f 4 \
              --json $RES/tables.json > $RES/tables.txt 2>&1 ;;
    skew) $B --cluster x0 --backends mccl,gloo --goodput $GP --ops all_reduce --sizes 256M -n 3 --skew-ms 1000 \
              --json $RES/skew.json > $RES/skew.txt 2>&1 ;;
    bufsize) for bs in 0 4194304 16777216; do MCCL_SOCKET_BUFSIZE=$bs $B --cluster x0 --backends mccl --goodput $GP \
              --ops all_reduce,all_gather --sizes 16M,64M,256M --json $RES/buf$bs.json > $RES/buf$bs.txt 2>&1; done ;;
    overlap) $B overlap --cluster x0 --backends mccl,gloo ${OVERLAP_ARGS:-} --json $RES/overlap.json > $RES/overlap.txt 2>&1 ;;
    throughput) $B throughput --cluster x0 --backends mccl,gloo --json $RES/throughput.json > $RES/throughput.txt 2>&1 ;;
  esac
  for f in "$RES"/*.txt; do tail -n 3 "$f"; done
done
