# pdserve — the two Quick-start commands are `make up` and `make test`.
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
FORMAT_FILES = $(shell git ls-files '*.h' '*.cc' '*.cpp' 2>/dev/null)
UP_FLAGS ?=

.PHONY: deps build release test test-asan test-tsan format format-check check-includes \
  thread-safety fuzz fuzz-request fuzz-protocol up up-colocated experiment soak clean

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja $(BUILD)/Makefile $(BUILD)/compile_commands.json:
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

format:
	clang-format -i $(FORMAT_FILES)

format-check:
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "format-check: clean"

# DESIGN.md §2: every #include "module/..." in src/ follows the module table.
check-includes:
	@python3 scripts/check_includes.py src

# clang's -Wthread-safety over every src/ file that can see a capability attribute
# (GUARDED_BY/REQUIRES of common/mutex.h; the others hold nothing to check), 2 at a time, with
# the flags of $(BUILD)/compile_commands.json; syntax only, no objects.
thread-safety: $(BUILD)/compile_commands.json
	@python3 scripts/check_thread_safety.py -b $(BUILD) -j 2

test: build format-check check-includes thread-safety fuzz
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Debug + ASan/UBSan over the whole suite (UBSan is built -fno-sanitize-recover, so a report
# fails its test; halt_on_error says so again for any runtime). Test timeouts are scaled by
# PDSERVE_TEST_TIME_SCALE (tests/CMakeLists.txt); too slow for every CI run on 2 cores.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DPDSERVE_SANITIZE=address
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 1200

test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDSERVE_SANITIZE=thread
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --output-on-failure -j $(JOBS) -L threaded --timeout 1200

# libFuzzer targets (g++ has no libFuzzer: clang++ builds just the code under test), each run
# over its committed seed corpus: request parsing (the parser, its error type, SamplingParams
# and Status) for FUZZ_SECONDS, the messenger's message decoder for PROTOCOL_FUZZ_SECONDS.
FUZZ_SECONDS ?= 20
PROTOCOL_FUZZ_SECONDS ?= 10
FUZZ_CXXFLAGS := -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -Isrc
FUZZ_RUN_FLAGS := -max_len=4096 -timeout=5 -rss_limit_mb=2048 -print_final_stats=1
FUZZ_BIN := $(BUILD)/fuzz/fuzz_request_parser
FUZZ_SOURCES := tests/server/fuzz_request_parser.cc src/server/openai_request.cc \
  src/http/api_error.cc src/engine/sampling_params.cc src/common/status.cc
PROTOCOL_FUZZ_BIN := $(BUILD)/fuzz/fuzz_protocol
PROTOCOL_FUZZ_SOURCES := tests/messenger/fuzz_protocol.cc src/messenger/protocol.cc \
  src/common/byte_codec.cc src/kv/shard_layout.cc src/kv/layout.cc src/common/status.cc \
  src/common/dtype.cc

fuzz: fuzz-request fuzz-protocol

fuzz-request: $(FUZZ_BIN)
	@mkdir -p $(BUILD)/fuzz/corpus
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) $(FUZZ_RUN_FLAGS) \
	  $(BUILD)/fuzz/corpus tests/server/fuzz_corpus

fuzz-protocol: $(PROTOCOL_FUZZ_BIN)
	@mkdir -p $(BUILD)/fuzz/protocol_corpus
	$(PROTOCOL_FUZZ_BIN) -max_total_time=$(PROTOCOL_FUZZ_SECONDS) $(FUZZ_RUN_FLAGS) \
	  $(BUILD)/fuzz/protocol_corpus tests/messenger/fuzz_corpus

$(FUZZ_BIN): $(FUZZ_SOURCES) $(wildcard src/server/*.h src/http/*.h src/engine/sampling_params.h \
                                        src/common/*.h)
	@mkdir -p $(dir $@)
	clang++ $(FUZZ_CXXFLAGS) $(FUZZ_SOURCES) -lfmt -o $@

$(PROTOCOL_FUZZ_BIN): $(PROTOCOL_FUZZ_SOURCES) $(wildcard src/messenger/*.h src/kv/*.h \
                                                          src/common/*.h)
	@mkdir -p $(dir $@)
	clang++ $(FUZZ_CXXFLAGS) $(PROTOCOL_FUZZ_SOURCES) -lfmt -o $@

# Router + 1 prefill + 1 decode node (up's default) on this machine with the embedded tiny
# model (or UP_FLAGS="--model DIR --prefill N --decode M ..."); up-colocated: router +
# colocated nodes (--nodes). Ctrl-C stops everything.
up: build
	$(BUILD)/src/cli/pdserve up $(UP_FLAGS)

up-colocated: build
	$(BUILD)/src/cli/pdserve up --nodes 0 $(UP_FLAGS)

# Colocated versus 1P1D on qwen2.5-0.5b, rate sweeps and plots into docs/experiment/ (about
# 20-30 minutes on 2 cores; EXPERIMENT_SCALE, RATES, ... in scripts/experiment.sh). Run it on
# a quiet machine: anything else running is measured too.
experiment: build
	BUILD=$(BUILD) scripts/experiment.sh

# Reliability soak (not in `make test`): router + 2 nodes under streamed load while node B is
# SIGKILLed and restarted every SOAK_KILL_EVERY seconds, for SOAK_SECONDS (docs/reliability.md).
SOAK_SECONDS ?= 600
SOAK_KILL_EVERY ?= 5
SOAK_CONCURRENCY ?= 8
soak: build
	@test -f $(BUILD)/soak-model/config.json || \
	  $(BUILD)/src/cli/pdserve make-model --preset tiny --out $(BUILD)/soak-model
	$(BUILD)/src/cli/pdserve bench soak --model $(BUILD)/soak-model --seconds $(SOAK_SECONDS) \
	  --kill-every $(SOAK_KILL_EVERY) --concurrency $(SOAK_CONCURRENCY) \
	  --log-dir $(BUILD)/soak-logs

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
