#!/usr/bin/env bash
# Parameter sweep inside one emulated cluster (needs root): for each "VAR=value ..." line of
# $CONFIGS, run mccl.bench with those MCCL_* settings and keep one table per setting. Used to choose
# segment size, pipeline depth and socket buffers from measurements (bench/NOTES.md).
# Usage: CONFIGS=$'MCCL_SEGMENT_BYTES=262144\nMCCL_SEGMENT_BYTES=1048576' bench/sweep.sh [bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-8}; RATE=${RATE:-5gbit}; ID=${ID:-s0}; PY=${PY:-python3}
OUT=${OUT:-bench/results/sweep-$(date +%Y%m%d-%H%M%S)}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
iproute=(); [ -n "${IPROUTE_DIR:-}" ] && iproute=(--iproute-dir "$IPROUTE_DIR")
cluster() { "$PY" -m mccl.cluster "${iproute[@]}" "$@"; }
trap 'cluster down --id "$ID" >/dev/null || true' EXIT
mkdir -p "$OUT"
cluster down --id "$ID" >/dev/null || true
cluster up --id "$ID" --hosts "$HOSTS" --rate "$RATE" > "$OUT/cluster.txt"
cluster goodput --id "$ID" --seconds 5 | tee -a "$OUT/cluster.txt"
GP=$(grep -o '[0-9.]* Gbit/s' "$OUT/cluster.txt" | head -1 | cut -d' ' -f1)
i=0
while IFS= read -r cfg; do
  [ -z "$cfg" ] && continue
  i=$((i + 1))
  echo "=== $cfg"
  env $cfg "$PY" -m mccl.bench --cluster "$ID" --goodput "${GP}gbit" --json "$OUT/cfg$i.json" "$@" \
    > "$OUT/cfg$i.txt" 2>&1 || echo "failed: see $OUT/cfg$i.txt"
  echo "$cfg" > "$OUT/cfg$i.env"
  grep -E "^│" "$OUT/cfg$i.txt" | awk -F'│' 'NF>12 {print $2, $7, $10}' | head -20
done <<< "${CONFIGS:-MCCL_DEBUG=0}"
