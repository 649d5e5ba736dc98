# MCCL build. `make` builds the C library (no PyTorch needed); `make ctest` builds and runs the C
# tests, each in its own process under a deadline; `make train` / `make test` are the README's two
# commands (they create .venv, install everything and build the PyTorch extension first).
# `make posix-check` rebuilds the library without _GNU_SOURCE (the portable branches that macOS
# compiles: csrc/core/platform.h) and runs a few C tests against it. `make asan`, `make tsan` and
# `make fuzz-smoke` run the C suite under sanitizers and the fuzzers for a short while
# (docs/FUZZING.md); `make ci` is `make test` plus those four (.ci/run).
CC      ?= cc
PYTHON  ?= python3
VENV    ?= .venv
BUILD   ?= build
OPT     ?= -O3
SAN     ?=
# -Wno-format-truncation only where the compiler knows the warning (GCC; Apple's and older clangs
# would print "unknown warning option" for every file).
NO_FORMAT_TRUNCATION := $(shell $(CC) -Werror -Wformat-truncation -x c -fsyntax-only /dev/null >/dev/null 2>&1 && echo -Wno-format-truncation)
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wpointer-arith -Wstrict-prototypes $(NO_FORMAT_TRUNCATION)
# Feature-test macros: the Linux build (csrc/core/platform.h); posix-check replaces them.
FEATURES ?= -D_GNU_SOURCE
STRICT  ?=
CFLAGS  += -std=c11 $(OPT) -g -fPIC -fvisibility=hidden $(WARN) $(STRICT) $(FEATURES) \
           -DMCCL_BUILDING_LIBRARY -Iinclude -Icsrc -pthread $(SAN)
LDLIBS  += -pthread -lm

