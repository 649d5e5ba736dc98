#!/usr/bin/env bash
# Is there a C compiler with libFuzzer (-fsanitize=fuzzer) and ASan/UBSan? Says how to get one
# when not (Debian/Ubuntu: apt-get install clang; clang 6 and later ship libFuzzer).
set -u
cc=${1:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz: '$cc' not found; install clang (Debian/Ubuntu: apt-get install -y clang) or set FUZZ_CC" >&2
  exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) { (void)d; (void)n; return 0; }\n' > "$dir/probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$dir/probe.c" -o "$dir/probe" 2> "$dir/err"; then
  echo "fuzz: '$cc' cannot build a libFuzzer target with ASan and UBSan:" >&2
  cat "$dir/err" >&2
  echo "fuzz: install clang with its runtime (Debian/Ubuntu: apt-get install -y clang) or set FUZZ_CC" >&2
  exit 1
fi
