#!/usr/bin/env bash
# One device call (issue 18's 64-rank check): build the extension, then bench/every_collective.py
# with each of NPROCS (default "64 128") ranks on this one host over loopback; logs and JSON go
# to bench/results/device-every-<time>/ and are tarred into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
RES=bench/results/device-every-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RES"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
rc=0
for n in ${NPROCS:-64 128}; do
  { echo "# $(date -Is) nproc $n, $(nproc) CPUs, ulimit -n $(ulimit -n)"
    python3 bench/every_collective.py --nproc "$n" --count "${COUNT:-4099}" --deadline "${DEADLINE:-240}" \
      --json "$RES/every-$n.json" 2>&1 | grep -v " ok$"
  } 2>&1 | tee "$RES/every-$n.log"
  grep -q "all exact" "$RES/every-$n.log" || rc=1
done
tar czf "${OUT:-/tmp}/results.tgz" "$RES"
exit $rc