LIB_SRCS  := $(sort $(wildcard csrc/*/*.c))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_SRCS := $(sort $(wildcard tests/c/test_*.c))
TEST_BINS := $(TEST_SRCS:tests/c/%.c=$(BUILD)/tests/%)
TEST_COMMON := tests/c/harness.c

.PHONY: all lib ctest check-noabort clean venv install train test posix-check asan tsan fuzz fuzz-smoke fuzz-run fuzz-corpus ci print-build
all: lib
lib: $(BUILD)/libmccl.a $(BUILD)/libmccl.so

$(BUILD)/obj/%.o: %.c $(wildcard include/*.h csrc/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libmccl.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libmccl.so: $(LIB_OBJS)
	$(CC) -shared $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/c/%.c $(TEST_COMMON) tests/c/harness.h tests/c/frames.h $(BUILD)/libmccl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< $(TEST_COMMON) $(BUILD)/libmccl.a $(LDLIBS)

# Each C test binary runs in its own process with a deadline (tests/c/run_tests.sh). CTEST_ENV
# prefixes the run (the sanitizer targets set their options and MCCL_TEST_QUICK there).
# CTEST_SKIP names tests to leave out (tsan: test_reduce, which starts no thread).
CTEST_ENV ?=
CTEST_SKIP ?=
CTEST_BINS = $(filter-out $(CTEST_SKIP:%=$(BUILD)/tests/%),$(TEST_BINS))
# Every test runs with the sender thread (MCCL_SEND_THREAD=1: its default, -1, would leave it off
# for many ranks on few cores, as here) writing every frame (MCCL_SEND_THREAD_LOAD=0: the default
# load rule would leave the writing to the engine thread at these loads), and the collectives,
# failures, mismatches and
# point-to-point tests again with MCCL_SEND_THREAD=0, where the engine thread writes the sockets
# (and with MCCL_RECV_LOWAT on, so that its receive path is run whole as well).
CTEST_INLINE = $(filter $(CTEST_BINS),$(addprefix $(BUILD)/tests/,test_collectives test_failures test_mismatch test_p2p))
# The collectives, failures, mismatch and point-to-point tests run a third time with
# MCCL_ANNOUNCE_RANKS=0: every communicator (their largest has 9 ranks) then checks matches by
# dissemination (algo/algo.h), whose gated frames point-to-point sends must overtake, and
# connects to its peers on first use (MCCL_RUNTIME_CONNECT's default above that many ranks), so
# every failure and mismatch there must reach each rank through the links it has, or a NOTICE.
# That pass also sets MCCL_SEND_THREAD_COPY=0: broadcast chains and all-gather rings then write
# their frames on the engine thread while the sender thread waits (transport/tcp.h), and
# MCCL_SEND_THREAD_LOAD=-1: the writing changes hands between the threads after every collective.
CTEST_AGREE = $(filter $(CTEST_BINS),$(addprefix $(BUILD)/tests/,test_collectives test_failures test_mismatch test_p2p))
ctest: $(CTEST_BINS) check-noabort
	@echo "C tests (test_failures provokes failures on purpose: its MCCL WARN lines are expected)"
	$(CTEST_ENV) MCCL_SEND_THREAD=1 MCCL_SEND_THREAD_LOAD=0 tests/c/run_tests.sh $(CTEST_BINS)
	@echo "C tests again with MCCL_SEND_THREAD=0 (the engine thread sends) and MCCL_RECV_LOWAT=512K"
	$(CTEST_ENV) MCCL_SEND_THREAD=0 MCCL_RECV_LOWAT=524288 MCCL_TEST_QUICK=1 tests/c/run_tests.sh $(CTEST_INLINE)
	@echo "C tests again with MCCL_ANNOUNCE_RANKS=0 (matches checked by dissemination), MCCL_SEND_THREAD_COPY=0, MCCL_SEND_THREAD_LOAD=-1"
	$(CTEST_ENV) MCCL_SEND_THREAD=1 MCCL_SEND_THREAD_COPY=0 MCCL_SEND_THREAD_LOAD=-1 MCCL_ANNOUNCE_RANKS=0 MCCL_TEST_QUICK=1 tests/c/run_tests.sh $(CTEST_AGREE)

# The library never ends the process: no abort(), exit() or assert() (mccl.h promises it).
check-noabort: $(BUILD)/libmccl.a
	tests/c/check_noabort.sh $(BUILD)/libmccl.a

# The library's compiler and flags, for the extension's build record (setup.py writes them into
# mccl/_build_info.py; python -m mccl.info prints them).
print-build:
	@echo "CC=$(CC)"
	@echo "CC_VERSION=$$($(CC) --version 2>/dev/null | head -n 1)"
	@echo "CFLAGS=$(strip $(CFLAGS))"

clean:
	rm -rf $(BUILD) build-posix build-asan build-tsan build-fuzz *.egg-info python/*.egg-info python/mccl/*.so \
	  python/mccl/_build_info.py dist

# ---- strict POSIX build (macOS readiness: csrc/core/platform.h) ---------------------------------
# Every csrc/*/*.c compiled once more as C11 + POSIX.1-2008 only (no _GNU_SOURCE), which selects
# the portable branch of every MCCL_HAVE_* decision, the one macOS compiles; any call that only
# glibc's GNU or BSD extensions declare is then an implicit declaration, and an error here, as is
# a misspelt MCCL_HAVE_* (-Wundef). The C tests below are built the same way and run against that
# library (MCCL_TEST_QUICK=1), so the portable branches are proven to work, not only to compile;
# test_collectives and test_p2p run once with the sender thread and once without. Before that,
# the strict library must not call any of POSIX_LINUX_ONLY (glibc declares some of them even
# without _GNU_SOURCE, so only the symbol table shows that a Linux branch was left unguarded;
# __sched_cpu* are CPU_ALLOC, CPU_COUNT_S and CPU_FREE).
POSIX_BUILD    := build-posix
POSIX_FEATURES := -D_POSIX_C_SOURCE=200809L
POSIX_STRICT   := -Werror=implicit-function-declaration -Werror=implicit-int -Werror=undef
POSIX_TESTS    := test_host test_collectives test_failures test_p2p
POSIX_INLINE   := test_collectives test_p2p
POSIX_LINUX_ONLY := accept4 pipe2 sched_getaffinity __sched_cpualloc __sched_cpucount __sched_cpufree \
                    getrandom syscall pthread_setname_np 'epoll_[a-z_]*' eventfd memrchr strchrnul usleep

posix-check:
	$(MAKE) --no-print-directory BUILD=$(POSIX_BUILD) OPT=-O2 FEATURES='$(POSIX_FEATURES)' \
	  STRICT='$(POSIX_STRICT)' $(POSIX_BUILD)/libmccl.a $(POSIX_TESTS:%=$(POSIX_BUILD)/tests/%)
	@if nm -u $(POSIX_BUILD)/libmccl.a | grep -w $(POSIX_LINUX_ONLY:%=-e %); then \
	  echo "posix-check: the strict library calls the Linux-only functions above (csrc/core/platform.h)"; exit 1; fi
	@echo "posix-check: the strict library calls none of the Linux-only functions"
	@echo "C tests against the strict POSIX library (test_failures' MCCL WARN lines are expected)"
	MCCL_TEST_QUICK=1 MCCL_TEST_NO_BENCH=1 MCCL_SEND_THREAD=1 MCCL_SEND_THREAD_LOAD=-1 tests/c/run_tests.sh $(POSIX_TESTS:%=$(POSIX_BUILD)/tests/%)
	MCCL_TEST_QUICK=1 MCCL_TEST_NO_BENCH=1 MCCL_SEND_THREAD=0 tests/c/run_tests.sh $(POSIX_INLINE:%=$(POSIX_BUILD)/tests/%)

# ---- sanitizers (docs/FUZZING.md) ---------------------------------------------------------------
# The library and every C test rebuilt in a directory of its own, then the whole C suite run; any
# report fails the run (UBSan does not recover, TSan halts on the first race, LeakSanitizer runs
# in every forked rank too: tests/c/harness.c). MCCL_TEST_QUICK=1 shrinks test_collectives' largest
# buffers (every collective, algorithm, dtype and op still runs); under TSan, which is slower, it
# runs 1..6 ranks instead of 1..9. test_reduce skips its throughput printout under ASan and does
# not run under TSan: it never starts a thread, so TSan could only make it slower (the kernels'
# use from several threads is covered by the multi-rank tests).
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS := -fsanitize=thread
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 MCCL_TEST_QUICK=1 MCCL_TEST_NO_BENCH=1
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 MCCL_TEST_QUICK=1 MCCL_TEST_NO_BENCH=1 \
            MCCL_TEST_MAX_RANKS=6
SAN_DEADLINE ?= 900

asan:
	$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 SAN='$(ASAN_FLAGS)' \
	  CTEST_ENV='$(ASAN_ENV) MCCL_TEST_DEADLINE=$(SAN_DEADLINE)' ctest

tsan:
	$(MAKE) --no-print-directory BUILD=build-tsan OPT=-O1 SAN='$(TSAN_FLAGS)' CTEST_SKIP=test_reduce \
	  CTEST_ENV='$(TSAN_ENV) MCCL_TEST_DEADLINE=$(SAN_DEADLINE)' ctest

# ---- fuzzing (docs/FUZZING.md) ------------------------------------------------------------------
# libFuzzer targets for the handshake/frame checks and the receive state machine, built with clang
# (Debian: apt-get install clang) against a library instrumented for coverage, ASan and UBSan.
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_FLAGS   := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_TARGETS := wire rx store
FUZZ_SECONDS ?= 20
FUZZ_JOBS    ?= 1

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h tests/c/loopback.h $(BUILD)/libmccl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -Itests/c -Itests/fuzz -o $@ $< $(BUILD)/libmccl.a $(LDLIBS)

fuzz:
	@tests/fuzz/check_clang.sh $(FUZZ_CC)
	$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT=-O1 \
	  SAN='-fsanitize=fuzzer-no-link $(FUZZ_FLAGS) -Wno-unknown-warning-option' $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz/fuzz_%)

# CI: each target for FUZZ_SECONDS from the checked-in seeds; must find nothing.
fuzz-smoke: fuzz
	tests/fuzz/run_fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) 1 $(FUZZ_TARGETS)

