#!/usr/bin/env bash
# One device call on the GPU machine: build the extension against the machine's torch (with CUDA),
# then run the device tests (tests/python/test_devices.py, which skip on machines without a GPU),
# each test in a pytest process of its own under TEST_TIMEOUT seconds (default 90), so that a
# failure's traceback is printed (and lands in $OUT/tests.log) as soon as that test ends, and one
# hang costs one test, not the call. TESTS narrows the selection (a pytest -k expression).
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
for id in $ids; do
  s=$(date +%s)
  timeout -k 5 "${TEST_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider --tb=short -o timeout="${TEST_TIMEOUT:-90}" "$id" \
    > "$OUT/one.log" 2>&1
  rc=$?
  echo "## $id: rc=$rc in $(( $(date +%s) - s )) s" | tee -a "$OUT/tests.log"
  [ $rc -eq 0 ] || grep -v "FutureWarning\|return func\|^\s*$" "$OUT/one.log" | tail -n 60 | tee -a "$OUT/tests.log"
done
rm -f "$OUT/one.log"
