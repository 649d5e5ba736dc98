# MCCL build. `make` builds the C library (no PyTorch needed); `make ctest` builds and runs the C
# tests, each in its own process under a deadline; `make train` / `make test` are the README's two
# commands (they create .venv, install everything and build the PyTorch extension first).
CC      ?= cc
PYTHON  ?= python3
VENV    ?= .venv
BUILD   ?= build
OPT     ?= -O3
SAN     ?=
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wpointer-arith -Wstrict-prototypes -Wno-format-truncation
CFLAGS  += -std=c11 $(OPT) -g -fPIC -fvisibility=hidden $(WARN) -D_GNU_SOURCE \
           -DMCCL_BUILDING_LIBRARY -Iinclude -Icsrc -pthread $(SAN)
LDLIBS  += -pthread -lm

LIB_SRCS  := $(sort $(wildcard csrc/*/*.c))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
TEST_SRCS := $(sort $(wildcard tests/c/test_*.c))
TEST_BINS := $(TEST_SRCS:tests/c/%.c=$(BUILD)/tests/%)
TEST_COMMON := tests/c/harness.c

.PHONY: all lib ctest clean venv install train test
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

$(BUILD)/tests/%: tests/c/%.c $(TEST_COMMON) tests/c/harness.h $(BUILD)/libmccl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c -o $@ $< $(TEST_COMMON) $(BUILD)/libmccl.a $(LDLIBS)

# Each C test binary runs in its own process with a deadline (tests/c/run_tests.sh).
ctest: $(TEST_BINS)
	@echo "C tests (test_failures provokes failures on purpose: its MCCL WARN lines are expected)"
	tests/c/run_tests.sh $(TEST_BINS)

clean:
	rm -rf $(BUILD) *.egg-info python/*.egg-info python/mccl/*.so

# ---- Python side: the README's commands --------------------------------------------------------
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# The extension is rebuilt only when the shim, the library or the packaging changed.
$(VENV)/.mccl-built: $(VENV)/.installed $(BUILD)/libmccl.a $(wildcard torch/*.cpp torch/*.hpp) setup.py pyproject.toml
	@echo "building the PyTorch extension (mccl._C; a minute or two on 2 cores)"
	$(VENV)/bin/pip install -q --no-build-isolation -e .
	touch $@

install: venv lib $(VENV)/.mccl-built

train: install
	$(VENV)/bin/torchrun --standalone --nproc-per-node 4 examples/train.py

test: install ctest
	$(VENV)/bin/python -m pytest -q tests/python