# A long run: make fuzz-run FUZZ_SECONDS=3600 FUZZ_JOBS=4 (new inputs go to build-fuzz/corpus/).
fuzz-run: fuzz
	tests/fuzz/run_fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_TARGETS)

# Rewrite the checked-in seeds from valid messages (tests/fuzz/gen_corpus.c).
fuzz-corpus: $(BUILD)/libmccl.a
	@mkdir -p $(BUILD)/fuzz
	$(CC) $(CFLAGS) -Itests/fuzz -o $(BUILD)/fuzz/gen_corpus tests/fuzz/gen_corpus.c $(BUILD)/libmccl.a $(LDLIBS)
	rm -rf tests/fuzz/corpus && $(BUILD)/fuzz/gen_corpus tests/fuzz/corpus

# ---- Python side: the README's commands --------------------------------------------------------
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# The extension is rebuilt only when the shim, the library or the packaging changed.
$(VENV)/.mccl-built: $(VENV)/.installed $(BUILD)/libmccl.a $(wildcard torch/*.cpp torch/*.hpp torch/*.mm) setup.py pyproject.toml
	@echo "building the PyTorch extension (mccl._C; 2-3 min on 2 cores)"
	$(VENV)/bin/pip install -q --no-build-isolation -e .
	touch $@

install: venv lib $(VENV)/.mccl-built

train: install
	$(VENV)/bin/torchrun --standalone --nproc-per-node 4 examples/train.py

test: install ctest
	$(VENV)/bin/python -m pytest -q --durations=25 tests/python

# What CI runs (.ci/run): the README's test command, then the strict POSIX build and its tests,
# then the C suite under ASan+UBSan and TSan, then a short fuzz run, one after another
# (timing-sensitive tests must not share the CPU with a build); each of those builds compiles
# with CI_JOBS.
CI_JOBS ?= -j2
ci:
	@t=$$(date +%s); $(MAKE) test && echo "ci: make test passed in $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(MAKE) $(CI_JOBS) posix-check && echo "ci: make posix-check passed in $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(MAKE) $(CI_JOBS) asan && echo "ci: make asan passed in $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(MAKE) $(CI_JOBS) tsan && echo "ci: make tsan passed in $$(( $$(date +%s) - t )) s"
	@t=$$(date +%s); $(MAKE) $(CI_JOBS) fuzz-smoke && echo "ci: make fuzz-smoke passed in $$(( $$(date +%s) - t )) s"
