#!/usr/bin/env bash
# The library must never end its host process (include/mccl.h: "Nothing in this library calls
# abort() or exit()"): every failure is a result code. Checks the objects of the given archive for
# references to the functions that do, and the sources for assert() (which calls abort() unless
# NDEBUG is defined; the library uses no assert at all, so the promise holds in every build).
# Not checked: __stack_chk_fail, which a hardened toolchain inserts to stop a process whose stack
# was already smashed, and sanitizer runtimes in sanitizer builds (the __asan_/__ubsan_/__tsan_
# hooks are not these names).
set -euo pipefail
lib=${1:?usage: check_noabort.sh libmccl.a}
root=$(cd "$(dirname "$0")/../.." && pwd)
forbidden='^(abort|exit|_exit|_Exit|quick_exit|__assert_fail|__assert_perror_fail|__assert|err|errx|verr|verrx|__builtin_trap)$'
bad=$(nm -u "$lib" | awk '$1 == "U" { print $2 }' | sed 's/@.*//' | grep -E "$forbidden" | sort -u || true)
asserts=$(grep -rnE '(^|[^_[:alnum:]])assert[[:space:]]*\(' "$root/csrc" "$root/include" || true)
if [ -n "$bad" ] || [ -n "$asserts" ]; then
  [ -n "$bad" ] && echo "check-noabort: $lib references: $(echo $bad)" && \
    for sym in $bad; do nm -A "$lib" 2>/dev/null | awk -v s="$sym" '$NF == s { print "  " $1 }'; done
  [ -n "$asserts" ] && echo "check-noabort: assert() in the library (use a result code):" && echo "$asserts"
  exit 1
fi
echo "check-noabort: $(basename "$lib") references none of abort, exit, _exit, _Exit, quick_exit, assert"
