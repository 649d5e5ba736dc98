#!/usr/bin/env bash
# One device call (issue 18): the agreement that runs alongside the early-writing collectives
# (algo/algo.h), to every peer (MCCL_ANNOUNCE_RANKS=1000) against dissemination
# (MCCL_ANNOUNCE_RANKS=0), one mccl.bench invocation each, alternating, ROUNDS times; gloo runs in
# every invocation, so each mccl figure has a gloo figure beside it from the same processes.
#   PART=cluster  : HOSTS (8) emulated hosts at RATE (5gbit), SIZES (4K,64K,1M,16M,64M)
#   PART=loopback : NPROC (64) ranks on this host, SIZES (4K,64K,1M)
# Results go to bench/results/device-agree-<part>-<time>/ and are tarred into $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
PART=${PART:-cluster}
RES=bench/results/device-agree-$PART-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RES"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
OPS=${OPS:-all_reduce,broadcast,all_gather}
case $PART in
  cluster)
    cluster() { python3 -m mccl.cluster --iproute-dir "$PWD/.tools/iproute" "$@"; }
    trap 'cluster down --id ag >/dev/null 2>&1 || true' EXIT
    cluster down --id ag >/dev/null 2>&1 || true
    cluster up --id ag --hosts "${HOSTS:-8}" --rate "${RATE:-5gbit}" | tee "$RES/cluster.txt"
    where=(--cluster ag --goodput measure --goodput-seconds 3)
    sizes=${SIZES:-4K,64K,1M,16M,64M} ;;
  loopback)
    where=(--nproc "${NPROC:-64}")
    sizes=${SIZES:-4K,64K,1M} ;;
  *) echo "PART must be cluster or loopback" >&2; exit 2 ;;
esac
echo "# $(date -Is) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
  | tee "$RES/agree.log"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in 1000 0; do
    name=$([ "$mode" = 0 ] && echo dissemination || echo all-peers)
    echo "## round $round: MCCL_ANNOUNCE_RANKS=$mode ($name)" | tee -a "$RES/agree.log"
    MCCL_ANNOUNCE_RANKS=$mode timeout "${DEADLINE:-240}" python3 -m mccl.bench "${where[@]}" --backends mccl,gloo \
      --ops "$OPS" --sizes "$sizes" -w "${WARMUP:-2}" -n "${ITERS:-8}" --json "$RES/r$round-$name.json" \
      2>&1 | tee -a "$RES/agree.log" || echo "## exit status $?" | tee -a "$RES/agree.log"
  done
done
tar czf "${OUT:-/tmp}/results.tgz" "$RES"
