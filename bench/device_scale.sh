#!/usr/bin/env bash
# One device call (issue 18's scale check): build the extension, then NPROC ranks (64 by
# default) on this one host over loopback, every collective checked exactly at SIZES, mccl and
# gloo alternating; the header's "# group init" line gives each backend's group init time (the
# slowest rank's) and the descriptors it added per rank (/proc/self/fd). Results go to
# bench/results/device-scale-<time>/ and are tarred into $OUT. Usage on the device:
#   NPROC=64 SIZES=4K,1M bash bench/device_scale.sh [more mccl.bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
RES=bench/results/device-scale-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RES"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
N=${NPROC:-64}
{ echo "# $(date -Is) nproc $N, $(nproc) CPUs, ulimit -n $(ulimit -n)"
  python3 -m mccl.bench --nproc "$N" --backends mccl,gloo --sizes "${SIZES:-4K,1M}" -w 1 -n "${ITERS:-3}" \
    --deadline "${DEADLINE:-480}" --json "$RES/scale.json" "$@"
} 2>&1 | tee "$RES/scale.log"
tar czf "${OUT:-/tmp}/results.tgz" "$RES"
