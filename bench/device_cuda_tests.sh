#!/usr/bin/env bash
# One device call on the GPU machine: build the extension against the machine's torch (with CUDA),
# then run the device tests (tests/python/test_devices.py, which skip on machines without a GPU),
# each test in a pytest process of its own under TEST_TIMEOUT seconds (default 90), JOBS (3) at a
# time (the host-stall test alone), every log in $OUT/logs.tgz, failures' tails in $OUT/tests.log;
# one hang costs one test, not the call, and prints every hung rank's stacks. TESTS narrows the selection (a pytest -k expression).
#
#   bash bench/device_cuda_tests.sh                  # every device test
#   TESTS="race or stall" bash bench/device_cuda_tests.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mccl-device-tests}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
{ echo "# $(date -Is) $(nproc) CPUs, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$OUT/env.txt"
t=$(date +%s)
MAX_JOBS=${MAX_JOBS:-16} python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "# build: $(( $(date +%s) - t )) s"
python3 -c "import mccl, torch; print('mccl devices', mccl.DEVICES, 'cuda', torch.cuda.is_available())"
set -f  # test ids hold brackets: no globbing
ids=$(python3 -m pytest -q --collect-only -p no:cacheprovider tests/python/test_devices.py ${TESTS:+-k "$TESTS"} \
      2>/dev/null | grep '::' | grep -v '\-mps\]\|\[mps\]')
# A hung job's ranks print their threads' stacks before they are killed (tests/python/distributed.py):
# Python ones always, native ones through py-spy when it is carried along (.tools/pyspy).
export MCCL_TEST_DEADLINE_CAP_S=$(( ${TEST_TIMEOUT:-90} - 25 ))
spy=$(ls .tools/pyspy/*/scripts/py-spy 2>/dev/null | head -1); [ -n "$spy" ] && export MCCL_PY_SPY=$PWD/$spy
mkdir -p "$OUT/logs"
one() {  # one test in a pytest process of its own; its log and a summary line
  local n=$1 id=$2 s rc
  s=$(date +%s)
  timeout -k 5 "${TEST_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider --tb=short \
    -o timeout="${TEST_TIMEOUT:-90}" "$id" > "$OUT/logs/$n.log" 2>&1
  rc=$?
  echo "## $id: rc=$rc in $(( $(date +%s) - s )) s" > "$OUT/logs/$n.sum"
}
# Timing tests run alone (the host-stall figures); the rest JOBS (3) at a time.
n=0
for id in $ids; do n=$((n + 1)); case $id in *stall*|*block*) one $n "$id"; cat "$OUT/logs/$n.sum";; esac; done
n=0
for id in $ids; do
  n=$((n + 1)); case $id in *stall*|*block*) continue;; esac
  while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-3}" ]; do wait -n; done
  one $n "$id" &
done
wait
set +f
for f in $(ls "$OUT"/logs/*.sum | sort -V); do
  cat "$f" | tee -a "$OUT/tests.log"
  grep -q "rc=0 " "$f" || grep -v "FutureWarning\|return func\|^\s*$" "${f%.sum}.log" | tail -n 150 >> "$OUT/tests.log"
done
# One file back (the device tool returns few): every log in a tarball.
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
