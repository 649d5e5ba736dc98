#!/usr/bin/env bash
# One device call on the GPU machine: build the extension against the machine's torch (with CUDA),
# then run the device tests (tests/python/test_devices.py, which skip on machines without a GPU)
# with their log and a JUnit report in $OUT. TESTS narrows the selection (pytest -k expression).
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
timeout ${TEST_TIMEOUT:-560} python3 -m pytest -v -rs -p no:cacheprovider tests/python/test_devices.py \
  ${TESTS:+-k "$TESTS"} --junitxml "$OUT/junit.xml" 2>&1 | tee "$OUT/tests.log" | grep -E "PASS|FAIL|ERROR|SKIP|passed|failed|Error|assert" | head -80
