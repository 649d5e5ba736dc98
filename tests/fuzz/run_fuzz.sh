#!/usr/bin/env bash
# Run each fuzz target for a while, from the checked-in seeds (tests/fuzz/corpus/<target>) plus
# whatever earlier runs found (<build>/corpus/<target>, where new inputs go; the checked-in seeds
# are never written). A crash, a leak, a sanitizer report, an input slower than 10 s, or more
# than 2 GiB of memory fails the run; the input is saved under <build>/artifacts/ and the command
# to reproduce it is printed.
#
# Usage: run_fuzz.sh <build dir> <seconds per target> <jobs> <target>...
# FUZZ_SEED (default 1) fixes libFuzzer's seed so CI runs are repeatable; FUZZ_SEED=0 draws one.
set -u
build=${1:?build dir}; seconds=${2:?seconds}; jobs=${3:?jobs}; shift 3
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$build" && pwd)
cd "$build" # libFuzzer's -jobs writes fuzz-<n>.log files into the working directory
seed=${FUZZ_SEED:-1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export MCCL_DEBUG=${MCCL_DEBUG:-NONE} # the library's WARN lines for rejected frames are expected
status=0
for t in "$@"; do
  bin="$build/fuzz/fuzz_$t"
  corpus="$build/corpus/$t"
  art="$build/artifacts/$t/"
  mkdir -p "$corpus" "$art"
  case $t in
    wire) max_len=128 ;;
    *) max_len=4096 ;;
  esac
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len"
        -artifact_prefix="$art" -print_final_stats=1 -seed="$seed")
  if [ "$jobs" -gt 1 ]; then args+=(-jobs="$jobs" -workers="$jobs"); fi
  echo "fuzz_$t: ${seconds}s, seeds $root/tests/fuzz/corpus/$t, new inputs $corpus"
  start=$(date +%s)
  log="$build/fuzz_$t.log"
  "$bin" "${args[@]}" "$corpus" "$root/tests/fuzz/corpus/$t" > "$log" 2>&1
  rc=$?
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)|Done [0-9]+ runs' "$log" | sed "s/^/  fuzz_$t: /"
  if [ $rc -ne 0 ]; then
    status=1
    echo "FAIL fuzz_$t (exit $rc after $(( $(date +%s) - start ))s); the end of its log ($log):"
    tail -60 "$log"
    for f in "$art"*; do [ -f "$f" ] && echo "reproduce: $bin $f"; done
  else
    echo "PASS fuzz_$t ($(( $(date +%s) - start ))s, $(ls "$corpus" | wc -l) inputs in $corpus)"
  fi
done
exit $status
