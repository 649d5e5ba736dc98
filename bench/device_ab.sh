#!/usr/bin/env bash
# One device call: the same mccl benchmark on two builds of the library, interleaved in one
# emulated cluster (8 hosts, 5 Gbit/s by default), to measure what a change costs or gains.
#   bash bench/device_ab.sh OLD.tgz [mccl.bench args...]
# OLD.tgz holds the `csrc` and `include` folders of the other build (for example
# `git archive <commit> csrc include | gzip > old.tgz`). ROUNDS (2) alternations of new, old.
# Results land in one tarball in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OLD_TGZ=$1; shift
OLDTREE=/tmp/mccl-old
rm -rf "$OLDTREE" && mkdir -p "$OLDTREE"
tar --exclude=.git --exclude=build -cf - . | tar -xf - -C "$OLDTREE"
rm -rf "$OLDTREE/csrc" "$OLDTREE/include" && tar -xzf "$OLD_TGZ" -C "$OLDTREE"
( python3 setup.py -q build_ext --inplace > /tmp/build-new.log 2>&1 || { tail -20 /tmp/build-new.log; exit 1; } ) &
( cd "$OLDTREE" && python3 setup.py -q build_ext --inplace > /tmp/build-old.log 2>&1 || { tail -20 /tmp/build-old.log; exit 1; } ) &
wait
RES=bench/results/device-ab-$(date +%Y%m%d-%H%M%S); mkdir -p "$RES"
cl() { PYTHONPATH=$PWD/python python3 -m mccl.cluster --iproute-dir "$PWD/.tools/iproute" "$@"; }
trap 'cl down --id ab >/dev/null 2>&1; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
cl down --id ab >/dev/null 2>&1
cl up --id ab --hosts "${HOSTS:-8}" --rate "${RATE:-5gbit}" > "$RES/cluster.txt"
cl goodput --id ab --seconds 5 | tee -a "$RES/cluster.txt"
GP=$(grep -o '[0-9.]* Gbit/s' "$RES/cluster.txt" | head -1 | cut -d' ' -f1)gbit
for i in $(seq "${ROUNDS:-2}"); do
  for v in new old; do
    tree=$PWD; [ $v = old ] && tree=$OLDTREE
    echo "=== $v round $i $(date +%T)"
    PYTHONPATH=$tree/python python3 -m mccl.bench --cluster ab --backends mccl --goodput "$GP" \
      --json "$RES/$v-$i.json" "$@" > "$RES/$v-$i.txt" 2>&1
    grep -E "^│ +[0-9]+ │ +[0-9]+ │" "$RES/$v-$i.txt" | awk -F'│' '{printf "%s %s %s |", $2, $7, $10} END {print ""}'
  done
done
