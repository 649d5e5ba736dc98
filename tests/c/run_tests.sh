#!/usr/bin/env bash
# Run each C test binary in its own process under a deadline and print one summary line that CI
# can read ("N passed, N failed"). MCCL_TEST_DEADLINE (seconds, default 600) bounds each binary.
set -u
deadline=${MCCL_TEST_DEADLINE:-600}
passed=0; failed=0; failed_names=()
for bin in "$@"; do
  name=$(basename "$bin")
  start=$(date +%s%N)
  timeout -k 5 "$deadline" "$bin"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 )); secs="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1)); echo "PASS $name (${secs}s)"
  else
    failed=$((failed + 1)); failed_names+=("$name")
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL $name: deadline of ${deadline}s passed"
    else echo "FAIL $name: exit status $rc (${secs}s)"; fi
  fi
done
echo "ctest: $passed passed, $failed failed"
[ $failed -eq 0 ]
